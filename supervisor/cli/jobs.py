"""Commands on jobs and queues: enqueue, jobs list/show/retry/cancel, queues, runs."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import click

from .. import admin, exit_codes
from .context import config_option, connect, die, json_option, producer
from .output import fmt, print_json, rows


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
    message: Message[Any] = Message(queue_name=queue, actor_name=actor, args=tuple(args), kwargs=kwargs, options=options)
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
        found = admin.list_jobs(conn, status=status, queue=queue, limit=limit)
    rows(found, as_json, ["id", "queue", "actor", "status", "attempts", "run_at", "last_error"])


@jobs.command("show")
@config_option
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def jobs_show(ctx, job_id, as_json) -> None:
    """One job with its history of state changes."""
    job_id = _job_id(job_id)
    with connect(ctx) as conn:
        job = admin.show_job(conn, job_id)
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


def _job_id(job_id: str) -> str:
    try:
        return str(uuid.UUID(job_id))
    except ValueError:
        die(f"{job_id!r} is not a job id (a UUID like 0b6c3f9e-...; `supervisor jobs list` shows them)",
            exit_codes.USAGE)


def _change(ctx: click.Context, job_id: str, change: Callable[[Any, str], bool], to: str, allowed: str) -> None:
    job_id = _job_id(job_id)
    with connect(ctx) as conn:
        if not change(conn, job_id):
            die(f"job {job_id} is not {allowed} (or does not exist)")
    click.echo(f"{job_id} -> {to}")


def _job_change(name: str, change: Callable[[Any, str], bool], to: str, allowed: str, doc: str) -> None:
    """Add ``jobs NAME JOB_ID``: one state change of one job."""

    @jobs.command(name, help=doc)
    @config_option
    @click.argument("job_id")
    @click.pass_context
    def command(ctx: click.Context, job_id: str) -> None:
        _change(ctx, job_id, change, to, allowed)


_job_change("retry", admin.retry_job, "pending", "failed or cancelled", "Put a failed or cancelled job back to pending.")
_job_change("cancel", admin.cancel_job, "cancelled", "pending or retryable", "Cancel a pending or retryable job.")


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
                ["job_name", "scheduled_for", "status", "holder", "started_at", "completed_at", "error_text"],
                "The latest run of every schedule (job_runs): when, where, outcome.")
queues = _listing("queues", admin.queue_capacity,
                  ["queue", "ready", "scheduled", "retryable", "running", "succeeded_1h", "failed_1h",
                   "avg_duration_s", "active_workers", "throughput_per_worker_hour", "drain_seconds",
                   "workers_needed_1h", "workers_needed_4h", "workers_needed_8h", "paused"],
                  "Per queue (v_queue_capacity): ready, scheduled, retryable, running, finished in the last "
                  "hour, average duration, active workers, throughput per worker-hour, time to drain and "
                  "workers needed to drain in 1, 4 and 8 hours.")
