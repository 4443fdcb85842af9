"""`supervisor ...`: the command group, the runtime's commands, and the apps' commands.

Exit codes are in ``supervisor.exit_codes``. Apps add commands through the
``actor_supervisor.apps`` entry-point group (see ``supervisor.apps``): a user's
package adds its own the same way the bundled price tracker does.
"""

from __future__ import annotations

import importlib
import os

import click
import psycopg
from dramatiq.errors import BrokerConnectionError

from .. import apps, db, exit_codes
from .context import config_option, die, obj

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
    "history": ("jobs", "history"), "queues": ("queues", "queues"),
}


class OneLineErrors(click.Group):
    """Whatever a command did not turn into a one-line error becomes one here,
    with a meaningful exit code: never a traceback (SUPERVISOR_DEBUG=1 shows it)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            if os.environ.get("SUPERVISOR_DEBUG"):
                raise
            first = (str(exc).strip().splitlines() or [""])[0]
            if isinstance(exc, psycopg.DataError | psycopg.errors.ProgrammingError | ValueError | OverflowError):
                die(f"a value was refused ({type(exc).__name__}): {first}", exit_codes.USAGE)
            if isinstance(exc, psycopg.OperationalError | BrokerConnectionError | db.DatabaseError):
                die(f"database unavailable: {first}", exit_codes.DATABASE)
            die(f"{type(exc).__name__}: {first} (SUPERVISOR_DEBUG=1 shows the traceback)", exit_codes.PROBLEM)


class LazyCommands(OneLineErrors):
    """The runtime's commands by name (``RUNTIME_COMMANDS``), imported when asked
    for; the apps' commands (``actor_supervisor.apps``) loaded only for a name that
    is not the runtime's, or to list them all."""

    _app_commands: dict[str, click.Command] | None = None

    def apps_commands(self) -> dict[str, click.Command]:
        if self._app_commands is None:
            found: dict[str, click.Command] = {}
            for app in apps.installed():
                if app.commands is not None:
                    for command in app.commands():
                        if command.name is not None:
                            found[command.name] = command
            self._app_commands = found
        return self._app_commands

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*RUNTIME_COMMANDS, *self.commands, *self.apps_commands()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        if cmd_name in RUNTIME_COMMANDS:
            module, attr = RUNTIME_COMMANDS[cmd_name]
            command: click.Command = getattr(importlib.import_module(f"{__package__}.{module}"), attr)
            return command
        return self.apps_commands().get(cmd_name)


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
