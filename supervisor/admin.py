"""Operator reads and fixes: jobs (list, show, progress, retry, cancel), queues
(stats, pause, resume), schedule runs. The CLI and the HTTP API call these."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from .broker import sql
from .identity import operator
from .worker import scheduler_sql


def list_jobs(conn: psycopg.Connection, *, status: str | None, queue: str | None, limit: int) -> list[dict]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(sql.LIST, {"status": status, "queue": queue, "limit": limit}).fetchall()


def show_job(conn: psycopg.Connection, job_id: str) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        job = cur.execute(sql.GET, {"id": job_id}).fetchone()
        if job is None:
            return None
        job["events"] = cur.execute(sql.EVENTS, {"id": job_id}).fetchall()
        job["progress_history"] = cur.execute(sql.PROGRESS, {"id": job_id}).fetchall()
        _describe_payload(job)
        return job


def job_progress(conn: psycopg.Connection, job_id: str) -> list[dict]:
    """Every progress report of a job that reached the database, oldest first."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(sql.PROGRESS, {"id": job_id}).fetchall()


def _describe_payload(job: dict[str, Any]) -> None:
    """A non-JSON encoder's payload is opaque here (decoding it needs the producer's
    encoder, and unpickling is not for an admin tool): say so instead of showing bytes."""
    payload = job.get("payload")
    if payload is None:
        return
    job["payload"] = (f"cannot render: {len(payload)} bytes written by a non-JSON Dramatiq encoder "
                      "(e.g. PickleEncoder); args, kwargs and options are in it")
    for key in ("args", "kwargs", "options"):
        job[key] = "(in payload)"


def retry_job(conn: psycopg.Connection, job_id: str) -> bool:
    return conn.execute(sql.RETRY_FAILED, {"id": job_id, "who": operator()}).fetchone() is not None


def cancel_job(conn: psycopg.Connection, job_id: str) -> bool:
    """Cancel a pending, retryable or running job (its process interrupts it).
    Cancelling a cancelled job again is harmless: True, nothing written."""
    row = conn.execute(sql.CANCEL, {"id": job_id, "who": operator(), "reason": "cancelled by operator"}).fetchone()
    if row is not None:
        return True
    status = conn.execute(sql.STATUS, {"id": job_id}).fetchone()
    return status is not None and status[0] == "cancelled"


def queue_stats(conn: psycopg.Connection) -> list[dict]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(sql.QUEUE_STATS).fetchall()


def pause_queue(conn: psycopg.Connection, queue: str, reason: str | None = None, who: str | None = None) -> bool:
    """Stop claims from ``queue`` on every host (running jobs finish). False: already paused."""
    params = {"queue": queue, "who": who or operator(), "reason": reason}
    return conn.execute(sql.PAUSE_QUEUE, params).fetchone() is not None


def resume_queue(conn: psycopg.Connection, queue: str) -> bool:
    """Let ``queue`` be claimed again, waking idle consumers. False: it was not paused."""
    return conn.execute(sql.RESUME_QUEUE, {"queue": queue}).fetchone() is not None


def paused_queues(conn: psycopg.Connection) -> list[dict]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(sql.PAUSED_QUEUES).fetchall()


def schedule_history(conn: psycopg.Connection, name: str, limit: int = 20) -> list[dict]:
    """The most recent runs of one schedule, newest first."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(scheduler_sql.HISTORY, {"name": name, "limit": limit}).fetchall()


def latest_runs(conn: psycopg.Connection) -> list[dict]:
    """The latest run of every schedule."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(scheduler_sql.LATEST_RUNS).fetchall()
