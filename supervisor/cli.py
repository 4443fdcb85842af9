"""`supervisor ...` commands. Thin: parse, call, print; exit codes mean something.

Exit codes: 0 ok, 1 something is wrong (check failed, job not found), 2 bad usage
or input, 3 actor modules cannot be imported, 4 database unreachable.
"""

from __future__ import annotations

import json
import os
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


def _store_config(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        ctx.ensure_object(dict)["config"] = value
    return value


def config_option(f):
    """-c/--config on every command (and on the group), the last one given wins."""
    return click.option(
        "-c", "--config", "config_file", default=None, expose_value=False, callback=_store_config,
        type=click.Path(dir_okay=False),
        help="Config file (default: $SUPERVISOR_CONFIG, else config/supervisor.yaml).",
    )(f)


def _config_given(ctx: click.Context) -> bool:
    return bool(ctx.obj.get("config") or os.environ.get("SUPERVISOR_CONFIG"))


def _load_config(ctx: click.Context):
    """The config file, validated; a bad one ends the command with exit code 2."""
    from . import config

    if "loaded_config" not in ctx.obj:
        try:
            cfg = config.load(config.find_path(ctx.obj.get("config")))
        except config.ConfigError as exc:
            hint = "" if exc.line else " (pass -c FILE or set SUPERVISOR_CONFIG)"
            if ctx.obj.get("config_error_hint"):
                hint += f"\n{ctx.obj['config_error_hint']}"
            _die(f"{exc}{hint}", EXIT_USAGE)
        if cfg.supervisor.state_dir is not None:
            os.environ["SUPERVISOR_STATE_DIR"] = str(cfg.supervisor.state_dir)
        ctx.obj["loaded_config"] = cfg
    return ctx.obj["loaded_config"]


def _url(ctx: click.Context) -> str:
    """The database URL for this invocation: --database-url, else the config's
    database.url when a config is given, else DATABASE_URL, else embedded."""
    url = ctx.obj.get("database_url")
    if not ctx.obj.get("database_url_from_cmdline") and _config_given(ctx):
        url = _load_config(ctx).database.url
    try:
        return db.resolve_url(url)
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
    help="PostgreSQL URL (default: the config's database.url when -c is given, else $DATABASE_URL, "
    "else the embedded server in the state directory).",
)
@config_option
@click.pass_context
def main(ctx: click.Context, database_url: str | None) -> None:
    """Run Dramatiq actors on PostgreSQL under a forking supervisor."""
    ctx.ensure_object(dict)
    ctx.obj["database_url"] = database_url
    ctx.obj["database_url_from_cmdline"] = (
        ctx.get_parameter_source("database_url") == click.core.ParameterSource.COMMANDLINE
    )


# --- database ---------------------------------------------------------------


@main.command()
@config_option
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
@config_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def check(ctx: click.Context, as_json: bool) -> None:
    """Validate the config (without starting anything), then check that the
    database is reachable and the schema is current."""
    from . import config

    report: dict[str, Any] = {}
    path = config.find_path(ctx.obj.get("config"))
    if _config_given(ctx) or path.exists():
        report["config"] = {"file": str(path), "ok": False}
        try:
            cfg = config.load(path)
        except config.ConfigError as exc:
            report["config"].update(error=str(exc), detail=exc.as_dict())
            report["ok"] = False
            if as_json:
                _print_json(report)
            else:
                click.echo(f"config: {path}\n  {exc}\nNOT OK")
            sys.exit(EXIT_USAGE)
        report["config"].update(ok=True, roles={r.name: r.processes for r in cfg.roles},
                                control_socket=str(cfg.supervisor.control_socket))
    url = _url(ctx)
    report.update({"database": db.redact(url), "reachable": False, "pending": [], "changed": []})
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
        if "config" in report:
            roles = ", ".join(f"{n} x{p}" for n, p in report["config"]["roles"].items())
            click.echo(f"config: {report['config']['file']}\n  valid: {roles}")
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


# --- the supervisor ---------------------------------------------------------------


def _control(ctx: click.Context, message: dict[str, Any], timeout: float) -> dict[str, Any]:
    from . import config, control

    path = config.find_path(ctx.obj.get("config"))
    try:
        socket_path = config.load(path).supervisor.control_socket
    except config.ConfigError:
        # Still reach the master if we can tell where it listens: it gives the precise error.
        try:
            socket_path = config.control_socket_of(path)
        except config.ConfigError:
            _load_config(ctx)  # prints the full error and exits 2
            raise
    try:
        return control.request(socket_path, message, timeout=timeout)
    except control.ControlError as exc:
        _die(str(exc), EXIT_PROBLEM)
        raise


def _report_change(reply: dict[str, Any], as_json: bool, what: str) -> None:
    if as_json:
        _print_json(reply)
    if not reply.get("ok"):
        if not as_json:
            click.echo(f"error: {what} failed: {reply.get('error')}", err=True)
            if reply.get("detail"):
                click.echo("the supervisor keeps running its previous config", err=True)
        sys.exit(EXIT_USAGE if reply.get("detail") else EXIT_PROBLEM)
    if not as_json:
        click.echo(f"{what} done in {reply.get('seconds', 0):.2f}s:")
        for line in reply.get("changes", []):
            click.echo(f"  {line}")
    for warning in reply.get("warnings", []):
        click.echo(f"warning: {warning}", err=True)


