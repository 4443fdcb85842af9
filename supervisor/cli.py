"""`supervisor ...` commands. Thin: parse, call, print; exit codes mean something.

Exit codes: 0 ok, 1 something is wrong (check failed, job not found), 2 bad usage
or input, 3 actor modules cannot be imported, 4 database unreachable.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from typing import Any

import click

from . import db

EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_DB = 4


def _die(message: str, code: int = EXIT_PROBLEM) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _url(ctx: click.Context) -> str:
    """The database URL for this invocation (option/env, else embedded)."""
    try:
        return db.resolve_url(ctx.obj.get("database_url"))
    except Exception as exc:  # embedded server failed to start, for instance
        _die(f"cannot start or find the database: {exc}", EXIT_DB)
        raise


def _connect(ctx: click.Context):
    try:
        return db.connect(_url(ctx))
    except db.DatabaseError as exc:
        _die(str(exc), EXIT_DB)
        raise


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, default=_json_default, indent=2))


def _table(rows: list[dict], columns: list[str]) -> None:
    if not rows:
        click.echo("(none)")
        return
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    click.echo("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in cells:
        click.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value).replace("\n", " ")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--database-url",
    envvar="DATABASE_URL",
    default=None,
    help="PostgreSQL URL (default: $DATABASE_URL, else the embedded server in the state directory).",
)
@click.pass_context
def main(ctx: click.Context, database_url: str | None) -> None:
    """Run Dramatiq actors on PostgreSQL under a forking supervisor."""
    ctx.ensure_object(dict)
    ctx.obj["database_url"] = database_url


# --- database ---------------------------------------------------------------


@main.command()
@click.pass_context
def migrate(ctx: click.Context) -> None:
    """Apply pending sql/NNN_*.sql migrations (safe to run from many hosts at once)."""
    url = _url(ctx)
    try:
        applied = db.migrate(url, progress=lambda line: click.echo(line, err=True))
    except db.DatabaseError as exc:
        _die(str(exc), EXIT_DB)
    click.echo(f"{len(applied)} migration(s) applied" if applied else "database is up to date")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def check(ctx: click.Context, as_json: bool) -> None:
    """Check that the database is reachable and the schema is current."""
    url = _url(ctx)
    report: dict[str, Any] = {"database": db.redact(url), "reachable": False, "pending": [], "changed": []}
    ok = True
    try:
        with db.connect(url) as conn:
            report["reachable"] = True
            report["server_version"] = conn.info.server_version
            report["pending"] = [m.name for m in db.pending_migrations(conn)]
            report["changed"] = [m.name for m in db.changed_migrations(conn)]
    except db.DatabaseError as exc:
        report["error"] = str(exc)
    ok = report["reachable"] and not report["pending"] and not report["changed"]
    report["ok"] = ok
    if as_json:
        _print_json(report)
    else:
        click.echo(f"database: {report['database']}")
        if not report["reachable"]:
            click.echo(f"  unreachable: {report.get('error')}")
        else:
            click.echo("  reachable")
            for name in report["pending"]:
                click.echo(f"  pending migration: {name}  (run `supervisor migrate`)")
            for name in report["changed"]:
                click.echo(f"  migration changed since it was applied: {name}")
        click.echo("ok" if ok else "NOT OK")
    sys.exit(0 if ok else (EXIT_DB if not report["reachable"] else EXIT_PROBLEM))


# --- the standalone worker ----------------------------------------------------


@main.command()
@click.option("--queues", "-q", required=True, help="Comma-separated queue names to consume.")
@click.option("--actors", "-a", required=True, help="Comma-separated actor modules to import.")
@click.option("--threads", "-t", default=8, show_default=True, type=click.IntRange(min=1))
@click.option("--role", default="worker", show_default=True, help="Role name recorded in the workers table.")
@click.option("--shutdown-timeout", default=30.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds to let running jobs finish on SIGTERM.")
@click.option("--lease", default=30.0, show_default=True, type=click.FloatRange(min=1),
              help="Lease seconds; renewed by the heartbeat.")
@click.option("--heartbeat", default=10.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Heartbeat interval seconds (keep well under --lease).")
@click.option("--no-migrate", is_flag=True, help="Do not apply pending migrations at start.")
@click.option("--log-level", default="INFO", show_default=True)
@click.pass_context
def worker(ctx: click.Context, queues: str, actors: str, threads: int, role: str, shutdown_timeout: float,
           lease: float, heartbeat: float, no_migrate: bool, log_level: str) -> None:
    """Run one worker process until SIGTERM, then drain and exit 0."""
    from .process import WorkerSettings, configure_logging, run

    if heartbeat >= lease:
        _die(f"--heartbeat ({heartbeat}s) must be shorter than --lease ({lease}s)", EXIT_USAGE)
    configure_logging(log_level.upper())
    url = _url(ctx)
    if not no_migrate:
        try:
            db.migrate(url)
        except db.DatabaseError as exc:
            _die(str(exc), EXIT_DB)
    settings = WorkerSettings(
        queues=tuple(q.strip() for q in queues.split(",") if q.strip()),
        actors=tuple(a.strip() for a in actors.split(",") if a.strip()),
        role=role,
        threads=threads,
        lease_seconds=lease,
        heartbeat_seconds=heartbeat,
        shutdown_timeout=shutdown_timeout,
    )
    sys.exit(run(settings, url))


# --- jobs -----------------------------------------------------------------------


@main.command()
@click.argument("actor")
@click.option("--queue", "-q", default="default", show_default=True)
@click.option("--args", "args_json", default="[]", help="JSON list of positional arguments.")
@click.option("--kwargs", "kwargs_json", default="{}", help="JSON object of keyword arguments.")
@click.option("--delay", type=click.FloatRange(min=0), default=0, help="Seconds before it may run.")
@click.option("--priority", type=int, default=0, help="Higher runs first.")
@click.option("--dedupe-key", default=None)
@click.option("--concurrency-key", default=None)
@click.option("--max-retries", type=click.IntRange(min=0), default=None)
@click.pass_context
def enqueue(ctx, actor, queue, args_json, kwargs_json, delay, priority, dedupe_key, concurrency_key,
            max_retries) -> None:
    """Enqueue one job for ACTOR (its module need not be importable here)."""
    from dramatiq.message import Message

    from .broker import PostgresBroker

    try:
        args = json.loads(args_json)
        kwargs = json.loads(kwargs_json)
    except json.JSONDecodeError as exc:
        _die(f"--args/--kwargs must be JSON: {exc}", EXIT_USAGE)
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        _die("--args must be a JSON list and --kwargs a JSON object", EXIT_USAGE)
    options: dict[str, Any] = {"priority": priority}
    if dedupe_key:
        options["dedupe_key"] = dedupe_key
    if concurrency_key:
        options["concurrency_key"] = concurrency_key
    if max_retries is not None:
        options["max_attempts"] = max_retries + 1
    broker = PostgresBroker(_url(ctx), pool_size=1)
    try:
        message = Message(queue_name=queue, actor_name=actor, args=tuple(args), kwargs=kwargs, options=options)
        sent = broker.enqueue(message, delay=int(delay * 1000))
    finally:
        broker.close()
    click.echo(sent.message_id)


@main.group()
def jobs() -> None:
    """List, inspect, retry and cancel jobs."""


@jobs.command("list")
@click.option("--status", type=click.Choice(["pending", "running", "retryable", "succeeded", "failed", "cancelled"]))
@click.option("--queue", "-q", default=None)
@click.option("--limit", default=50, show_default=True, type=click.IntRange(min=1))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def jobs_list(ctx, status, queue, limit, as_json) -> None:
    """Most recent jobs first."""
    from . import admin

    with _connect(ctx) as conn:
        rows = admin.list_jobs(conn, status=status, queue=queue, limit=limit)
    if as_json:
        _print_json(rows)
    else:
        _table(rows, ["id", "queue", "actor", "status", "attempts", "run_at", "last_error"])


@jobs.command("show")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def jobs_show(ctx, job_id, as_json) -> None:
    """One job with its history of state changes."""
    from . import admin

    with _connect(ctx) as conn:
        try:
            job = admin.show_job(conn, job_id)
        except Exception as exc:
            _die(f"bad job id {job_id!r}: {exc}", EXIT_USAGE)
    if job is None:
        _die(f"no job {job_id}")
    if as_json:
        _print_json(job)
        return
    events = job.pop("events")
    for key, value in job.items():
        click.echo(f"{key:>17}: {_fmt(value) if key != 'last_error' else value}")
    click.echo("events:")
    for e in events:
        click.echo(f"  {_fmt(e['at'])}  {e['from_status'] or '-'} -> {e['to_status']}  by {e['who']}: {e['reason']}")


@jobs.command("retry")
@click.argument("job_id")
@click.pass_context
def jobs_retry(ctx, job_id) -> None:
    """Put a failed or cancelled job back to pending."""
    from . import admin

    with _connect(ctx) as conn:
        if not admin.retry_job(conn, job_id):
            _die(f"job {job_id} is not failed or cancelled (or does not exist)")
    click.echo(f"{job_id} -> pending")


@jobs.command("cancel")
@click.argument("job_id")
@click.pass_context
def jobs_cancel(ctx, job_id) -> None:
    """Cancel a pending or retryable job."""
    from . import admin

    with _connect(ctx) as conn:
        if not admin.cancel_job(conn, job_id):
            _die(f"job {job_id} is not pending or retryable (or does not exist)")
    click.echo(f"{job_id} -> cancelled")


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def queues(ctx, as_json) -> None:
    """Per-queue counts: ready, scheduled, running, failed, done in the last hour."""
    from . import admin

    with _connect(ctx) as conn:
        rows = admin.queue_stats(conn)
    if as_json:
        _print_json(rows)
    else:
        _table(rows, ["queue", "ready", "scheduled", "retryable", "running", "failed", "succeeded_last_hour"])


if __name__ == "__main__":
    main()
