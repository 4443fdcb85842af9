"""Apps: packages of actors that bring their own tables, config sections, CLI commands and
dashboard pages.

An app declares itself with an entry point in the ``actor_supervisor.apps``
group whose object is an ``App``::

    [project.entry-points."actor_supervisor.apps"]
    myapp = "myapp.supervisor_app:APP"

The runtime never imports an app by name: it finds apps through this group.
An app is in use where the config uses it (a role lists one of its actor
modules, or the config's ``apps:`` names it): only then are its migrations
applied, and only there do its pages, alerts, gauges and commands appear. Where
no config says (`supervisor http` standalone, a command run without a config),
the database does: the app is in use when every migration of it is applied
(``supervisor.migrate.migrated_apps``).

Every hook an app may give is a ``Protocol`` below, and its docstring is the one
description of it: when the runtime calls it, in which process, with what, and what
becomes of an error. What the hooks hand back (``Gauge``, ``Page``, ``Table``) is
defined here too. Adding a hook: a ``Protocol`` here, a field of ``App``, and the one
place that calls it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # for the hooks' signatures only: a worker imports this module, cheaply
    import click
    import psycopg
    from psycopg_pool import ConnectionPool
    from starlette.routing import Route

    from .config.reader import Item, Reader

log = logging.getLogger(__name__)

GROUP = "actor_supervisor.apps"


# --- what the hooks hand back ------------------------------------------------------------


@dataclass(frozen=True)
class Gauge:
    """One gauge family an app reports on /metrics, read at each scrape."""

    name: str  # the full metric name
    doc: str
    labels: tuple[str, ...]
    samples: tuple[tuple[tuple[str, ...], float], ...]


@dataclass(frozen=True)
class Table:
    """A table the dashboard renders like its own."""

    title: str
    columns: Sequence[str]
    rows: Sequence[Sequence[Any]]
    note: str | None = None  # shown under the title (e.g. what the numbers mean)


@dataclass(frozen=True)
class Page:
    """An app's dashboard page, linked from the header, served at ``/apps/<slug>``.

    Each callable gets a connection of the HTTP child's pool (autocommit, a statement
    timeout) at each request and must be quick. ``tables`` is the page. ``limits`` adds
    tables to the Limits page (e.g. circuit breakers) and ``alerts`` one-line alerts to
    the Overview: one of those that raises becomes one line saying so, and the runtime's
    page still renders."""

    slug: str
    title: str  # the navigation label
    tables: Callable[[psycopg.Connection], Sequence[Table]]
    limits: Callable[[psycopg.Connection], Sequence[Table]] | None = None
    alerts: Callable[[psycopg.Connection], Sequence[str]] | None = field(default=None)


# --- the hooks ---------------------------------------------------------------------------
# An app's code runs in the runtime's processes: each hook says which, and what the runtime
# does when it raises. Hooks are plain functions; import what they need inside them, so
# that loading the app (every process does) stays cheap.


class SectionParser(Protocol):
    def __call__(self, reader: Reader, item: Item, /) -> Mapping[str, Any]:
        """``App.sections[name]``: validate the config's top-level section ``name`` and
        return its value.

        Called wherever a config file is parsed (the master at start and at each reload,
        ``supervisor check``, a command given ``-c``), never in a worker: a worker reads
        the value its master parsed as ``supervisor.runtime.section(name)``, so it must be
        plain data. Validate with the runtime's ``Section`` and checkers
        (``supervisor.config.reader``); raise ``reader.error(item, message)``, or a
        ``ValueError`` (placed at ``item``), and the file is refused with its file, line and
        key. A reload that changes the value rolls every worker."""
        ...


class Commands(Protocol):
    def __call__(self) -> Iterable[click.Command]:
        """``App.commands``: the app's click commands, added to ``supervisor ...``.

        Called by the CLI only for a command name that is not the runtime's, or to list
        the commands. Each command (every leaf of a group) first checks that the app is in
        use, and refuses in one line where it is not, unless its name is in
        ``App.standalone_commands``."""
        ...


class WorkerStart(Protocol):
    def __call__(self, pool: ConnectionPool, /) -> None:
        """``App.on_worker_start``: app work at a worker's start, e.g. syncing declared
        config into tables.

        Called in every worker process that runs the app's actors (forked by
        ``supervisor run``, or ``supervisor worker``), once the database answers and the
        process is registered, before it claims; again in each new process after a
        reload (a changed app section rolls every worker). ``pool`` is the broker's own
        (two connections): hold one briefly. An error is logged and the worker starts
        anyway."""
        ...


class Pages(Protocol):
    def __call__(self) -> Iterable[Page]:
        """``App.pages``: the app's dashboard pages (see ``Page``).

        Called by the HTTP child at each dashboard request, only where the app is in use;
        never imported elsewhere."""
        ...


class Gauges(Protocol):
    def __call__(self, conn: psycopg.Connection, /) -> Iterable[Gauge]:
        """``App.gauges``: the app's gauges for /metrics (e.g. breaker states).

        Called by the HTTP child at each scrape, only where the app is in use, with a
        connection of its pool (autocommit, a statement timeout). An error is logged and
        the app reports no gauges for that scrape; the runtime's are reported."""
        ...


