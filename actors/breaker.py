"""Per-source circuit breaker, kept in the ``sources`` row.

closed    failure_streak below the threshold: requests go through.
open      paused_until is ahead: requests are deferred until it passes.
half-open the pause is over but the streak is still at the threshold: one caller
          takes a probe (the pause moves on by ``probe_seconds``), the rest wait;
          a success closes the breaker, a failure opens it for another cooldown.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

import psycopg

from supervisor.config import checks as check
from supervisor.config.keys import key

from .queries import sources as sql

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BreakerSettings:
    threshold: int = key(check.integer(1), "Failures in a row that open a source's breaker.", 5)
    cooldown_seconds: float = key(check.duration(0), "How long an open breaker defers requests to its source.", 300.0,
                                  name="cooldown")
    probe_seconds: float = key(check.duration(0), "Once the cooldown is over, one caller probes the source and "
                               "the pause moves on by this (the others wait).", 60.0, name="probe")


@dataclass(frozen=True)
class Admission:
    allowed: bool
    reopen_at: datetime | None = None  # when refused: try again then
    probe: bool = False  # this caller is the half-open probe
    wait_seconds: float = 0.0


def admit(conn: psycopg.Connection, source_id: int, settings: BreakerSettings) -> Admission:
    row = conn.execute(sql.BREAKER_STATE, {"id": source_id}).fetchone()
    if row is None:
        raise LookupError(f"source {source_id} does not exist")
    streak, paused_until, now = row
    if paused_until is not None and paused_until > now:
        return Admission(False, paused_until, wait_seconds=(paused_until - now).total_seconds())
    if streak < settings.threshold:
        return Admission(True)
    taken = conn.execute(
        sql.TAKE_PROBE, {"id": source_id, "seen": paused_until, "probe_s": settings.probe_seconds}
    ).fetchone()
    if taken is not None:
        log.info("source %s: breaker half-open, probing", source_id)
        return Admission(True, probe=True)
    # Another caller took the probe a moment ago: wait for its window.
    return admit(conn, source_id, settings)


def record_success(conn: psycopg.Connection, source_id: int) -> None:
    conn.execute(sql.RECORD_SUCCESS, {"id": source_id})


def record_failure(conn: psycopg.Connection, source_id: int, error: str, settings: BreakerSettings) -> bool:
    """Count a failure; True when this failure (re)opened the breaker."""
    row = conn.execute(
        sql.RECORD_FAILURE,
        {"id": source_id, "error": error[:2000], "threshold": settings.threshold,
         "cooldown_s": settings.cooldown_seconds},
    ).fetchone()
    if row is None:
        return False
    streak, paused_until = row
    opened = streak >= settings.threshold
    if opened:
        log.warning("source %s: %d consecutive failures, paused until %s (last: %s)",
                    source_id, streak, paused_until.isoformat(), error[:200])
    return opened
