"""One attempt's outcome as its owner writes it, and sql.FINISH's parameters for a batch
of them: the one way an outcome is written (success, failure, retry, requeue, and a
claimed row that cannot become a message)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import db


def ago_us(now: float, at: float | None) -> int | None:
    """Microseconds from ``at`` to ``now`` (both time.monotonic()), None if unknown.
    A write sends how long ago an attempt started and ended, and the server subtracts
    them from its own now(): no host's wall clock enters started_at or finished_at."""
    return None if at is None else int((now - at) * 1e6)


@dataclass(frozen=True)
class Finish:
    """One attempt's outcome, as its owner writes it (sql.FINISH): ``kind`` is succeeded,
    failed, retry or requeue; started and ended are time.monotonic() (None: unknown)."""

    id: str
    attempt: int
    kind: str
    started: float | None = None
    ended: float | None = None
    error: str | None = None
    error_type: str | None = None
    error_where: str | None = None
    reason: str | None = None
    delay_ms: int | None = None
    options: Any = None  # jsonb (a retry's new options)
    payload: bytes | None = None


def _column(rows: Sequence[Finish], name: str) -> str | None:
    """A column of text or numbers as one array literal; None (all NULL) when no row has one."""
    values = [getattr(r, name) for r in rows]
    return db.array_text(values) if any(v is not None for v in values) else None


def finish_params(owner: str, rows: Sequence[Finish], progress: Any = None) -> dict[str, Any]:
    """sql.FINISH's parameters for ``rows``. Call it just before the statement: how long ago
    each attempt started and ended is read off the clock here."""
    now = time.monotonic()
    retried = [r for r in rows if r.kind == "retry"]
    return {
        "owner": owner, "ids": db.array_text([r.id for r in rows]),
        "attempts": db.array_text([r.attempt for r in rows]), "kinds": db.array_text([r.kind for r in rows]),
        "progress": progress,
        "started_us": db.array_text([ago_us(now, r.started) for r in rows]),
        "ended_us": db.array_text([ago_us(now, r.ended) for r in rows]),
        "errors": _column(rows, "error"), "error_types": _column(rows, "error_type"),
        "error_wheres": _column(rows, "error_where"), "reasons": _column(rows, "reason"),
        "delays_ms": _column(rows, "delay_ms"),
        "options": [r.options for r in rows] if retried else None,
        "payloads": [r.payload for r in rows] if any(r.payload is not None for r in rows) else None,
    }




def ack_params(owner: str, ids: Sequence[str], attempts: Sequence[int], started: Sequence[float | None],
               ended: Sequence[float | None], progress: Any = None) -> dict[str, Any]:
    """``finish_params`` for a batch of successes, the hot path: no Finish per job (a
    frozen dataclass costs microseconds a job, the whole ack batch's share of the rest)."""
    now = time.monotonic()
    return {
        "owner": owner, "ids": db.array_text(ids), "attempts": db.array_text(attempts),
        "kinds": "{" + ",".join(["succeeded"] * len(ids)) + "}", "progress": progress,
        "started_us": db.array_text([None if t is None else int((now - t) * 1e6) for t in started]),
        "ended_us": db.array_text([None if t is None else int((now - t) * 1e6) for t in ended]),
        **_NO_FAILURE,
    }


# The columns only failures, retries and requeues carry (NULL arrays: unnest pads them).
_NO_FAILURE: dict[str, Any] = {"errors": None, "error_types": None, "error_wheres": None, "reasons": None,
                               "delays_ms": None, "options": None, "payloads": None}
