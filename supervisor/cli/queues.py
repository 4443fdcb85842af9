"""`supervisor queues`: per-queue counts (the default), and pause / resume."""

from __future__ import annotations

from typing import Any

import click

from .. import admin, exit_codes
from ..config.reader import NAME
from .context import config_option, connect, die, json_option
from .output import print_json, rows

COLUMNS = ["queue", "paused", "ready", "scheduled", "retryable", "running", "succeeded_1h", "failed_1h",
           "avg_duration_s", "wait_p50_s", "wait_p95_s", "wait_p99_s", "active_workers", "throughput_per_worker_hour", "drain_seconds",
           "workers_needed_1h", "workers_needed_4h", "workers_needed_8h"]


def _with_pauses(stats: list[dict[str, Any]], paused: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Queue stats with a ``paused`` column; a paused queue without jobs is listed too."""
    by_queue = {p["queue"]: p for p in paused}
    out = [{**s, "paused": "paused" if s["queue"] in by_queue else None, "pause": by_queue.get(s["queue"])}
           for s in stats]
    out += [{"queue": q, "paused": "paused", "pause": p} for q, p in by_queue.items()
            if q not in {s["queue"] for s in stats}]
    return sorted(out, key=lambda r: r["queue"])


@click.group(invoke_without_command=True)
@config_option
@json_option
@click.pass_context
def queues(ctx: click.Context, as_json: bool) -> None:
    """Per queue (the v_queue_capacity view): paused, ready, scheduled, retryable, running
    (each live job in one of them), finished in the last hour, average duration (of a
    job's last attempt, running in its thread), start wait p50 / p95 / p99 (from due to
    running, last hour), active workers, throughput per worker-hour, time to drain and
    workers needed to drain in 1, 4 and 8 hours.

    `queues pause Q` and `queues resume Q` stop and restart claims of a queue on every host.
    """
    if ctx.invoked_subcommand is not None:
        return
    with connect(ctx) as conn:
        found = _with_pauses(admin.queue_capacity(conn), admin.paused_queues(conn))
    rows(found, as_json, COLUMNS)


def _queue_name(queue: str) -> str:
    if not NAME.match(queue):
        die(f"{queue!r} is not a queue name (letters, digits, '_', '-' and '.')", exit_codes.USAGE)
    return queue


@queues.command("pause")
@config_option
@click.argument("queue")
@click.option("--reason", default=None, help="Why (shown by `queues`, `status` and the API).")
@json_option
@click.pass_context
def pause(ctx: click.Context, queue: str, reason: str | None, as_json: bool) -> None:
    """Stop every process on every host from claiming QUEUE's jobs (within about a second).

    Running jobs finish; the pause survives restarts until `queues resume QUEUE`."""
    with connect(ctx) as conn:
        changed = admin.pause_queue(conn, _queue_name(queue), reason)
    if as_json:
        print_json({"queue": queue, "paused": True, "changed": changed})
    else:
        click.echo(f"{queue} paused" if changed else f"{queue} was already paused")


@queues.command("resume")
@config_option
@click.argument("queue")
@json_option
@click.pass_context
def resume(ctx: click.Context, queue: str, as_json: bool) -> None:
    """Let QUEUE's jobs be claimed again (idle consumers wake at once)."""
    with connect(ctx) as conn:
        changed = admin.resume_queue(conn, _queue_name(queue))
    if as_json:
        print_json({"queue": queue, "paused": False, "changed": changed})
    else:
        click.echo(f"{queue} resumed" if changed else f"{queue} was not paused")
