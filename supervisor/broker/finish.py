"""One attempt's outcome as its owner writes it, sql.FINISH's parameters for a batch of
them, and the group commit of successes (AckBatcher): the one way an outcome is written
(success, failure, retry, requeue, and a claimed row that cannot become a message)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import backoff, db
from . import threads


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
        "owner": owner, "ids": db.array_text(ids), "attempts": db.array_ints(attempts),
        "kinds": "{" + ",".join(["succeeded"] * len(ids)) + "}", "progress": progress,
        "started_us": db.array_ints([None if t is None else int((now - t) * 1e6) for t in started]),
        "ended_us": db.array_ints([None if t is None else int((now - t) * 1e6) for t in ended]),
        **_NO_FAILURE,
    }


# The columns only failures, retries and requeues carry (NULL arrays: unnest pads them).
_NO_FAILURE: dict[str, Any] = {"errors": None, "error_types": None, "error_wheres": None, "reasons": None,
                               "delays_ms": None, "options": None, "payloads": None}

# Called once the acks it came with are committed, with how many of them (a batch's acks
# that share a callback share one call).
Done = Callable[[int], None] | None
# ids, attempts, and when each attempt started and ended running (time.monotonic(), or None)
Write = Callable[[list[str], list[int], list[float | None], list[float | None]], None]

log = logging.getLogger(__name__)


class AckBatcher(threading.Thread):
    """Collects (job id, attempt) pairs and writes them in batches; each pair's
    ``done`` callback runs once its ack is committed (a consumer frees its slot then).
    The attempt's start and end (monotonic clock) ride along: the ack writes them, so
    recording when a job ran costs no statement of its own.

    While one batch is in flight the next accumulates, so under load the
    number of commits falls far below the number of jobs, and when idle an
    ack is written at once. A failed write keeps the batch and retries with
    backoff: the rows stay 'running' under this process's lease meanwhile. Any other
    error ends the process (see threads.py): acks it cannot write, it must not claim.
    """

    def __init__(self, write: Write, *, max_batch: int = 2000) -> None:
        super().__init__(name="ack-batcher", daemon=True)
        self._write = write
        self._max_batch = max_batch
        self._pending: list[tuple[str, int, Done, float | None, float | None]] = []
        self._lock = threading.RLock()  # the condition's, taken bare by add (a job's path)
        self._cond = threading.Condition(self._lock)
        self._busy = False
        self._halt = False

    def add(self, job_id: str, attempt: int, done: Done = None,
            started: float | None = None, ended: float | None = None) -> None:
        with self._lock:
            self._pending.append((job_id, attempt, done, started, ended))
            if len(self._pending) == 1:  # the batcher waits for the first; later ones join its batch
                self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every ack added so far is committed."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._busy, timeout)

    def stop(self, timeout: float | None = None) -> bool:
        flushed = self.flush(timeout)
        with self._cond:
            self._halt = True
            self._cond.notify_all()
        return flushed

    def run(self) -> None:
        with threads.lifetime(self.name, lambda: self._halt):
            self._run()

    def _run(self) -> None:
        waits = backoff.delays(first=0.1, cap=10.0)
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._halt)
                if self._halt and not self._pending:
                    return
                batch = self._pending[: self._max_batch]
                del self._pending[: self._max_batch]
                self._busy = True
            try:
                self._write([a[0] for a in batch], [a[1] for a in batch], [a[3] for a in batch],
                            [a[4] for a in batch])
            except threads.EXPECTED as exc:
                delay = next(waits)
                threads.warn(log, f"writing {len(batch)} acks", exc, f"retrying in {delay:.1f}s")
                with self._cond:
                    self._pending[:0] = batch
                    self._busy = False
                    self._cond.notify_all()
                    self._cond.wait(delay)
                continue
            waits = backoff.delays(first=0.1, cap=10.0)
            # Each callback once with how many of its acks committed (a consumer's
            # capacity: one release for the batch, not one per job).
            committed: dict[Callable[[int], None], int] = {}
            for _, _, done, _, _ in batch:
                if done is not None:
                    committed[done] = committed.get(done, 0) + 1
            for done, n in committed.items():
                done(n)
            with self._cond:
                self._busy = False
                self._cond.notify_all()
