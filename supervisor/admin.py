"""Operator reads and fixes on jobs: list, show, retry, cancel, queue stats."""

from __future__ import annotations

import getpass
import socket
from typing import Any

import psycopg
from psycopg.rows import dict_row

from .queries import jobs as sql


def _who() -> str:
    return f"operator {getpass.getuser()}@{socket.gethostname()}"


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
    return conn.execute(sql.RETRY_FAILED, {"id": job_id, "who": _who()}).fetchone() is not None


def cancel_job(conn: psycopg.Connection, job_id: str) -> bool:
    row = conn.execute(sql.CANCEL, {"id": job_id, "who": _who(), "reason": "cancelled by operator"}).fetchone()
    return row is not None


def queue_stats(conn: psycopg.Connection) -> list[dict]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(sql.QUEUE_STATS).fetchall()
