"""`supervisor ...`: the command group, the runtime's commands, and the apps' commands.

Exit codes are in ``supervisor.exit_codes``. Apps add commands through the
``actor_supervisor.apps`` entry-point group (see ``supervisor.apps``): a user's
package adds its own the same way the bundled price tracker does.
"""

from __future__ import annotations

import os

import click
import psycopg
from dramatiq.errors import BrokerConnectionError

from .. import apps, db, exit_codes
from . import control_cmds, database, http_cmd, jobs, queues, worker_cmd
from .context import config_option, die, obj


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


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
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


for command in (
    database.migrate, database.check,
    control_cmds.run, control_cmds.reload, control_cmds.scale, control_cmds.status, control_cmds.stop,
    worker_cmd.worker, http_cmd.http,
    jobs.enqueue, jobs.jobs, jobs.runs, jobs.history, queues.queues,
):
    main.add_command(command)

for app in apps.installed():
    if app.commands is not None:
        for command in app.commands():
            main.add_command(command)


if __name__ == "__main__":
    main()
