"""`supervisor worker`: one worker process in the foreground."""

from __future__ import annotations

import sys

import click

from .. import apps, db, defaults, exit_codes
from ..config import Retention
from ..logs import configure_logging
from ..migrate import migrate
from .context import Seconds, config_given, config_option, database, die, load_config


@click.command()
@config_option
@click.option("--queues", "-q", required=True, help="Comma-separated queue names to consume.")
@click.option("--actors", "-a", required=True, help="Comma-separated actor modules to import.")
@click.option("--threads", "-t", default=defaults.THREADS, show_default=True, type=click.IntRange(min=1))
@click.option("--prefetch", default=None, type=click.IntRange(min=1),
              help=f"Rows held claimed at most (default: paced: --threads rows, plus as many as"
                   f" would wait under {defaults.PREFETCH_WAIT_SECONDS * 1000:g} ms for a thread,"
                   f" up to {defaults.PREFETCH_PER_THREAD}x threads).")
@click.option("--role", default="worker", show_default=True, help="Role name recorded in the workers table.")
@click.option("--shutdown-timeout", default=defaults.SHUTDOWN_TIMEOUT, show_default=True, type=Seconds(min=0),
              help="Seconds to let running jobs finish on SIGTERM.")
@click.option("--lease", default=defaults.LEASE_SECONDS, show_default=True, type=Seconds(min=1),
              help="Lease seconds; renewed by the heartbeat.")
@click.option("--heartbeat", default=defaults.HEARTBEAT_SECONDS, show_default=True, type=Seconds(min=0.1),
              help="Heartbeat interval seconds (keep well under --lease).")
@click.option("--poll-interval", default=defaults.POLL_INTERVAL, show_default=True, type=Seconds(min=0.01),
              help="Longest wait between claims when no wake-up (NOTIFY) comes.")
@click.option("--no-migrate", is_flag=True, help="Do not apply pending migrations at start.")
@click.option("--log-level", default="INFO", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Log JSON lines (one object per event, as log_json does).")
@click.option("--job-log/--no-job-log", default=True, show_default=True,
              help="One log line per finished job (a log record each: it shows only on jobs that do nothing).")
@click.pass_context
def worker(ctx: click.Context, queues: str, actors: str, threads: int, prefetch: int | None, role: str, shutdown_timeout: float,
           lease: float, heartbeat: float, poll_interval: float, no_migrate: bool, log_level: str, as_json: bool, job_log: bool) -> None:
    """Run one worker process until SIGTERM, then drain and exit 0."""
    from ..worker.process import run
    from ..worker.settings import WorkerSettings

    if heartbeat >= lease:
        die(f"--heartbeat ({heartbeat}s) must be shorter than --lease ({lease}s)", exit_codes.USAGE)
    configure_logging(log_level.upper(), as_json)
    chosen = database(ctx)
    modules = tuple(a.strip() for a in actors.split(",") if a.strip())
    if not no_migrate:
        try:
            migrate(chosen.url, apps.in_use(modules))
        except db.DatabaseError as exc:
            die(str(exc), exit_codes.DATABASE)
    settings = WorkerSettings(
        queues=tuple(q.strip() for q in queues.split(",") if q.strip()),
        actors=modules,
        role=role,
        threads=threads,
        prefetch=max(prefetch, threads) if prefetch else None,
        lease_seconds=lease,
        heartbeat_seconds=heartbeat,
        shutdown_timeout=shutdown_timeout,
        poll_interval=poll_interval,
        job_log=job_log,
        # a config file given (-c or $SUPERVISOR_CONFIG) lends its retention (what the upkeep
        # prunes) and its roles' default priorities (of jobs this process sends)
        retention=load_config(ctx).retention if config_given(ctx) else Retention(),
        queue_priorities=load_config(ctx).queue_priorities() if config_given(ctx) else {},
    )
    sys.exit(run(settings, chosen))


