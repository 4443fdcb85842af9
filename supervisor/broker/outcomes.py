"""What becomes of a claimed message: ack (group-committed), nack, retry, requeue.

Every write is fenced by lease owner and attempt (see sql/outcomes.py), so a late writer
changes nothing. Mixed into PostgresBroker, which provides the state below.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import psycopg
from dramatiq.errors import BrokerConnectionError
from psycopg_pool import ConnectionPool

from .. import backoff, db
from . import error_key, sql
from .acks import AckBatcher
from .joining import Failures
from .leases import Leases
from .listener import Wakeups
from .message import PgMessageProxy, body_columns, error_text
from .progress import ProgressBuffer

log = logging.getLogger(__name__)


def ago_us(now: float, at: float | None) -> int | None:
    """Microseconds from ``at`` to ``now`` (both time.monotonic()), None if unknown.
    A write sends how long ago an attempt started and ended, and the server subtracts
    them from its own now(): no host's wall clock enters started_at or finished_at."""
    return None if at is None else int((now - at) * 1e6)


def _ran(message: PgMessageProxy) -> dict[str, int | None]:
    now = time.monotonic()
    return {"started_us": ago_us(now, message.started), "ended_us": ago_us(now, message.ended)}


class Outcomes:
    owner: str
    pool: ConnectionPool
    leases: Leases
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
        params = {"ids": db.array_text(ids), "attempts": db.array_text(attempts), "owner": self.owner}

        def ran() -> dict[str, str]:  # as late as can be: the server's now() is taken next
            now = time.monotonic()
            return {"started_us": db.array_text([ago_us(now, t) for t in started]),
                    "ended_us": db.array_text([ago_us(now, t) for t in ended])}

        with self.pool.connection(timeout=10) as c:
            if self._progress is None:
                c.execute(sql.ACK_MANY, {**params, "progress": None, **ran()})
                return
            with self._progress.for_ack(c, ids) as progress:  # a job's latest report lands with its ack
                c.execute(sql.ACK_MANY, {**params, "progress": progress, **ran()})

    def ack(self, message: PgMessageProxy, on_written: Callable[[], None] | None = None) -> None:
        """``on_written`` runs once the outcome is committed (or nothing is to be written)."""
        if message.fenced:  # interrupted: another process may own it now; write nothing
            self.leases.let_go(message.message_id)
            if on_written is not None:
                on_written()
            return
        if getattr(message, "_exception", None) is not None and not message.retried:
            # It raised and nothing scheduled a retry or a failure (no Retries
            # middleware, or an after_process_message that failed and Dramatiq
            # swallowed): it did not succeed.
            self.nack(message)  # if it raises, the caller gives the slot back
            if on_written is not None:
                on_written()
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
        params = {"id": message.message_id, "attempts": message.attempts, "owner": self.owner,
                  **self._error(message, exc), "reason": reason, **_ran(message)}
        self.failures.record(message.message_id, exc)
        try:
            self._write_until_done("record failure", sql.NACK, params)
        finally:
            self.leases.let_go(message.message_id)
            self.jobs_done += 1

    def _error(self, message: PgMessageProxy, exc: BaseException | None) -> dict[str, str]:
        """A failed attempt's traceback (``last_error``) and its group (its event's
        error_type and error_where, see error_key), parsed from that same text."""
        text = error_text(exc)
        actor = self.actors.get(message.actor_name)
        module = getattr(getattr(actor, "fn", None), "__module__", None)
        key = error_key.parse(text, error_key.own_code(module))
        return {"error": text, "error_type": key.type, "error_where": key.where}

    def _write_until_done(self, what: str, statement: str, params: dict[str, Any]) -> None:
        """Write an outcome, retrying through a database outage.

        Giving up would either lose the outcome (a retry acked as a success) or
        the job; blocking this worker thread while nothing else can progress
        either is the lesser evil. The lease fence makes a late write harmless.
        """
        def write() -> None:
            with self._conn() as c:
                c.execute(statement, params)

        backoff.retry(write, f"{what} of job {params['id']}", retry_on=(BrokerConnectionError,), logger=log)

    def _retry(self, message: PgMessageProxy, delay: int | None) -> PgMessageProxy:
        message.retried = True
        if message.fenced:
            return message
        exc = getattr(message, "_exception", None)
        body = body_columns(message)
        params = {
            "id": message.message_id,
            "attempts": message.attempts,
            "owner": self.owner,
            "options": body["options"],
            "payload": body["payload"],
            **self._error(message, exc),
            "delay_ms": int(delay or 0),
            "reason": f"attempt {message.attempts} of {message.max_attempts} failed"
            f" ({type(exc).__name__ if exc else 'retry'}); retry in {int(delay or 0)} ms",
            "started_us": _ran(message)["started_us"],
        }
        self.emit_before("enqueue", message, delay)
        self._write_until_done("schedule retry", sql.RETRY, params)
        self.leases.let_go(message.message_id)
        if not delay and self._listener is not None:  # due now: wake our consumer before the NOTIFY does
            self._listener.event_for(message.queue_name).set()
        # As Dramatiq's brokers do for a retry: middleware (metrics) sees it enqueued again.
        self.emit_after("enqueue", message, delay)
        return message

    def requeue(self, messages: Iterable[PgMessageProxy], reason: str = "requeued unstarted on drain") -> int:
        """Give claimed rows that never started back to their queue (pending, the claim
        not counted as an attempt); ``reason`` goes to their history."""
        messages = list(messages)
        if not messages:
            return 0
        params = {
            "ids": [m.message_id for m in messages],
            "attempts": [m.attempts for m in messages],
            "owner": self.owner,
            "reason": reason,
        }
        with self._conn() as c:
            count = db.one(c.execute(sql.REQUEUE, params))
        # Only once written: rows it could not give back are still this process's
        # (renewed, and released with the rest of its jobs when it stops).
        self.leases.let_go(*(m.message_id for m in messages))
        return int(count)

