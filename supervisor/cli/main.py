"""`supervisor ...`: the command group, the runtime's commands, and the apps' commands.

Exit codes are in ``supervisor.exit_codes``. Apps add commands through the
``actor_supervisor.apps`` entry-point group (see ``supervisor.apps``): a user's
package adds its own the same way the bundled price tracker does. An app's command
runs only where the app is in use (``require_in_use``); elsewhere it says so in one line.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import sys
from pathlib import Path
from typing import Any

import click
import psycopg
from dramatiq.errors import BrokerConnectionError

from .. import apps, db, exit_codes
from .context import config_given, config_option, connect, die, load_config, obj

# Each runtime command: (module in this package, attribute). A command's module is
# imported only when that command runs (or help lists it): `supervisor worker`
# loads no admin, HTTP or control code and no app's commands (memory: every module
# a worker imports stays resident in each worker process).
RUNTIME_COMMANDS = {
    "migrate": ("database", "migrate"), "check": ("database", "check"),
    "run": ("control_cmds", "run"), "reload": ("control_cmds", "reload"), "scale": ("control_cmds", "scale"),
    "status": ("control_cmds", "status"), "stop": ("control_cmds", "stop"),
    "worker": ("worker_cmd", "worker"), "http": ("http_cmd", "http"),
    "enqueue": ("jobs", "enqueue"), "jobs": ("jobs", "jobs"), "runs": ("jobs", "runs"),
    "history": ("jobs", "history"), "queues": ("queues", "queues"), "nodes": ("nodes", "nodes"),
    "errors": ("errors_cmd", "errors"), "config": ("config_cmd", "config"),
    "limits": ("limits_cmd", "limits_group"), "schedules": ("schedules_cmd", "schedules"),
    "workflows": ("workflows_cmd", "workflows"),
}


class OneLineErrors(click.Group):
    """Whatever a command did not turn into a one-line error becomes one here,
    with a meaningful exit code: never a traceback (SUPERVISOR_DEBUG=1 shows it)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except BrokenPipeError:
            # The reader went away (`supervisor jobs list | head`): stop quietly, as any
            # Unix tool does; stdout to /dev/null so the interpreter's final flush is quiet too.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(exit_codes.OK)
        except Exception as exc:
            if os.environ.get("SUPERVISOR_DEBUG"):
                raise
            first = (str(exc).strip().splitlines() or [""])[0]
            if isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.UndefinedFunction):
                # a database no `supervisor run` or `migrate` has prepared (or an older release's)
                die(f"the database is not migrated ({first}): run `supervisor migrate`"
                    " (`supervisor run` migrates on start)", exit_codes.DATABASE)
            if isinstance(exc, psycopg.DataError | psycopg.errors.ProgrammingError | ValueError | OverflowError):
                die(f"a value was refused ({type(exc).__name__}): {first}", exit_codes.USAGE)
            if isinstance(exc, psycopg.OperationalError | BrokerConnectionError | db.DatabaseError):
                die(f"database unavailable: {first}", exit_codes.DATABASE)
            die(f"{type(exc).__name__}: {first} (SUPERVISOR_DEBUG=1 shows the traceback)", exit_codes.PROBLEM)


def _config_path(ctx: click.Context) -> Path | None:
    """The config this invocation reads (-c, $SUPERVISOR_CONFIG, config/supervisor.yaml),
    None when there is none."""
    from ..config import find_path  # the YAML readers: only commands that read a config

    path = find_path(obj(ctx).get("config"))
    return path if config_given(ctx) or path.exists() else None


def require_in_use(ctx: click.Context, app: apps.App) -> None:
    """End the command with one line unless ``app`` is in use: with a config, when the
    config uses it; without one, when the database holds its tables."""
    path = _config_path(ctx)
    if path is not None:
        if app.name in {a.name for a in apps.used_by(load_config(ctx))}:
            return
        die(f"app {app.name} is not in use: no role of {path} runs its actors "
            f"({', '.join(p + '.*' for p in app.packages)}) and its apps: section does not name it", exit_codes.USAGE)
    from ..migrate import migrated_apps

    with connect(ctx) as conn:
        if migrated_apps(conn, [app]):
            return
    die(f"app {app.name} is not in use: no config names it and the database has not its tables "
        f"(`supervisor migrate --app {app.name}` creates them)", exit_codes.USAGE)


def _guarded(command: click.Command, app: apps.App) -> None:
    """Make every leaf of ``command`` check that ``app`` is in use before it runs: after
    its own options are parsed (a -c given to it counts), before it does anything."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _guarded(sub, app)
        return
    callback = command.callback
    if callback is None:
        return

    @functools.wraps(callback)
    def checked(*args: Any, **kwargs: Any) -> Any:
        require_in_use(click.get_current_context(), app)
        return callback(*args, **kwargs)

    command.callback = checked


class LazyCommands(OneLineErrors):
    """The runtime's commands by name (``RUNTIME_COMMANDS``), imported when asked
    for; the apps' commands (``actor_supervisor.apps``) loaded only for a name that
    is not the runtime's, or to list them."""

    _app_commands: dict[str, tuple[apps.App, click.Command]] | None = None

    def apps_commands(self) -> dict[str, tuple[apps.App, click.Command]]:
        if self._app_commands is None:
            found: dict[str, tuple[apps.App, click.Command]] = {}
            for app in apps.installed():
                if app.commands is not None:
                    for command in app.commands():
                        if command.name is not None:
                            if command.name not in app.standalone_commands:
                                _guarded(command, app)
                            found[command.name] = (app, command)
            self._app_commands = found
        return self._app_commands

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every app's commands without a config (only the database could tell, and help
        never connects); with one, those of the apps it uses, and standalone ones."""
        from ..config import ConfigError, load

        path = _config_path(ctx)
        used: set[str] | None = None
        if path is not None:
            with contextlib.suppress(ConfigError):  # the command run will say what is wrong with it
                used = {a.name for a in apps.used_by(load(path))}
        shown = [name for name, (app, _) in self.apps_commands().items()
                 if used is None or app.name in used or name in app.standalone_commands]
        return sorted({*RUNTIME_COMMANDS, *self.commands, *shown})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        if cmd_name in RUNTIME_COMMANDS:
            module, attr = RUNTIME_COMMANDS[cmd_name]
            command: click.Command = getattr(importlib.import_module(f"{__package__}.{module}"), attr)
            return command
        found = self.apps_commands().get(cmd_name)
        return found[1] if found is not None else None


@click.group(cls=LazyCommands, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--database-url",
    envvar="DATABASE_URL",
    default=None,
    help="PostgreSQL URL (default: the config's database.url when -c is given, else $DATABASE_URL, "
    "else the embedded server in the state directory).",
)
@config_option
@click.pass_context
def main(ctx: click.Context, database_url: str | None) -> None:
    """Run Dramatiq actors on PostgreSQL under a forking supervisor."""
    o = obj(ctx)
    o["database_url"] = database_url
    o["database_url_from_cmdline"] = (
        ctx.get_parameter_source("database_url") == click.core.ParameterSource.COMMANDLINE
    )


if __name__ == "__main__":
    main()
