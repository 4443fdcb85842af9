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
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

GROUP = "actor_supervisor.apps"


@dataclass(frozen=True)
class Gauge:
    """One gauge family an app reports on /metrics, read at each scrape."""

    name: str  # the full metric name
    doc: str
    labels: tuple[str, ...]
    samples: tuple[tuple[tuple[str, ...], float], ...]


@dataclass(frozen=True)
class App:
    name: str
    # Actor modules under these packages belong to the app.
    packages: tuple[str, ...]
    # A folder of NNN_name.sql files; versions are unique across every owner.
    migrations: Path | None = None
    # Top-level config sections the app owns: name -> parser(reader, item) -> value.
    # The parser validates with the runtime's Section and checkers (file, line, key).
    sections: Mapping[str, Callable[[Any, Any], Any]] = field(default_factory=dict)
    # Returns, per section, the dataclass whose fields declare its keys
    # (supervisor.config.keys), for `supervisor config keys` and docs/config-keys.md.
    section_keys: Callable[[], Mapping[str, type]] | None = None
    # Returns the app's click commands, added to `supervisor ...` (imported only when needed).
    commands: Callable[[], Iterable[Any]] | None = None
    # Called in every worker process that runs the app's actors, once the database
    # answers, with the process's connection pool: at `supervisor run` and after
    # every reload (a changed app section rolls every worker). For app work at
    # start, e.g. syncing declared config into tables. Errors are logged, not fatal.
    on_worker_start: Callable[[Any], None] | None = None
    # Returns the app's dashboard pages (supervisor.http.dashboard.extension.Page), imported
    # only by the HTTP child when it serves the dashboard.
    pages: Callable[[], Iterable[Any]] | None = None
    # The app's gauges for /metrics (e.g. breaker states), read with the HTTP child's
    # connection at each scrape, only where the app is in use.
    gauges: Callable[[Any], Iterable[Gauge]] | None = None
    # The app's section of GET /api/v1/system/state (under ``app_state.<name>``), read
    # with the HTTP child's connection, only where the app is in use.
    state: Callable[[Any], Mapping[str, Any]] | None = None
    # The app's own routes under /api/v1 (Starlette routes, imported only by the HTTP
    # child). They answer only where the app is in use (elsewhere: 404, one line);
    # actions pass the same token check as the runtime's.
    routes: Callable[[], Iterable[Any]] | None = None
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
