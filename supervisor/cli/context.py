"""What every command needs: the config, the database URL, a connection, a broker,
and a one-line error with a meaningful exit code. Public: app commands use it too."""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click
import psycopg

from .. import apps, db, exit_codes
from ..apps import App
from ..identity import set_node_name

if TYPE_CHECKING:
    from ..broker import PostgresBroker
    from ..config import Config

F = TypeVar("F", bound=Callable[..., Any])


class Seconds(click.FloatRange):
    """A FloatRange that also refuses NaN and infinities (FloatRange lets NaN through)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return rv


def die(message: str, code: int = exit_codes.PROBLEM) -> NoReturn:
    """Print one line (``error: ...``) and exit: never a traceback. A message that
    quotes a library's text (libpq's spans lines) is joined onto the one line."""
    click.echo(f"error: {' '.join(db.redact(message).split())}", err=True)
    sys.exit(code)


def _store_config(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        ctx.ensure_object(dict)["config"] = value
    return value


def config_option(f: F) -> F:
    """-c/--config on every command (and on the group), the last one given wins. Eager,
    so `-c FILE --help` lists the commands of the apps that FILE uses."""
    return click.option(
        "-c", "--config", "config_file", default=None, expose_value=False, callback=_store_config,
        type=click.Path(dir_okay=False), is_eager=True,
        help="Config file (default: $SUPERVISOR_CONFIG, else config/supervisor.yaml).",
    )(f)


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")(f)


def obj(ctx: click.Context) -> dict[str, Any]:
    return ctx.ensure_object(dict)


def config_given(ctx: click.Context) -> bool:
    return bool(obj(ctx).get("config") or os.environ.get("SUPERVISOR_CONFIG"))


def load_config(ctx: click.Context) -> Config:
    """The config file, validated; a bad one ends the command with exit code 2."""
    from ..config import ConfigError, find_path, load  # the YAML readers: only commands that read a config

    o = obj(ctx)
    if "loaded_config" not in o:
        try:
            cfg = load(find_path(o.get("config")))
        except ConfigError as exc:
            hint = "" if exc.line else " (pass -c FILE or set SUPERVISOR_CONFIG)"
            if o.get("config_error_hint"):
                hint += f"\n{o['config_error_hint']}"
            die(f"{exc}{hint}", exit_codes.USAGE)
        if cfg.supervisor.state_dir is not None:
            os.environ["SUPERVISOR_STATE_DIR"] = str(cfg.supervisor.state_dir)
        o["loaded_config"] = cfg
    loaded: Config = o["loaded_config"]
    return loaded


def url(ctx: click.Context) -> str:
    """The database URL for this invocation: --database-url, else the config's
    database.url when a config is given, else DATABASE_URL, else embedded."""
    try:
        return resolved_url(ctx)
    except Exception as exc:  # embedded server failed to start, for instance
        die(f"cannot start or find the database: {exc}", exit_codes.DATABASE)


def resolved_url(ctx: click.Context) -> str:
    """``url``, raising what went wrong instead of ending the command (for a command
    that can do without the database)."""
    o = obj(ctx)
    chosen = o.get("database_url")
    pooled = False
    if not o.get("database_url_from_cmdline") and config_given(ctx):
        chosen = load_config(ctx).database.url
        pooled = bool(load_config(ctx).database.pooled)
    resolved = db.resolve_url(chosen)
    if pooled:
        db.mark_pooled(resolved)
    return resolved


def database(ctx: click.Context) -> db.Database:
    """The database of a long-running command (a worker, the HTTP server): like
    ``url``, plus where to LISTEN and whether the URL is pooled (detected unless
    the config says)."""
    chosen = url(ctx)
    listen_url, pooled = None, None
    o = obj(ctx)
    if not o.get("database_url_from_cmdline") and config_given(ctx):
        d = load_config(ctx).database
        listen_url, pooled = d.listen_url, d.pooled
        set_node_name(load_config(ctx).supervisor.node_name)
    try:
        return db.resolve(chosen, listen_url=listen_url, pooled=pooled)
    except Exception as exc:
        die(f"cannot reach the database: {db.redact(str(exc))}", exit_codes.DATABASE)


def connect(ctx: click.Context) -> psycopg.Connection:
    try:
        return db.connect(url(ctx))
    except db.DatabaseError as exc:
        die(str(exc), exit_codes.DATABASE)


@contextlib.contextmanager
def producer(ctx: click.Context) -> Iterator[PostgresBroker]:
    """A short-lived broker for enqueueing from a command (one connection, closed after)."""
    from ..broker import PostgresBroker

    # A config given lends its roles' default priorities (a job sent without one gets its queue's).
    priorities = load_config(ctx).queue_priorities() if config_given(ctx) else {}
    broker = PostgresBroker(url(ctx), pool_size=1, queue_priorities=priorities)
    try:
        yield broker
    finally:
        broker.close()


def apps_in_use(ctx: click.Context, names: tuple[str, ...] = ()) -> tuple[App, ...]:
    """The apps whose migrations this invocation needs: those the config uses
    (when there is a config), plus any named with --app."""
    from ..config import find_path  # the YAML readers: only commands that read a config

    modules: list[str] = []
    explicit: list[str] = list(names)
    if config_given(ctx) or find_path(obj(ctx).get("config")).exists():
        cfg = load_config(ctx)
        modules, explicit = cfg.actor_modules(), explicit + list(cfg.apps)
    try:
        return apps.in_use(modules, explicit)
    except apps.AppError as exc:
        die(str(exc), exit_codes.USAGE)