class State(Protocol):
    def __call__(self, conn: psycopg.Connection, /) -> Mapping[str, Any]:
        """``App.state``: the app's section of ``GET /api/v1/system/state`` (under
        ``app_state.<name>``), JSON values.

        Called by the HTTP child at each such request, only where the app is in use, with
        a connection of its pool. An error becomes ``{"error": "..."}`` in its place; the
        rest of the state stands."""
        ...


class Routes(Protocol):
    def __call__(self) -> Iterable[Route]:
        """``App.routes``: the app's own routes, mounted under ``/api/v1``.

        Called once by the HTTP child, when it builds its Starlette app, for every
        installed app. A route answers only where its app is in use (elsewhere 404, one
        line); a plain (not async) endpoint runs in a thread. An action (not GET) passes
        the runtime's guard: the token's role against its rule in
        ``supervisor.http.roles`` (with none, an admin), and a row in the audit log."""
        ...


@dataclass(frozen=True)
class App:
    """An app: its name, what belongs to it, and its hooks (each optional, each a
    ``Protocol`` above that says when it is called)."""

    name: str
    # Actor modules under these packages belong to the app.
    packages: tuple[str, ...]
    # A folder of NNN_name.sql files; versions are unique across every owner.
    migrations: Path | None = None
    # The top-level config sections the app owns, by name.
    sections: Mapping[str, SectionParser] = field(default_factory=dict)
    # Per section, the dataclass whose fields declare its keys (supervisor.config.keys),
    # for `supervisor config keys` and docs/config-keys.md.
    section_keys: Callable[[], Mapping[str, type]] | None = None
    commands: Commands | None = None
    on_worker_start: WorkerStart | None = None
    pages: Pages | None = None
    gauges: Gauges | None = None
    state: State | None = None
    routes: Routes | None = None
    # Commands that bring their own database and config (a demo): they run, and are
    # listed, whether or not the app is in use where they are called. Every other
    # command of the app refuses, in one line, where the app is not in use.
    standalone_commands: tuple[str, ...] = ()

    def owns(self, module: str) -> bool:
        return any(module == p or module.startswith(p + ".") for p in self.packages)


class AppError(RuntimeError):
    pass


@cache
def installed() -> tuple[App, ...]:
    """Every app registered in the entry-point group, in name order."""
    apps: list[App] = []
    for ep in sorted(metadata.entry_points(group=GROUP), key=lambda e: e.name):
        try:
            app = ep.load()
        except Exception as exc:  # a broken app must not take the runtime down
            log.error("cannot load app %s (%s): %s", ep.name, ep.value, exc)
            continue
        if not isinstance(app, App):
            log.error("entry point %s (%s) is not a supervisor.apps.App", ep.name, ep.value)
            continue
        apps.append(app)
    return tuple(apps)


def by_name(name: str) -> App:
    for app in installed():
        if app.name == name:
            return app
    known = ", ".join(a.name for a in installed()) or "none"
    raise AppError(f"no app named {name!r} is installed (installed: {known})")


class UsesApps(Protocol):
    """What of a config says which apps it uses (``supervisor.config.Config``)."""

    @property
    def apps(self) -> tuple[str, ...]: ...

    def actor_modules(self) -> list[str]: ...


def used_by(config: UsesApps) -> tuple[App, ...]:
    """The apps a config uses: its roles' actor modules, plus those its ``apps:`` names."""
    return in_use(config.actor_modules(), config.apps)


def in_use(actor_modules: Iterable[str], explicit: Iterable[str] = ()) -> tuple[App, ...]:
    """The apps a set of actor modules (plus an explicit list) needs."""
    modules = list(actor_modules)
    names = set(explicit)
    for n in names:
        by_name(n)  # raises for an unknown app
    return tuple(a for a in installed() if a.name in names or any(a.owns(m) for m in modules))
