"""Every outcome of a claimed attempt, written one way: the ``Outcomes`` mixin of
PostgresBroker decides them (their parameters and the log's write: completer.py): ack (through batcher.AckBatcher), nack, retry, rate limited, requeue, and
a claimed row that cannot become a message. Each goes through
one ``sql.FINISH`` statement, fenced by lease owner and attempt (see sql/outcomes.py),
so a late writer changes nothing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from dramatiq.errors import BrokerConnectionError
from psycopg_pool import ConnectionPool

from .. import backoff, db
from . import error_key, logstore, sql
from .completer import Finish, ack_params, finish_params, log_columns, log_finish_params, write_log_outcomes
from .message import PgMessageProxy, body_columns, error_text

if TYPE_CHECKING:  # the broker's parts this mixin reads
    from .batcher import AckBatcher
    from .floors import ClaimFloors
    from .joining import Failures
    from .leases import Leases
    from .listener import Wakeups
    from .progress import ProgressBuffer

log = logging.getLogger(__name__)


class Outcomes:
    owner: str
    pool: ConnectionPool
    leases: Leases
    batches: logstore.Batches
    floors: ClaimFloors
    jobs_done: int
    _acks: AckBatcher | None
    _listener: Wakeups | None
    _progress: ProgressBuffer | None
    _handback: threading.RLock  # see PostgresBroker.__init__

    failures: Failures
    actors: dict[str, Any]  # dramatiq's Broker: the declared actors by name

    if TYPE_CHECKING:  # provided by PostgresBroker and dramatiq's Broker (never defined here: MRO)
        def _start(self) -> tuple[Wakeups, AckBatcher]: ...

        def _conn(self, conn: psycopg.Connection | None = None, *, pool: ConnectionPool | None = None,
                  timeout: float = 10.0) -> contextlib.AbstractContextManager[psycopg.Connection]: ...

        def emit_before(self, signal: str, *args: Any, **kwargs: Any) -> None: ...

        def emit_after(self, signal: str, *args: Any, **kwargs: Any) -> None: ...

    def _write_acks(self, ids: list[str], attempts: list[int], started: list[float | None],
                    ended: list[float | None]) -> None:
        """A batch of successes (the ack batcher's write): sql.FINISH, as every outcome (and
        sql.LOG_FINISH for the jobs claimed from the log, through _finish)."""
        with self.pool.connection(timeout=10) as c:
            if self.batches:
                logged, where = self.batches.split(ids)
                if logged:
                    self._ack_log(c, [ids[i] for i in logged], [attempts[i] for i in logged],
                                  [started[i] for i in logged], [ended[i] for i in logged], where)
                    kept = set(logged)
                    rest = [i for i in range(len(ids)) if i not in kept]
                    if not rest:
                        return
                    ids, attempts = [ids[i] for i in rest], [attempts[i] for i in rest]
                    started, ended = [started[i] for i in rest], [ended[i] for i in rest]
            if self._progress is None:
                c.execute(sql.FINISH, ack_params(self.owner, ids, attempts, started, ended))
                return
            with self._progress.for_ack(c, ids) as progress:  # a job's latest report lands with its ack
                c.execute(sql.FINISH, ack_params(self.owner, ids, attempts, started, ended, progress))

    def _finish(self, conn: psycopg.Connection, rows: Sequence[Finish], progress: Any = None) -> int:
        """Write these outcomes (the one way any attempt's outcome is written); how many
        rows were still this process's to finish. Rows claimed from the log go to
        sql.LOG_FINISH, the others to sql.FINISH: each fenced its own way, one statement."""
        logged: list[Finish] = []
        rest: list[Finish] = []
        for r in rows:
            (logged if self.batches and self.batches.row(r.id) is not None else rest).append(r)
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
        where = [w for r in rows if (w := self.batches.row(r.id)) is not None]
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
        if self._progress is None:
            return write_log_outcomes(conn, self.batches, ids, lambda done: params(None, done))
        with self._progress.for_ack(conn, ids) as progress:
            return write_log_outcomes(conn, self.batches, ids, lambda done: params(progress, done))

    def ack(self, message: PgMessageProxy, on_written: Callable[[int], None] | None = None) -> None:
        """``on_written(1)`` runs once the outcome is committed (or nothing is to be written;
        the ack batcher calls it once for all of a batch's acks that share it, with how many)."""
        if message.fenced:  # interrupted: another process may own it now; write nothing
            self.leases.let_go(message.message_id)
            self.batches.abandon([message.message_id])  # its batch expires and is released, if no one did
            self.leases.may_have_orphaned()  # else still ours, renewed until now: reaped once it expires
            if on_written is not None:
                on_written(1)
            return
        if getattr(message, "_exception", None) is not None and not message.retried:
            # It raised and nothing scheduled a retry or a failure (no Retries
            # middleware, or an after_process_message that failed and Dramatiq
            # swallowed): it did not succeed.
            self.nack(message)  # if it raises, the caller gives the slot back
            if on_written is not None:
                on_written(1)
            return
        if message.log_result is not None:
            self.batches.keep_result(message.message_id, message.log_result)
        acks = self._acks if self._acks is not None else self._start()[1]  # no lock on the hot path
        acks.add(message.message_id, message.attempts, on_written, message.started, message.ended)
        self.leases.let_go(message.message_id)
        self.jobs_done += 1

    def nack(self, message: PgMessageProxy) -> None:
        if message.fenced:
            self.leases.let_go(message.message_id)
            self.batches.abandon([message.message_id])
            self.leases.may_have_orphaned()
            return
        exc = getattr(message, "_exception", None)
        reason = f"attempt {message.attempts} of {message.max_attempts}: {type(exc).__name__ if exc else 'failed'}"
        row = Finish(message.message_id, message.attempts, "failed", message.started, message.ended,
                     **self._error(message, exc), reason=reason)
        if message.log_result is not None:
            self.batches.keep_result(message.message_id, message.log_result)
        self.failures.record(message.message_id, exc)
        try:
            self._write_until_done("record failure", row)
        finally:
            self.leases.let_go(message.message_id)
            self.jobs_done += 1

    def _error(self, message: PgMessageProxy, exc: BaseException | None) -> dict[str, Any]:
        """A failed attempt's traceback (``last_error``) and its group (its event's
        error_type and error_where, see error_key), parsed from that same text."""
        text = error_text(exc)
        actor = self.actors.get(message.actor_name)
        module = getattr(getattr(actor, "fn", None), "__module__", None)
        key = error_key.parse(text, error_key.own_code(module))
        return {"error": text, "error_type": key.type, "error_where": key.where}

    def _write_until_done(self, what: str, row: Finish) -> None:
        """Write an outcome, retrying through a database outage.

        Giving up would either lose the outcome (a retry acked as a success) or
        the job; blocking this worker thread while nothing else can progress
        either is the lesser evil. The lease fence makes a late write harmless.
        """
        def write() -> None:
            with self._conn() as c:
                self._finish(c, [row])

        backoff.retry(write, f"{what} of job {row.id}", retry_on=(BrokerConnectionError,), logger=log)

    def _retry(self, message: PgMessageProxy, delay: int | None) -> PgMessageProxy:
        message.retried = True
        if message.fenced:
            return message
        exc = getattr(message, "_exception", None)
        body = body_columns(message)
        row = Finish(
            message.message_id, message.attempts, "retry", message.started, None,
            **self._error(message, exc), delay_ms=int(delay or 0), options=body["options"], payload=body["payload"],
            reason=f"attempt {message.attempts} of {message.max_attempts} failed"
            f" ({type(exc).__name__ if exc else 'retry'}); retry in {int(delay or 0)} ms",
        )
        self.emit_before("enqueue", message, delay)
        with self._handback:
            self._write_until_done("schedule retry", row)
            self.leases.let_go(message.message_id)
        if not delay and self._listener is not None:  # due now: wake our consumer before the NOTIFY does
            self._listener.event_for(message.queue_name).set()
        # As Dramatiq's brokers do for a retry: middleware (metrics) sees it enqueued again.
        self.emit_after("enqueue", message, delay)
        return message

    def limited(self, message: PgMessageProxy, seconds: float) -> PgMessageProxy:
        """The actor raised ``supervisor.RateLimited``: its limit key is blocked for
        ``seconds`` on every process, and the job waits for it again, this attempt not
        counted (no retry spent); a job with no key is put back for ``seconds``."""
        message.retried = True  # an outcome is written: the ack that follows is a no-op
        if message.fenced:
            return message
        row = Finish(message.message_id, message.attempts, "limited", message.started, None,
                     delay_ms=int(seconds * 1000),
                     reason=f"rate limited upstream: waits {seconds:g}s, retries untouched")

        def write() -> None:
            with self._conn() as c, c.transaction():
                if self._finish(c, [row]):  # still ours: its key is blocked with it
                    c.execute(sql.BLOCK_JOB_KEY, {"id": message.message_id, "seconds": seconds})

        with self._handback:
            backoff.retry(write, f"record rate limit of job {row.id}", retry_on=(BrokerConnectionError,), logger=log)
            self.leases.let_go(message.message_id)
        return message

    def requeue(self, messages: Iterable[PgMessageProxy], reason: str = "requeued unstarted on drain") -> int:
        """Give claimed rows that never started back to their queue (pending, the claim
        not counted as an attempt); ``reason`` goes to their history."""
        messages = list(messages)
        if not messages:
            return 0
        rows = [Finish(m.message_id, m.attempts, "requeue", reason=reason) for m in messages]
        with self._handback:
            with self._conn() as c:
                count = self._finish(c, rows)
            # Only once written: rows it could not give back are still this process's
            # (renewed, and released with the rest of its jobs when it stops).
            self.leases.let_go(*(m.message_id for m in messages))
        for queue in {m.queue_name for m in messages}:  # back in line, behind this process's floors
            self.floors.reset(queue)
        return int(count)

