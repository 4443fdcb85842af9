"""Operator reads and fixes on jobs: list, show, retry, cancel, queue stats."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from . import defaults
from .broker import sql
from .identity import operator
from .worker import registry, scheduler_sql


def list_jobs(conn: psycopg.Connection, *, status: str | None, queue: str | None, limit: int) -> list[dict]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(sql.LIST, {"status": status, "queue": queue, "limit": limit}).fetchall()


def show_job(conn: psycopg.Connection, job_id: str) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        job = cur.execute(sql.GET, {"id": job_id}).fetchone()
        if job is None:
            return None
        job["events"] = cur.execute(sql.EVENTS, {"id": job_id}).fetchall()
        return job


def retry_job(conn: psycopg.Connection, job_id: str) -> bool:
    return conn.execute(sql.RETRY_FAILED, {"id": job_id, "who": operator()}).fetchone() is not None


def cancel_job(conn: psycopg.Connection, job_id: str) -> bool:
    row = conn.execute(sql.CANCEL, {"id": job_id, "who": operator(), "reason": "cancelled by operator"}).fetchone()
    return row is not None


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


def latest_runs(conn: psycopg.Connection) -> list[dict]:
    """The latest run of every schedule."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(scheduler_sql.LATEST_RUNS).fetchall()


def masters(conn: psycopg.Connection) -> list[dict]:
    """Every master's registry row, freshest first, with ``beat_age`` in seconds."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(registry.MASTERS).fetchall()


def live_processes_by_role(conn: psycopg.Connection) -> dict[str, int]:
    """Processes per role that beat recently, on every host."""
    rows = conn.execute(registry.LIVE_BY_ROLE, {"fresh_s": 3 * defaults.HEARTBEAT_SECONDS}).fetchall()
    return {role: n for role, n in rows}
