"""An attempt's outcome as a statement's parameters, and the write of a batch of them to
the log: the one place the outcome statements (sql.FINISH, joblog.LOG_FINISH) get their
parameters, whoever writes them: the worker's ack batcher and nack (outcomes.py), a
fenced job's release by its own process (leases.py), the claim's rows that cannot become
messages (claims.py). River's JobCompleter is the model: one writer of outcomes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.errors import UniqueViolation
from psycopg.pq import TransactionStatus

from .. import db
from . import logstore
from .sql import joblog


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




def log_columns(where: Sequence[logstore.LogRow], ended: Sequence[int]) -> dict[str, Any]:
    """The parameters sql.LOG_FINISH has beyond sql.FINISH's: each row's place in the log
    (its queue, actor and creation too: the done row keeps them for the reads), and the
    batches whose every outcome is then written (``ended``); no stored results (the
    broker's writes add them: Outcomes._log_outcomes)."""
    return {"queues": db.array_text([w.queue for w in where]), "actors": db.array_text([w.actor for w in where]),
            "created": db.array_text([w.created_at for w in where]),
            "seqs": db.array_ints([w.seq for w in where]), "days": db.array_text([w.day for w in where]),
            "batches": db.array_ints([w.batch for w in where]), "ended": db.array_ints(ended), "results": None}


def log_finish_params(owner: str, rows: Sequence[Finish], where: Sequence[logstore.LogRow], ended: Sequence[int],
                      progress: Any = None) -> dict[str, Any]:
    """sql.LOG_FINISH's parameters for ``rows`` of any kind (finish_params and log_columns)."""
    return {**finish_params(owner, rows, progress), **log_columns(where, ended)}


def successes_only(kinds: str) -> bool:
    """Whether the outcomes' kinds (an array literal: ack_params' or finish_params') are all
    successes."""
    return set(kinds[1:-1].replace('"', "").split(",")) == {"succeeded"}


def write_log_outcomes(conn: psycopg.Connection, batches: logstore.Batches, ids: Sequence[str],
                       params: Callable[[list[int]], dict[str, Any]]) -> int:
    """sql.LOG_FINISH (LOG_ACK when all are successes) for the outcomes of these log jobs
    (``params``: its parameters, given the batches whose last outcomes an earlier write
    committed, which go with this one); how many it wrote. The batches these complete go
    with the next write (logstore.Batches); those taken go back if this one fails."""
    ended = batches.take_ended()
    try:
        values = params(ended)
        # successes only (an ack batch): the statement without what a job going on needs
        first, fenced = ((joblog.LOG_ACK_FIRST, joblog.LOG_ACK) if successes_only(values["kinds"])
                         else (joblog.LOG_FINISH_FIRST, joblog.LOG_FINISH))
        if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
            # a statement of its own: a failed one changed nothing, and the fenced one follows
            try:
                written = db.one(conn.execute(first, values))
            except UniqueViolation:  # another writer ended one of these attempts first
                written = db.one(conn.execute(fenced, values))
        else:  # inside a transaction, which a failed statement would end
            written = db.one(conn.execute(fenced, values))
    except BaseException:
        batches.give_back(ended)
        raise
    batches.written(ids)
    return int(written)


def ack_params(owner: str, ids: Sequence[str], attempts: Sequence[int], started: Sequence[float | None],
               ended: Sequence[float | None], progress: Any = None) -> dict[str, Any]:
    """``finish_params`` for a batch of successes, the hot path: no Finish per job (a
    frozen dataclass costs microseconds a job, the whole ack batch's share of the rest)."""
    now = time.monotonic()
    return {
        "owner": owner, "ids": db.array_text(ids), "attempts": db.array_ints(attempts),
        "kinds": "{" + ",".join(["succeeded"] * len(ids)) + "}", "progress": progress,
        "started_us": db.array_ints([None if t is None else int((now - t) * 1e6) for t in started]),
        "ended_us": db.array_ints([None if t is None else int((now - t) * 1e6) for t in ended]),
        **_NO_FAILURE,
    }


# The columns only failures, retries and requeues carry (NULL arrays: unnest pads them).
_NO_FAILURE: dict[str, Any] = {"errors": None, "error_types": None, "error_wheres": None, "reasons": None,
                               "delays_ms": None, "options": None, "payloads": None}
