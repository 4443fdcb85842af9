"""The idempotent side-effect ledger for webhook deliveries (``notification_attempts``).

Protocol for one delivery of one alert:

1. ``review``: under the alert's row lock, find a succeeded attempt (then do
   nothing) and turn attempts left ``in_flight`` by a dead run into ``unknown``.
2. ``begin``: write this attempt ``in_flight`` (under the same lock, re-checking
   for a success) immediately before the request's first byte is sent.
3. ``finish``: record status code, error and duration; only a success marks the
   alert notified, in the same transaction.

What "exactly once" covers and what it cannot. A webhook cannot be told "do this
only once" unless it deduplicates, so the ledger narrows the unknowable window
to the request itself:

* killed before ``begin`` commits: no attempt, nothing sent; the retry sends.
* killed after the request reached the receiver, before ``finish``: the attempt
  stays ``in_flight``; the retry finds it, marks it ``unknown`` and, by default,
  does NOT resend (the receiver already has it). Same for a response timeout.
* residual window: killed after ``begin`` committed but before the request's
  bytes left the socket (``begin`` runs once the connection is open, so this is
  the time to write one request to a local socket). Then the alert is never
  delivered: at-most-once, visible as an ``unknown`` attempt on an alert still
  not notified. With ``resend_unknown`` it is resent instead (at-least-once, with
  the same Idempotency-Key so a deduplicating receiver drops the copy).
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from supervisor import db

from .queries import notifications as sql
from .queries import pipeline as pipeline_sql


class AlreadyDelivered(Exception):
    """A succeeded attempt exists: do not send again."""


class AttemptInFlight(Exception):
    """Another live run is delivering this alert right now."""


@dataclass(frozen=True)
class Review:
    delivered: bool
    unknown: tuple[int, ...]  # attempts whose outcome nobody recorded
    exists: bool = True


def review(conn: psycopg.Connection, alert_id: int, job_id: str | None, job_attempt: int | None) -> Review:
    """What earlier attempts tell us. An attempt still ``in_flight`` that is not
    this very run's is from a run that died (or timed out) mid-request: it
    becomes ``unknown``."""
    with conn.transaction():
        if conn.execute(pipeline_sql.LOCK_ALERT, {"id": alert_id}).fetchone() is None:
            return Review(False, (), exists=False)
        rows = conn.execute(sql.ATTEMPTS, {"alert_id": alert_id}).fetchall()
        delivered = any(status == "succeeded" for _, status, _, _ in rows)
        orphans = [
            attempt_id for attempt_id, status, jid, jattempt in rows
            if status == "in_flight" and not (str(jid) == str(job_id) and jattempt == job_attempt)
        ]
        if orphans:
            conn.execute(sql.MARK_UNKNOWN, {
                "ids": orphans,
                "why": "outcome unknown: the run that sent this request stopped before recording the response",
            })
        unknown = tuple(sorted({a for a, status, _, _ in rows if status == "unknown"} | set(orphans)))
    return Review(delivered, unknown)


def begin(conn: psycopg.Connection, alert_id: int, job_id: str | None, job_attempt: int | None,
          target: str) -> int:
    """Write the attempt in flight; raise if it was delivered or is being delivered."""
    with conn.transaction():
        conn.execute(pipeline_sql.LOCK_ALERT, {"id": alert_id})
        rows = conn.execute(sql.ATTEMPTS, {"alert_id": alert_id}).fetchall()
        if any(status == "succeeded" for _, status, _, _ in rows):
            raise AlreadyDelivered(f"alert {alert_id} was delivered meanwhile")
        if any(status == "in_flight" for _, status, _, _ in rows):
            raise AttemptInFlight(f"alert {alert_id} is being delivered by another run")
        return db.one(conn.execute(sql.BEGIN, {"alert_id": alert_id, "job_id": job_id, "job_attempt": job_attempt,
                                        "target": target}))


def finish(conn: psycopg.Connection, attempt_id: int, status: str, *, http_status: int | None = None,
           error: str | None = None, duration_ms: int | None = None) -> None:
    if status not in ("succeeded", "failed", "unknown"):
        raise ValueError(f"bad attempt status {status!r}")
    with conn.transaction():
        row = conn.execute(sql.FINISH, {"id": attempt_id, "status": status, "http_status": http_status,
                                        "error": error, "duration_ms": duration_ms}).fetchone()
        if row is not None and status == "succeeded":
            conn.execute(pipeline_sql.MARK_ALERT_NOTIFIED, {"id": row[0]})


def record_unsent(conn: psycopg.Connection, alert_id: int, job_id: str | None, job_attempt: int | None,
                  target: str, error: str, duration_ms: int | None = None) -> None:
    """An attempt that failed before any byte was sent (connection refused, DNS)."""
    conn.execute(sql.RECORD_UNSENT, {"alert_id": alert_id, "job_id": job_id, "job_attempt": job_attempt,
                                     "target": target, "error": error, "duration_ms": duration_ms})
