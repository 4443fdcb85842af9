"""Every outcome of a claimed attempt, decided one way: ``Outcomes`` (``broker.outcomes``)
turns Dramatiq's calls (ack, nack, retry) and ours (rate limited, requeue) into Finish
rows, written by the completer (completer.py; a batch of acks through
completer.AckBatcher); each fenced by lease owner and attempt (see sql/outcomes.py), so a
late writer changes nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from dramatiq.errors import BrokerConnectionError

from ... import backoff
from .. import error_key, logstore, sql
from ..connections import Connections
from ..joining import Failures
from ..message import PgMessageProxy, body_columns, error_text
from ..signals import Emit
from .background import Background
from .completer import Completer, Finish
from .floors import ClaimFloors
from .leases import Leases

log = logging.getLogger(__name__)


class Outcomes:
    """What became of each claimed attempt: lets go of its lease (``leases``; its log
    batch in ``batches``), records a failure for ``join`` (``failures``), gives the ack
    to the ack batcher (``background``, started on the first ack if no consumer started
    it) and every other outcome to ``completer``. A write that makes a job claimable again
    holds ``handback`` (see PostgresBroker.__init__). Its own state: ``jobs_done``."""

    def __init__(self, connections: Connections, *, completer: Completer, background: Background, leases: Leases,
                 batches: logstore.Batches, floors: ClaimFloors, failures: Failures, actors: dict[str, Any],
                 handback: threading.RLock, emit_before: Emit, emit_after: Emit) -> None:
        self.connections = connections
        self.completer = completer
        self.background = background
        self.leases = leases
        self.batches = batches
        self.floors = floors
        self.failures = failures
        self.actors = actors  # dramatiq's Broker's: the declared actors by name (the same dict)
        self.jobs_done = 0
        self._handback = handback
        self._emit_before = emit_before
        self._emit_after = emit_after

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
        acks = self.background.acks
        if acks is None:  # no lock on the hot path
            acks = self.background.start()[1]
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
            with self.connections.connection() as c:
                self.completer.finish(c, [row])

        backoff.retry(write, f"{what} of job {row.id}", retry_on=(BrokerConnectionError,), logger=log)

    def retry(self, message: PgMessageProxy, delay: int | None) -> PgMessageProxy:
        """Retries' hand-back of a failed attempt (the broker's enqueue of its proxy): the job
        written back to run again after ``delay`` ms, this attempt's error recorded."""
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
        self._emit_before("enqueue", message, delay)
        with self._handback:
            self._write_until_done("schedule retry", row)
            self.leases.let_go(message.message_id)
        listener = self.background.listener
        if not delay and listener is not None:  # due now: wake our consumer before the NOTIFY does
            listener.event_for(message.queue_name).set()
        # As Dramatiq's brokers do for a retry: middleware (metrics) sees it enqueued again.
        self._emit_after("enqueue", message, delay)
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
            with self.connections.connection() as c, c.transaction():
                if self.completer.finish(c, [row]):  # still ours: its key is blocked with it
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
            with self.connections.connection() as c:
                count = self.completer.finish(c, rows)
            # Only once written: rows it could not give back are still this process's
            # (renewed, and released with the rest of its jobs when it stops).
            self.leases.let_go(*(m.message_id for m in messages))
        for queue in {m.queue_name for m in messages}:  # back in line, behind this process's floors
            self.floors.reset(queue)
        return int(count)

