"""The price tracker as an app of the supervisor (the `actor_supervisor.apps` entry point).

Importing this module is cheap: it imports no actor and no CLI code; those load
only when a worker imports an actor module or the CLI asks for the commands.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from supervisor.apps import App, Gauge, Page
from supervisor.migrate import sql_dir

if TYPE_CHECKING:
    import click
    import psycopg
    from psycopg_pool import ConnectionPool
    from starlette.routing import Route

    from supervisor.config.reader import Item, Reader

# Each hook imports its module when called (the hooks are documented in supervisor.apps).


def _parse_pipeline(reader: Reader, item: Item) -> Mapping[str, Any]:
    # The config schema pulls in the YAML reader and the catalog: only a process
    # that reads a config needs them, not every worker that looks up its apps.
    from .config import parse_pipeline

    return parse_pipeline(reader, item)


def _section_keys() -> dict[str, type]:
    from .config import Pipeline

    return {"pipeline": Pipeline}


def _commands() -> list[click.Command]:
    from .cli import commands

    return commands()


def _on_worker_start(pool: ConnectionPool) -> None:
    from .boot import on_worker_start

    on_worker_start(pool)


def _gauges(conn: psycopg.Connection) -> Iterable[Gauge]:
    from .metrics import gauges

    return gauges(conn)


def _state(conn: psycopg.Connection) -> Mapping[str, Any]:
    from .tracker import system_state

    return system_state(conn)


def _routes() -> list[Route]:
    from .api import routes

    return routes()


def _pages() -> list[Page]:
    from .dashboard import pages

    return pages()


APP = App(
    name="actors",
    packages=("actors",),
    migrations=sql_dir("actors"),
    sections={"pipeline": _parse_pipeline},
    section_keys=_section_keys,
    commands=_commands,
    on_worker_start=_on_worker_start,
    pages=_pages,
    gauges=_gauges,
    state=_state,
    routes=_routes,
    standalone_commands=("demo",),  # the demo brings its own database and config
)
