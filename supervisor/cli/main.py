"""`supervisor ...`: the command group, the runtime's commands, and the apps' commands.

Exit codes are in ``supervisor.exit_codes``. Apps add commands through the
``actor_supervisor.apps`` entry-point group (see ``supervisor.apps``): a user's
package adds its own the same way the bundled price tracker does.
"""

from __future__ import annotations

import click

from .. import apps
from . import control_cmds, database, http_cmd, jobs, worker_cmd
from .context import config_option, obj


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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
    jobs.enqueue, jobs.jobs, jobs.runs, jobs.queues,
):
    main.add_command(command)

for app in apps.installed():
    if app.commands is not None:
        for command in app.commands():
            main.add_command(command)


if __name__ == "__main__":
    main()
