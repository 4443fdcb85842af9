"""An attempt's outcome as a statement's parameters, the write of a batch of them to the
log, and the group commit of successes (AckBatcher: a process's acks written in batches on
a thread of its own, so under load commits fall far below jobs): the one place the outcome statements (sql.FINISH, joblog.LOG_FINISH) get their
parameters, whoever writes them: the worker's ack batcher and nack (outcomes.py), a
fenced job's release by its own process (leases.py), the claim's rows that cannot become
messages (claims.py). River's JobCompleter is the model: one writer of outcomes.
``Completer`` is the broker's part that writes them (the ack batcher's batches, and
every other outcome of its claims), and owns the progress buffer whose latest report
lands with each outcome.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.errors import UniqueViolation
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool

from ... import backoff, db
from .. import logstore, sql, threads
from ..sql import joblog
from .progress import Holds, ProgressBuffer

log = logging.getLogger(__name__)


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
    broker's writes add them: Completer._log_outcomes)."""
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


class Completer:
    """The broker's writer of its claims' outcomes: the ack batcher's batches of successes
    (write_acks) and any mix of outcomes (finish), each job to sql.FINISH or, claimed from
    the log (``batches``), to LOG_FINISH; fenced by ``owner`` and attempt. It owns the
    progress buffer (started on first use), so a job's latest report lands with its outcome."""

    def __init__(self, pool: ConnectionPool, owner: str, batches: logstore.Batches, *, holds: Holds,
                 lock: threading.Lock) -> None:
        self.pool = pool
        self.owner = owner
        self.batches = batches
        self.progress: ProgressBuffer | None = None
        self._holds = holds  # whether this process still runs a job (the progress buffer forgets the rest)
        self._lock = lock  # the broker's start lock: one progress buffer, whoever asks first

    def progress_buffer(self) -> ProgressBuffer:
        """This process's progress reports, written by their own thread, started on
        first use (``supervisor.progress`` keeps its ``record`` for the job)."""
        progress = self.progress
        if progress is None:
            with self._lock:
                if self.progress is None:
                    self.progress = ProgressBuffer(self.pool, holds=self._holds)
                    self.progress.start()
                progress = self.progress
        return progress

    def close(self) -> None:
        """Stop the progress buffer, writing its last reports."""
        if self.progress is None:
            return
        self.progress.stop()
        try:
            with self.pool.connection(timeout=10) as c:
                self.progress.write(c)
        except Exception as exc:
            log.warning("could not write the last progress reports: %s", exc)

    def write_acks(self, ids: list[str], attempts: list[int], started: list[float | None],
                   ended: list[float | None]) -> None:
        """A batch of successes (the ack batcher's write): sql.FINISH, as every outcome (and
        sql.LOG_FINISH for the jobs claimed from the log, through finish)."""
        with self.pool.connection(timeout=10) as c:
            if self.batches:
                logged, where = self.batches.split(ids, attempts)
                if logged:
                    self._ack_log(c, [ids[i] for i in logged], [attempts[i] for i in logged],
                                  [started[i] for i in logged], [ended[i] for i in logged], where)
                    kept = set(logged)
                    rest = [i for i in range(len(ids)) if i not in kept]
                    if not rest:
                        return
                    ids, attempts = [ids[i] for i in rest], [attempts[i] for i in rest]
                    started, ended = [started[i] for i in rest], [ended[i] for i in rest]
            if self.progress is None:
                c.execute(sql.FINISH, ack_params(self.owner, ids, attempts, started, ended))
                return
            with self.progress.for_ack(c, ids) as progress:  # a job's latest report lands with its ack
                c.execute(sql.FINISH, ack_params(self.owner, ids, attempts, started, ended, progress))

    def finish(self, conn: psycopg.Connection, rows: Sequence[Finish], progress: Any = None) -> int:
        """Write these outcomes (the one way any attempt's outcome is written); how many
        rows were still this process's to finish. Rows claimed from the log go to
        sql.LOG_FINISH, the others to sql.FINISH: each fenced its own way, one statement."""
        logged: list[Finish] = []
        rest: list[Finish] = []
        for r in rows:
            (logged if self.batches and self.batches.row(r.id, r.attempt) is not None else rest).append(r)
        written = int(db.one(conn.execute(sql.FINISH, finish_params(self.owner, rest, progress)))) if rest else 0
        return written + (self._finish_log(conn, logged) if logged else 0)

    def _ack_log(self, conn: psycopg.Connection, ids: list[str], attempts: list[int], started: list[float | None],
                 ended: list[float | None], where: list[logstore.LogRow]) -> None:
        """A batch of successes of log rows: sql.LOG_FINISH with ack_params' columns (no
        Finish per job, as for job_queue's acks)."""
        self._log_outcomes(conn, ids, lambda progress, done: {
            **ack_params(self.owner, ids, attempts, started, ended, progress), **log_columns(where, done)})

    def _finish_log(self, conn: psycopg.Connection, rows: Sequence[Finish]) -> int:
        """sql.LOG_FINISH for outcomes of log rows of any kind."""
        where = [w for r in rows if (w := self.batches.row(r.id, r.attempt)) is not None]
        return self._log_outcomes(conn, [r.id for r in rows], lambda progress, done: log_finish_params(
            self.owner, rows, where, done, progress))

    def _log_outcomes(self, conn: psycopg.Connection, ids: list[str],
                      params: Callable[[Any, list[int]], dict[str, Any]]) -> int:
        """write_log_outcomes, a job's latest progress report and its stored result landing
        with its outcome (as with sql.FINISH's acks)."""
        results = self.batches.results(ids)
        if results is not None:
            given = params
            params = lambda progress, done: {**given(progress, done), "results": results}  # noqa: E731
        if self.progress is None:
            return write_log_outcomes(conn, self.batches, ids, lambda done: params(None, done))
        with self.progress.for_ack(conn, ids) as progress:
            return write_log_outcomes(conn, self.batches, ids, lambda done: params(progress, done))


# Called once the acks it came with are committed, with how many of them (a batch's acks
# that share a callback share one call).
Done = Callable[[int], None] | None
# ids, attempts, and when each attempt started and ended running (time.monotonic(), or None)
Write = Callable[[list[str], list[int], list[float | None], list[float | None]], None]



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