@main.command()
@config_option
@click.pass_context
def run(ctx: click.Context) -> None:
    """Run the supervisor: fork each role's worker processes and keep them running
    (SIGHUP reloads, SIGTERM drains and exits)."""
    import dataclasses

    from . import arbiter
    from .config import DatabaseConfig

    cfg = _load_config(ctx)
    if ctx.obj.get("database_url_from_cmdline"):
        cfg = dataclasses.replace(cfg, database=DatabaseConfig(ctx.obj["database_url"]))
    sys.exit(arbiter.serve(cfg))


@main.command()
@config_option
@click.option("--timeout", default=600.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds to wait for the new state.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def reload(ctx: click.Context, timeout: float, as_json: bool) -> None:
    """Re-read the config and apply it; wait until the new state is reached.
    An invalid file changes nothing (exit 2, the error names file, line and key)."""
    ctx.obj["config_error_hint"] = "nothing was changed: the supervisor keeps running its previous config"
    _report_change(_control(ctx, {"cmd": "reload"}, timeout), as_json, "reload")


@main.command()
@config_option
@click.argument("role")
@click.argument("processes", type=click.IntRange(min=0, max=1000))
@click.option("--timeout", default=600.0, show_default=True, type=click.FloatRange(min=0.1))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def scale(ctx: click.Context, role: str, processes: int, timeout: float, as_json: bool) -> None:
    """Run PROCESSES processes of ROLE (until the next reload); wait until they are."""
    _report_change(_control(ctx, {"cmd": "scale", "role": role, "processes": processes}, timeout), as_json, "scale")


@main.command()
@config_option
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Roles and processes of the running supervisor: pid, state, uptime, RSS, CPU, jobs."""
    from .status_view import render

    reply = _control(ctx, {"cmd": "status"}, 10.0)
    if not reply.get("ok"):
        _die(str(reply.get("error")))
    if as_json:
        _print_json(reply)
    else:
        click.echo(render(reply))


@main.command()
@config_option
@click.option("--timeout", default=600.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds to wait for the master to exit.")
@click.option("--no-wait", is_flag=True, help="Return once the master has started stopping.")
@click.pass_context
def stop(ctx: click.Context, timeout: float, no_wait: bool) -> None:
    """Drain every role and stop the supervisor."""
    from .control import wait_gone

    reply = _control(ctx, {"cmd": "stop"}, 10.0)
    if not reply.get("ok"):
        _die(str(reply.get("error")))
    if no_wait:
        click.echo(f"stopping (master pid {reply['pid']})")
        return
    if not wait_gone(int(reply["pid"]), timeout):
        _die(f"master pid {reply['pid']} is still running after {timeout:g}s")
    click.echo(f"stopped (master pid {reply['pid']})")


# --- the standalone worker ----------------------------------------------------


@main.command()
@config_option
@click.option("--queues", "-q", required=True, help="Comma-separated queue names to consume.")
@click.option("--actors", "-a", required=True, help="Comma-separated actor modules to import.")
@click.option("--threads", "-t", default=8, show_default=True, type=click.IntRange(min=1))
@click.option("--prefetch", default=None, type=click.IntRange(min=1),
              help="Rows held claimed at most (default: --threads; 2x threads suits many short jobs).")
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
def worker(ctx: click.Context, queues: str, actors: str, threads: int, prefetch: int | None, role: str, shutdown_timeout: float,
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
        prefetch=max(prefetch, threads) if prefetch else None,
        lease_seconds=lease,
        heartbeat_seconds=heartbeat,
        shutdown_timeout=shutdown_timeout,
    )
    sys.exit(run(settings, url))


# --- jobs -----------------------------------------------------------------------


@main.command()
@config_option
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
@config_option
def jobs() -> None:
    """List, inspect, retry and cancel jobs."""


@jobs.command("list")
@config_option
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
@config_option
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
@config_option
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
@config_option
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
@config_option
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def runs(ctx, as_json) -> None:
    """The latest run of every schedule (job_runs): when, where, outcome."""
    from psycopg.rows import dict_row

    from .queries import scheduler as scheduler_sql

    with _connect(ctx) as conn, conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(scheduler_sql.LATEST_RUNS).fetchall()
    if as_json:
        _print_json(rows)
    else:
        _table(rows, ["job_name", "scheduled_for", "status", "holder", "started_at", "completed_at", "error_text"])


@main.group()
def alerts() -> None:
    """Operator actions on price alerts."""


@alerts.command("resend")
@config_option
@click.argument("alert_id", type=int)
@click.pass_context
def alerts_resend(ctx, alert_id) -> None:
    """Deliver ALERT_ID again even if an earlier attempt's outcome is unknown
    (at-least-once: the receiver may see it twice; the Idempotency-Key is reused)."""
    from dramatiq.message import Message

    from .broker import PostgresBroker

    broker = PostgresBroker(_url(ctx), pool_size=1)
    try:
        message = Message(queue_name="notification", actor_name="deliver_alert", args=(alert_id,),
                          kwargs={"resend_unknown": True}, options={})
        sent = broker.enqueue(message)
    finally:
        broker.close()
    click.echo(sent.message_id)


@main.command()
@config_option
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
