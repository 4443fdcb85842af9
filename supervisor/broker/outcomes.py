"""What becomes of a claimed message: ack (group-committed), nack, retry, requeue.

Every one of them is written by ``Outcomes._finish``, one ``sql.FINISH`` statement for a
batch of any mix, fenced by lease owner and attempt (see sql/outcomes.py), so a late
writer changes nothing. Mixed into PostgresBroker, which provides the state below.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from dramatiq.errors import BrokerConnectionError
from psycopg_pool import ConnectionPool

from .. import backoff, db
from . import error_key, sql
from .finish import AckBatcher, Finish, ack_params, ago_us, finish_params
from .floors import ClaimFloors
from .joining import Failures
from .leases import Leases
from .listener import Wakeups
from .message import PgMessageProxy, body_columns, error_text
from .progress import ProgressBuffer

log = logging.getLogger(__name__)

__all__ = ["Finish", "Outcomes", "ago_us", "finish_params"]




class Outcomes:
    owner: str
    pool: ConnectionPool
    leases: Leases
    floors: ClaimFloors
    jobs_done: int
    _acks: AckBatcher | None
    _listener: Wakeups | None
    _progress: ProgressBuffer | None

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
        """A batch of successes (the ack batcher's write): sql.FINISH, as every outcome."""
        with self.pool.connection(timeout=10) as c:
            if self._progress is None:
                c.execute(sql.FINISH, ack_params(self.owner, ids, attempts, started, ended))
                return
            with self._progress.for_ack(c, ids) as progress:  # a job's latest report lands with its ack
                c.execute(sql.FINISH, ack_params(self.owner, ids, attempts, started, ended, progress))

    def _finish(self, conn: psycopg.Connection, rows: Sequence[Finish], progress: Any = None) -> int:
        """Write these outcomes (the one way any attempt's outcome is written); how many
        rows were still this process's to finish."""
        return int(db.one(conn.execute(sql.FINISH, finish_params(self.owner, rows, progress))))

    def ack(self, message: PgMessageProxy, on_written: Callable[[int], None] | None = None) -> None:
        """``on_written(1)`` runs once the outcome is committed (or nothing is to be written;
        the ack batcher calls it once for all of a batch's acks that share it, with how many)."""
        if message.fenced:  # interrupted: another process may own it now; write nothing
            self.leases.let_go(message.message_id)
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
        acks = self._acks if self._acks is not None else self._start()[1]  # no lock on the hot path
        acks.add(message.message_id, message.attempts, on_written, message.started, message.ended)
        self.leases.let_go(message.message_id)
        self.jobs_done += 1

    def nack(self, message: PgMessageProxy) -> None:
        if message.fenced:
            self.leases.let_go(message.message_id)
            return
        exc = getattr(message, "_exception", None)
        reason = f"attempt {message.attempts} of {message.max_attempts}: {type(exc).__name__ if exc else 'failed'}"
        row = Finish(message.message_id, message.attempts, "failed", message.started, message.ended,
                     **self._error(message, exc), reason=reason)
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
        with self._conn() as c:
            count = self._finish(c, rows)
        for queue in {m.queue_name for m in messages}:  # back in line, behind this process's floors
            self.floors.reset(queue)
        # Only once written: rows it could not give back are still this process's
        # (renewed, and released with the rest of its jobs when it stops).
        self.leases.let_go(*(m.message_id for m in messages))
        return int(count)

