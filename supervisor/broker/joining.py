"""Dramatiq's test helpers on the jobs table: flush, flush_all, join with the stub broker's
``fail_fast``, and its ``dead_letters``."""

from __future__ import annotations

import threading
import time
import traceback
from collections import OrderedDict
from datetime import UTC, datetime

from dramatiq.errors import QueueJoinTimeout, QueueNotFound
from psycopg_pool import ConnectionPool

from .. import db
from . import sql
from .message import PgMessageProxy, decode_claimed
from .sql import joblog, timers

# How often join looks at the queue.
JOIN_POLL_SECONDS = 0.02


class JobFailed(Exception):
    """A job of the joined queue failed where its exception object could not be kept
    (another process); the message is the job, its actor and its last error line."""


class RaisedInActor(Exception):
    """The traceback of an actor's exception, as text: the cause ``join`` shows under
    the copy it raises (see ``detached``)."""


class Failures:
    """The failures a ``join(fail_fast=True)`` reports: jobs of the queue that ended
    ``failed`` since this broker was made or last flushed.

    When ``keep`` is set, a detached copy of the exception of each job that
    failed in this process is kept (a few, most recent) so join raises the actor's
    own exception type, arguments and attributes, caused by the original traceback
    (as text), as Dramatiq's stub broker does. Never the exception itself: it holds its
    frames and their locals, and a frame that refers back to it makes a cycle that
    lives until a collection; nothing references it past its attempt. A worker
    process leaves ``keep`` unset.
    """

    KEEP = 32

    def __init__(self, *, keep: bool) -> None:
        self.keep = keep
        self.since = datetime.now(UTC)
        self._exceptions: OrderedDict[str, BaseException] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, job_id: str, exception: BaseException | None) -> None:
        if not self.keep or exception is None:
            return
        copy = detached(exception)
        with self._lock:
            self._exceptions[job_id] = copy
            while len(self._exceptions) > self.KEEP:
                self._exceptions.popitem(last=False)

    def reset(self, since: datetime) -> None:
        with self._lock:
            self.since = since
            self._exceptions.clear()

    def exception_for(self, job_id: str, actor: str, error: str | None) -> BaseException:
        with self._lock:
            kept = self._exceptions.get(job_id)
        if kept is not None:
            return kept
        last_line = next((line for line in reversed((error or "").splitlines()) if line.strip()), "no error kept")
        failed = JobFailed(f"job {job_id} ({actor}) failed: {last_line.strip()}")
        failed.__suppress_context__ = True
        return failed


def detached(exception: BaseException) -> BaseException:
    """A copy of ``exception`` that holds no traceback, frame or chained exception: same
    type, args and attributes (made without calling its ``__init__``), whose cause is
    the original traceback as text (a cause, not a note: ``pytest.raises(match=...)``
    reads the notes). A type that cannot be copied so becomes a JobFailed."""
    cls = type(exception)
    try:
        copy = cls.__new__(cls, *exception.args)
        copy.args = exception.args
        copy.__dict__.update(vars(exception))
    except Exception:
        copy = JobFailed(f"{cls.__name__}: {exception}")
    if exception.__traceback__ is not None:
        copy.__cause__ = RaisedInActor("".join(traceback.format_exception(exception)).rstrip())
    return copy


class QueueHelpers:
    """PostgresBroker's ``queue_helpers``: Dramatiq's flush, flush_all and join, and the
    stub broker's ``dead_letters``, over the broker's declared ``queues`` (the same dict)
    and the ``failures`` its outcomes record."""

    def __init__(self, pool: ConnectionPool, queues: dict[str, None], failures: Failures, *,
                 fail_fast_default: bool) -> None:
        self.pool = pool
        self.queues = queues
        self.failures = failures
        self.fail_fast_default = fail_fast_default

    def flush(self, queue_name: str) -> None:
        """Drop the queue's pending and retryable jobs."""
        with self.pool.connection(timeout=10) as c:
            c.execute(sql.FLUSH_QUEUE, {"queue": queue_name})
            c.execute(timers.TIMER_FLUSH, {"queue": queue_name})
            c.execute(joblog.LOG_FLUSH, {"queue": queue_name})

    def flush_all(self) -> None:
        """Flush every queue; ``join`` forgets earlier failures (the stub drops its dead letters)."""
        for queue in self.queues:
            self.flush(queue)
        self.forget_failures()

    @property
    def dead_letters(self) -> list[PgMessageProxy]:
        """The jobs of the declared queues that failed since the broker was made or
        ``flush_all()``, oldest first: what the stub broker calls its dead letters."""
        params = {"queues": list(self.queues), "since": self.failures.since}
        with self.pool.connection(timeout=10) as c:
            rows = c.execute(sql.DEAD_LETTERS, params).fetchall()
            logged = c.execute(joblog.LOG_DEAD_LETTERS, params).fetchall()
        if logged:  # in the order they failed, with job_history's (finished_at, id)
            rows = sorted([*rows, *logged], key=lambda r: (r[-1], str(r[0])))
        # Every actor name is accepted here (a dead letter may name one this process lacks);
        # rows that cannot become a message at all are left out.
        return decode_claimed(rows, {row[2] for row in rows})[0]

    def forget_failures(self) -> None:
        """From now on ``join`` reports only jobs that fail after this call."""
        with self.pool.connection(timeout=10) as c:
            self.failures.reset(db.one(c.execute(sql.NOW)))

    def join(self, queue_name: str, *, timeout: int | None = None, fail_fast: bool | None = None) -> None:
        """Wait until the queue has no live job (tests). With ``fail_fast`` (default:
        ``fail_fast_default``), then raise the exception of a job of the queue that
        failed since the broker was made or flushed, as Dramatiq's stub broker does."""
        if queue_name not in self.queues:
            raise QueueNotFound(queue_name)
        fail_fast = self.fail_fast_default if fail_fast is None else fail_fast
        join(self.pool, queue_name, timeout_ms=timeout, fail_fast=fail_fast, failures=self.failures)


def join(pool: ConnectionPool, queue: str, *, timeout_ms: int | None, fail_fast: bool,
         failures: Failures) -> None:
    """Wait until ``queue`` has no pending, retryable or running job; then, with
    ``fail_fast``, raise the exception of a job that failed (see Failures).

    Raises QueueJoinTimeout when ``timeout_ms`` passes first.
    """
    deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
    while True:
        with pool.connection(timeout=10) as c:
            live = db.one(c.execute(sql.LIVE_IN_QUEUE, {"queue": queue}))  # the log's live jobs too (039)
            failed = None
            if live == 0 and fail_fast:
                since = {"queue": queue, "since": failures.since}
                failed = c.execute(sql.FAILED_SINCE, since).fetchone() or c.execute(joblog.LOG_FAILED_SINCE,
                                                                                     since).fetchone()
        if live == 0:
            if failed is not None:
                # Not "from None": a kept exception's cause is its actor's traceback.
                raise failures.exception_for(str(failed[0]), failed[1], failed[2])
            return
        if deadline is not None and time.monotonic() > deadline:
            raise QueueJoinTimeout(queue)
        time.sleep(JOIN_POLL_SECONDS)
