"""Commands on jobs and schedules: enqueue, jobs list/show/retry/cancel, runs, history."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import click

from .. import admin, exit_codes, jobsearch
from .context import Seconds, config_option, connect, die, json_option, producer
from .output import fmt, print_json, rows

INT4_MIN, INT4_MAX = -(2**31), 2**31 - 1  # jobs.priority is an integer column
MAX_DELAY_SECONDS = 10 * 365 * 86400.0  # ten years: further than any real schedule, well inside timestamptz


@click.command()
@config_option
@click.argument("actor")
@click.option("--queue", "-q", default="default", show_default=True)
@click.option("--args", "args_json", default="[]", help="JSON list of positional arguments.")
@click.option("--kwargs", "kwargs_json", default="{}", help="JSON object of keyword arguments.")
@click.option("--delay", type=Seconds(min=0, max=MAX_DELAY_SECONDS), default=0,
              help="Seconds before it may run.")
@click.option("--priority", type=click.IntRange(INT4_MIN, INT4_MAX), default=None,
              help="Higher runs first (default: the priority the config's role gives the queue, else 0).")
@click.option("--dedupe-key", default=None)
@click.option("--concurrency-key", default=None)
@click.option("--max-retries", type=click.IntRange(min=0, max=1_000_000), default=None)
@click.option("--rate-limit", default=None, help="This job's rate limit: '30/m', '20/s burst 5'.")
@click.option("--rate-limit-key", default=None, help="Its limit key (a template: 'shop:{kwargs[shop]}').")
@click.option("--daily-quota", type=click.IntRange(min=1), default=None, help="Starts per UTC day of its key.")
@click.option("--concurrency-limit", type=click.IntRange(min=1), default=None, help="Running at once per key.")
@click.option("--fairness-key", default=None, help="Keys take turns (a template, as --rate-limit-key).")
@click.option("--fairness-weight", type=click.IntRange(min=1), default=None, help="The key's share of turns.")
@json_option
@click.pass_context
def enqueue(ctx: click.Context, actor: str, queue: str, args_json: str, kwargs_json: str, delay: float,
            priority: int | None, dedupe_key: str | None, concurrency_key: str | None, max_retries: int | None,
            rate_limit: str | None, rate_limit_key: str | None, daily_quota: int | None,
            concurrency_limit: int | None, fairness_key: str | None, fairness_weight: int | None,
            as_json: bool) -> None:
    """Enqueue one job for ACTOR (its module need not be importable here: the limits its
    actor declares are applied by the worker that claims it; the --rate-limit... options
    give this job its own)."""
    from dramatiq.message import Message

    from .. import flow

    args = _json_option("--args", args_json, list, "a JSON list")
    kwargs = _json_option("--kwargs", kwargs_json, dict, "a JSON object")
    options: dict[str, Any] = {} if priority is None else {"priority": priority}
    if dedupe_key:
        options["dedupe_key"] = dedupe_key
    if concurrency_key:
        options["concurrency_key"] = concurrency_key
    if max_retries is not None:
        options["max_attempts"] = max_retries + 1
    limits = {flow.RATE_LIMIT: rate_limit, "rate_limit_key": rate_limit_key, flow.DAILY_QUOTA: daily_quota,
              flow.CONCURRENCY_LIMIT: concurrency_limit, "fairness_key": fairness_key,
              flow.FAIRNESS_WEIGHT: fairness_weight}
    options.update({name: value for name, value in limits.items() if value is not None})
    try:
        flow.merged_plan(actor, {}, options)
    except flow.LimitOptionError as exc:
        die(f"--{exc.option.replace('_', '-')}: {exc}", exit_codes.USAGE)
    message: Message[Any] = Message(queue_name=queue, actor_name=actor, args=tuple(args), kwargs=kwargs, options=options)
    with producer(ctx) as broker:
        sent = broker.enqueue(message, delay=int(delay * 1000))
    if as_json:
        print_json({"id": sent.message_id, "queue": queue, "actor": actor})
    else:
        click.echo(sent.message_id)


def _json_option(name: str, text: str, kind: type, what: str) -> Any:
    """A JSON option value that PostgreSQL's jsonb can store (no NaN or Infinity)."""
    try:
        value = json.loads(text)
        json.dumps(value, allow_nan=False)
    except ValueError as exc:  # JSONDecodeError included
        die(f"{name} must be JSON ({what}, no NaN or Infinity): {exc}", exit_codes.USAGE)
    if not isinstance(value, kind):
        die(f"{name} must be {what}, got {type(value).__name__}: {text[:60]}", exit_codes.USAGE)
    return value


@click.group()
@config_option
def jobs() -> None:
    """List, inspect, retry and cancel jobs."""


@jobs.command("list")
@config_option
@click.option("--status", type=click.Choice(admin.JOB_STATUSES))
@click.option("--queue", "-q", default=None)
@click.option("--actor", default=None)
@click.option("--id", "job_id", default=None, metavar="ID", help="A job id or the start of one (hex digits).")
@click.option("--dedupe-key", default=None)
@click.option("--concurrency-key", default=None)
@click.option("--workflow", default=None, metavar="ID", help="The steps of a workflow (supervisor workflows list).")
@click.option("--match", default=None, metavar="EXPR",
              help="A value inside the arguments: 'kwargs.user_id = 7', 'args[0] = 42'.")
