"""Actors for the progress, results and job-log tests (queue "ops")."""

import time

import dramatiq

import supervisor


@dramatiq.actor(queue_name="ops", max_retries=0, store_results=True)
def ops_add(x: int, y: int, sleep_s: float = 0.0) -> int:
    time.sleep(sleep_s)
    return x + y


@dramatiq.actor(queue_name="ops", max_retries=0, store_results=True)
def ops_fail() -> None:
    raise ValueError("planned failure")


@dramatiq.actor(queue_name="ops", max_retries=0)
def ops_steps(n: int, pause_at: int = -1, pause_s: float = 0.0) -> None:
    """Reports progress n times; sleeps after step ``pause_at`` (so a test can look)."""
    for i in range(1, n + 1):
        supervisor.progress(100 * i / n, f"step {i} of {n}")
        if i == pause_at:
            time.sleep(pause_s)


@dramatiq.actor(queue_name="ops", max_retries=0)
def ops_counted(rows: int) -> None:
    """Adds fields to its job's log line (supervisor.log_fields), the last call winning."""
    supervisor.log_fields(rows=0, date_from="2026-01-01")
    supervisor.log_fields(rows=rows, date_to="2026-01-31")


@dramatiq.actor(queue_name="ops", max_retries=0)
def ops_events(n: int) -> None:
    """Reports n events of alternating kinds in a tight loop (well within one write interval)."""
    for i in range(1, n + 1):
        supervisor.progress(100 * i / n, f"item {i}", event="fetched" if i % 2 else "parsed")
