"""Commands on jobs and queues: enqueue, jobs list/show/retry/cancel, queues, runs."""

from __future__ import annotations

import json
from typing import Any

import click

from .. import admin, exit_codes
from .context import config_option, connect, die, producer
from .output import fmt, print_json, table


@click.command()
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

    try:
        args = json.loads(args_json)
        kwargs = json.loads(kwargs_json)
    except json.JSONDecodeError as exc:
        die(f"--args/--kwargs must be JSON: {exc}", exit_codes.USAGE)
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        die("--args must be a JSON list and --kwargs a JSON object", exit_codes.USAGE)
    options: dict[str, Any] = {"priority": priority}
    if dedupe_key:
        options["dedupe_key"] = dedupe_key
    if concurrency_key:
        options["concurrency_key"] = concurrency_key
    if max_retries is not None:
        options["max_attempts"] = max_retries + 1
    message = Message(queue_name=queue, actor_name=actor, args=tuple(args), kwargs=kwargs, options=options)
    with producer(ctx) as broker:
        sent = broker.enqueue(message, delay=int(delay * 1000))
    click.echo(sent.message_id)


@click.group()
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
    with connect(ctx) as conn:
        rows = admin.list_jobs(conn, status=status, queue=queue, limit=limit)
    if as_json:
        print_json(rows)
    else:
        table(rows, ["id", "queue", "actor", "status", "attempts", "run_at", "last_error"])


@jobs.command("show")
@config_option
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def jobs_show(ctx, job_id, as_json) -> None:
    """One job with its history of state changes."""
    with connect(ctx) as conn:
        try:
            job = admin.show_job(conn, job_id)
        except Exception as exc:
            die(f"bad job id {job_id!r}: {exc}", exit_codes.USAGE)
    if job is None:
        die(f"no job {job_id}")
    if as_json:
        print_json(job)
        return
    events = job.pop("events")
    for key, value in job.items():
        click.echo(f"{key:>17}: {fmt(value) if key != 'last_error' else value}")
    click.echo("events:")
    for e in events:
        click.echo(f"  {fmt(e['at'])}  {e['from_status'] or '-'} -> {e['to_status']}  by {e['who']}: {e['reason']}")


@jobs.command("retry")
@config_option
@click.argument("job_id")
@click.pass_context
def jobs_retry(ctx, job_id) -> None:
    """Put a failed or cancelled job back to pending."""
    with connect(ctx) as conn:
        if not admin.retry_job(conn, job_id):
            die(f"job {job_id} is not failed or cancelled (or does not exist)")
    click.echo(f"{job_id} -> pending")


@jobs.command("cancel")
@config_option
@click.argument("job_id")
@click.pass_context
def jobs_cancel(ctx, job_id) -> None:
    """Cancel a pending or retryable job."""
    with connect(ctx) as conn:
        if not admin.cancel_job(conn, job_id):
            die(f"job {job_id} is not pending or retryable (or does not exist)")
    click.echo(f"{job_id} -> cancelled")


@click.command()
@config_option
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def runs(ctx, as_json) -> None:
    """The latest run of every schedule (job_runs): when, where, outcome."""
    with connect(ctx) as conn:
        rows = admin.latest_runs(conn)
    if as_json:
        print_json(rows)
    else:
        table(rows, ["job_name", "scheduled_for", "status", "holder", "started_at", "completed_at", "error_text"])


@click.command()
@config_option
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def queues(ctx, as_json) -> None:
    """Per-queue counts: ready, scheduled, running, failed, done in the last hour."""
    with connect(ctx) as conn:
        rows = admin.queue_stats(conn)
    if as_json:
        print_json(rows)
    else:
        table(rows, ["queue", "ready", "scheduled", "retryable", "running", "failed", "succeeded_last_hour"])