@click.option("--text", default=None, help="A substring of the arguments' JSON.")
@click.option("--scan-rows", default=jobsearch.SCAN_ROWS, show_default=True, type=click.IntRange(min=1),
              help="Jobs a search by queue, actor, key, --match or --text reads at most, newest first (no index serves it).")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(min=1, max=100_000))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def jobs_list(ctx: click.Context, status: str | None, queue: str | None, actor: str | None, job_id: str | None,
              dedupe_key: str | None, concurrency_key: str | None, workflow: str | None, match: str | None,
              text: str | None, scan_rows: int, limit: int, as_json: bool) -> None:
    """Most recent jobs first; find one by id prefix, key, or a value inside its arguments."""
    try:
        search = jobsearch.Search.parse({"id": job_id, "dedupe_key": dedupe_key, "concurrency_key": concurrency_key,
                                         "workflow": workflow, "match": match})
    except jobsearch.SearchError as exc:
        die(f"--{exc}", exit_codes.USAGE)
    where = admin.JobFilter(status=status, queue=queue, actor=actor, text=text, search=search)
    with connect(ctx) as conn:
        page = admin.jobs_page(conn, where, limit=limit, scan_rows=scan_rows)
    rows(page.rows, as_json, ["id", "queue", "actor", "status", "attempts", "run_at", "last_error"])
    if page.scanned_to is not None:
        click.echo(f"searched the newest {scan_rows:,} jobs (created since {fmt(page.scanned_to)}); older ones were "
                   "not searched: give --scan-rows to read further", err=True)


@jobs.command("show")
@config_option
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def jobs_show(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """One job with its history of state changes and progress reports."""
    job_id = _job_id(job_id)
    with connect(ctx) as conn:
        job = admin.show_job(conn, job_id)
    if job is None:
        die(f"no job {job_id}")
    if as_json:
        print_json(job)
        return
    events = job.pop("events")
    reports = job.pop("progress_history")
    for key, value in job.items():
        click.echo(f"{key:>17}: {fmt(value) if key != 'last_error' else value}")
    click.echo("events:")
    for e in events:
        click.echo(f"  {fmt(e['at'])}  {e['from_status'] or '-'} -> {e['to_status']}  by {e['who']}: {e['reason']}")
    if reports:
        click.echo("progress:")
        for p in reports:
            pct = "-" if p["percent"] is None else f"{p['percent']:.0f}%"
            kind = f"[{p['event']}] " if p.get("event") else ""
            click.echo(f"  {fmt(p['at'])}  {pct:>4}  {kind}{p['message'] or ''}".rstrip())


def _job_id(job_id: str) -> str:
    try:
        return str(uuid.UUID(job_id))
    except ValueError:
        die(f"{job_id!r} is not a job id (a UUID like 0b6c3f9e-...; `supervisor jobs list` shows them)",
            exit_codes.USAGE)


def _change(ctx: click.Context, job_id: str, change: Callable[[Any, str], bool], to: str, allowed: str,
            as_json: bool) -> None:
    job_id = _job_id(job_id)
    with connect(ctx) as conn:
        if not change(conn, job_id):
            die(f"job {job_id} is not {allowed} (or does not exist)")
    if as_json:
        print_json({"id": job_id, "status": to})
    else:
        click.echo(f"{job_id} -> {to}")


def _job_change(name: str, change: Callable[[Any, str], bool], to: str, allowed: str, doc: str) -> None:
    """Add ``jobs NAME JOB_ID``: one state change of one job."""

    @jobs.command(name, help=doc)
    @config_option
    @click.argument("job_id")
    @json_option
    @click.pass_context
    def command(ctx: click.Context, job_id: str, as_json: bool) -> None:
        _change(ctx, job_id, change, to, allowed, as_json)


_job_change("retry", admin.retry_job, "pending", "failed or cancelled", "Put a failed or cancelled job back to pending.")
_job_change("cancel", admin.cancel_job, "cancelled", "pending, retryable or running",
            "Cancel a job; a running one is interrupted by its process within about a second.")


def _listing(name: str, gather: Callable[[Any], list[dict[str, Any]]], columns: list[str], doc: str) -> click.Command:
    """A read-only command that prints what ``gather`` finds, as a table or JSON."""

    @click.command(name, help=doc)
    @config_option
    @json_option
    @click.pass_context
    def command(ctx: click.Context, as_json: bool) -> None:
        with connect(ctx) as conn:
            found = gather(conn)
        rows(found, as_json, columns)

    return command


runs = _listing("runs", admin.latest_runs,
                ["job_name", "scheduled_for", "status", "holder", "started_at", "completed_at", "rows_affected", "error_text"],
                "The latest run of every schedule (job_runs): when, where, outcome.")


@click.command()
@config_option
@click.argument("schedule")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(min=1))
@json_option
@click.pass_context
def history(ctx: click.Context, schedule: str, limit: int, as_json: bool) -> None:
    """Recent runs of SCHEDULE (newest first): when, where, outcome, job."""
    with connect(ctx) as conn:
        found = admin.schedule_history(conn, schedule, limit)
    rows(found, as_json, ["scheduled_for", "status", "holder", "started_at", "completed_at", "job_id", "error_text"])
