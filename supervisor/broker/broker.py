"""PostgresBroker: Dramatiq messages stored as job rows (producer side and outcomes)."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import dramatiq
import psycopg
from dramatiq.broker import Broker
from dramatiq.errors import BrokerConnectionError, QueueNotFound
from dramatiq.message import Message
from dramatiq.middleware import (
    AgeLimit,
    Callbacks,
    CurrentMessage,
    Middleware,
    Pipelines,
    ShutdownNotifications,
    TimeLimit,
)
from dramatiq.results import Results
from psycopg_pool import ConnectionPool, PoolTimeout

from .. import db, defaults
from ..identity import owner_id
from . import sql
from .acks import AckBatcher
from .capacity import Capacity
from .consumer import PostgresConsumer
from .fencing import Fence
from .joining import Failures, QueueHelpers
from .keeper import LeaseKeeper
from .leases import Leases
from .listener import CANCEL_CHANNEL, Listener
from .message import PgMessageProxy, body_columns, decode_claimed
from .middleware import JobOptions, Retries, claim_budgets
from .outcomes import Outcomes
from .progress import ProgressBuffer
from .results import PostgresBackend
from .timer import DueTimer

log = logging.getLogger(__name__)

# How long a claim waits for a connection while claims are failing (see claim).
CLAIM_TIMEOUT_IN_OUTAGE = 0.25
# INSERT_MANY's array parameters and the row field each is made of.
_BULK_ARRAYS = {
    "ids": "id", "queues": "queue", "actors": "actor", "args": "args", "kwargs": "kwargs", "options": "options",
    "message_timestamps": "message_timestamp", "payloads": "payload", "priorities": "priority",
    "delays": "delay_ms", "max_attempts": "max_attempts", "dedupe_keys": "dedupe_key",
    "concurrency_keys": "concurrency_key",
}

_transaction: contextvars.ContextVar[psycopg.Connection | None] = contextvars.ContextVar(
    "actor_supervisor_transaction", default=None
)


class PostgresBroker(QueueHelpers, Outcomes, Broker):
    """A Dramatiq broker whose queues are rows of the ``jobs`` table.

    Parameters:
      url: database URL; None means DATABASE_URL, else the embedded server.
      lease_seconds: how long a claim stays valid without a heartbeat.
      poll_interval: longest idle wait between claims when no NOTIFY arrives.
      max_retries / min_backoff / max_backoff: defaults for the Retries middleware
        (milliseconds, like Dramatiq's).
      pool_size: connections this process may open (claims, acks, retries).
      fail_fast_default: ``join``'s default for ``fail_fast`` (see joining.Failures).
      keep_leases: a consuming broker renews and reaps leases itself (LeaseKeeper:
        the dramatiq CLI); a supervisor worker process does it in its upkeep thread.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        middleware: list[Middleware] | None = None,
        lease_seconds: float = defaults.LEASE_SECONDS,
        poll_interval: float = defaults.POLL_INTERVAL,
        max_retries: int = defaults.MAX_RETRIES,
        min_backoff: int = defaults.MIN_BACKOFF_MS,
        max_backoff: int = defaults.MAX_BACKOFF_MS,
        pool_size: int = 8,
        owner: str | None = None,
        fail_fast_default: bool = False,
        keep_leases: bool = False,
    ) -> None:
        self.url = db.resolve_url(url)
        self.pool: ConnectionPool = db.make_pool(self.url, max_size=pool_size, name="broker")
        if middleware is None:
            middleware = [
                AgeLimit(),
                TimeLimit(),
                ShutdownNotifications(),
                Callbacks(),
                Pipelines(),
                Retries(max_retries=max_retries, min_backoff=min_backoff, max_backoff=max_backoff),
                # Actors with store_results=True keep their results in job_results.
                Results(backend=PostgresBackend(url=self.url, pool=self.pool)),
                CurrentMessage(),
                JobOptions(),
            ]
        super().__init__(middleware=middleware)
        self.owner = owner or owner_id()
        self.lease_seconds = lease_seconds
        self.poll_interval = poll_interval
        # Claims made while idle commit without waiting for their WAL flush: that
        # flush is a third of the enqueue-to-start latency. A claim lost in a server
        # crash only puts the row back to pending (a rerun, like any lost lease,
        # which the attempt fence handles). Claims under load stay synchronous:
        # unflushed commits delay the hint bits that let later claims skip dead
        # index entries. Opened lazily (min_size=0): producers never use it.
        self.idle_claim_pool: ConnectionPool = db.make_pool(
            self.url, min_size=0, max_size=4, name="broker-idle-claims", options="-c synchronous_commit=off"
        )
        self.queues: dict[str, None] = {}
        # Unbounded until a worker process sets it to what it can run at once.
        self.capacity = Capacity(limit=1 << 30)
        # Each queue's consumer holds at most its prefetch (claimed, not finished),
        # as with Dramatiq's own brokers, within the process's capacity.
        self.queue_capacity: dict[str, Capacity] = {}
        self.fail_fast_default = fail_fast_default
        self.failures = Failures(keep=fail_fast_default)
        self.claiming = threading.Event()
        self.claiming.set()
        self.leases = Leases(self.pool, self.owner, lease_seconds)
        # Last, so its after_process_message runs first (see Fence).
        self.fence = Fence(self.leases)
        self.add_middleware(self.fence)
        self._listener: Listener | None = None
        self._acks: AckBatcher | None = None
        self._timer: DueTimer | None = None
        self._keeper = LeaseKeeper(self.leases) if keep_leases else None
        self._progress: ProgressBuffer | None = None
        self._start_lock = threading.Lock()
        self.jobs_done = 0
        self._claims_failing = False
        self._budget_cache: tuple[int, dict[str, Any]] | None = None

    # --- producer side ------------------------------------------------------

    def declare_queue(self, queue_name: str) -> None:
        if queue_name not in self.queues:
            self.emit_before("declare_queue", queue_name)
            self.queues[queue_name] = None
            self.emit_after("declare_queue", queue_name)

    @contextlib.contextmanager
    def transaction(self, conn: psycopg.Connection) -> Iterator[psycopg.Connection]:
        """Enqueue inside the caller's transaction: ``actor.send()`` calls in this
        block write through ``conn``, so the jobs exist if and only if the
        caller's transaction commits."""
        token = _transaction.set(conn)
        try:
            yield conn
        finally:
            _transaction.reset(token)

    def _row(self, message: Message, delay: int | None) -> dict[str, Any]:
        options = message.options
        actor = self.actors.get(message.actor_name)  # None: enqueued by name from elsewhere
        actor_opts = actor.options if actor is not None else {}

        def option(name: str) -> Any:
            value = options.get(name)
            return actor_opts.get(name) if value is None else value

        max_attempts = option("max_attempts")
        if max_attempts is None and actor is not None:
            retries = self._retries()
            max_attempts = 1 if retries is None else retries.max_attempts_for(message, actor)
        # else NULL: the worker that claims it applies its actor's budget
        return {
            "id": message.message_id,
            "queue": message.queue_name,
            "actor": message.actor_name,
            **body_columns(message),
            "message_timestamp": message.message_timestamp,
            "priority": int(options.get("priority") or 0),
            "delay_ms": int(delay or 0),
            "max_attempts": None if max_attempts is None else int(max_attempts),
            "dedupe_key": option("dedupe_key"),
            "concurrency_key": option("concurrency_key"),
        }

    def _retries(self) -> Retries | None:
        for m in self.middleware:
            if isinstance(m, Retries):
                return m
        return None

    @contextlib.contextmanager
    def _conn(self, conn: psycopg.Connection | None = None, *, pool: ConnectionPool | None = None,
              timeout: float = 10.0) -> Iterator[psycopg.Connection]:
        conn = conn or (None if pool else _transaction.get())
        if conn is not None:
            yield conn
            return
        try:
            with (pool or self.pool).connection(timeout=timeout) as pooled:
                yield pooled
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise BrokerConnectionError(f"database unavailable ({db.redact(self.url)}): {exc}") from exc

    def enqueue(self, message: Message, *, delay: int | None = None, conn: psycopg.Connection | None = None):
        if isinstance(message, PgMessageProxy):
            return self._retry(message, delay)
        self.emit_before("enqueue", message, delay)
        row = self._row(message, delay)
        with self._conn(conn) as c:
            for _ in range(5):
                if c.execute(sql.INSERT, row).fetchone() is not None or not row["dedupe_key"]:
                    break
                live = c.execute(sql.LIVE_BY_DEDUPE_KEYS, {"keys": [row["dedupe_key"]]}).fetchone()
                if live is not None:
                    message = dataclasses.replace(message, message_id=str(live[1]))
                    break
                # the live duplicate finished between our INSERT and SELECT: try again
        self.emit_after("enqueue", message, delay)
        return message

    def enqueue_many(
        self, messages: Iterable[Message], *, delay: int | None = None, conn: psycopg.Connection | None = None
    ) -> list[Message]:
        """Insert many messages in one statement. Messages whose dedupe key
        already has a live job come back carrying that job's id."""
        messages = list(messages)
        if not messages:
            return []
        rows = [self._row(m, delay) for m in messages]
        # One array per column (INSERT_MANY's parameter names), in the rows' order.
        params = {array: [r[column] for r in rows] for array, column in _BULK_ARRAYS.items()}
        with self._conn(conn) as c:
            inserted = {str(r[0]) for r in c.execute(sql.INSERT_MANY, params).fetchall()}
            skipped = [r["dedupe_key"] for r in rows if r["id"] not in inserted and r["dedupe_key"]]
            live = {}
            if skipped:
                live = {k: str(i) for k, i in c.execute(sql.LIVE_BY_DEDUPE_KEYS, {"keys": skipped}).fetchall()}
        out = []
        for message, row in zip(messages, rows, strict=True):
            if row["id"] not in inserted and row["dedupe_key"] in live:
                message = dataclasses.replace(message, message_id=live[row["dedupe_key"]])
            out.append(message)
        return out

    # --- worker side --------------------------------------------------------

    def set_capacity(self, limit: int) -> None:
        """Claim no more rows than this process can run at once (its thread count)."""
        self.capacity.set_limit(limit)

    def pause_claiming(self) -> None:
        self.claiming.clear()

    def resume_claiming(self) -> None:
        self.claiming.set()

    def _start(self) -> tuple[Listener, AckBatcher]:
        with self._start_lock:
            if self._listener is None:
                self._listener = Listener(self.url, on_notify={CANCEL_CHANNEL: self.fence.cancel})
                self._listener.start()
            if self._acks is None:
                self._acks = AckBatcher(self._write_acks)
                self._acks.start()
            if self._timer is None:
                self._timer = DueTimer(self.pool)
                self._timer.start()
            if self._keeper is not None and self._keeper.ident is None:
                self._keeper.start()
            return self._listener, self._acks

    def _serve(self, queue_name: str, prefetch: int) -> tuple[threading.Event, Capacity]:
        """A queue consumer's wake-up event (NOTIFY or the due timer) and in-flight bound."""
        listener, _ = self._start()
        assert self._timer is not None
        wakeup = self._timer.serve(queue_name, listener)
        with self._start_lock:
            bound = self.queue_capacity.setdefault(queue_name, Capacity(prefetch, within=self.capacity))
        bound.set_limit(prefetch)
        return wakeup, bound

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 30000) -> PostgresConsumer:
        if queue_name not in self.queues:
            raise QueueNotFound(queue_name)
        wakeup, bound = self._serve(queue_name, prefetch)
        return PostgresConsumer(
            queue_name,
            prefetch=prefetch,
            timeout_ms=timeout,
            claim=lambda queue, n, idle: self.claim(queue, n, idle=idle),
            wakeup=wakeup,
            capacity=bound,
            claiming=self.claiming,
            poll_interval=self.poll_interval,
            outcomes=self,
        )

    def _budgets(self) -> dict[str, Any]:
        """Each known actor's exception and lease-loss budgets, for rows that carry none
        (computed again only when an actor was declared since)."""
        if self._budget_cache is None or self._budget_cache[0] != len(self.actors):
            self._budget_cache = (len(self.actors), claim_budgets(self.actors, self._retries()))
        return self._budget_cache[1]

    def claim(self, queue: str, n: int, *, idle: bool = False) -> list[PgMessageProxy]:
        """Claim up to n rows; ``idle`` when the previous claim found the queue short.

        A row that cannot become a message fails at once, alone; only the others
        are returned (the consumer frees the capacity the bad ones reserved)."""
        params = {"queue": queue, "n": n, "owner": self.owner, "lease_s": self.lease_seconds, **self._budgets()}
        sent = time.monotonic()
        pool = self.idle_claim_pool if idle else self.pool
        # In an outage, ask for a connection only briefly: the consumer tries again
        # at once, and each try makes the pool attempt a fresh connection.
        timeout = CLAIM_TIMEOUT_IN_OUTAGE if self._claims_failing else 10.0
        try:
            with self._conn(pool=pool, timeout=timeout) as c:
                rows = c.execute(sql.CLAIM, params).fetchall()
        except BrokerConnectionError:
            self._claims_failing = True
            with contextlib.suppress(Exception):
                pool.check()  # drop every broken idle connection now, not one per try
            raise
        self._claims_failing = False
        out, bad = decode_claimed(rows, self.actors)
        self.leases.hold([(m.message_id, m.attempts) for m in out], since=sent)
        if bad:
            self.leases.fail_unreadable(bad)
        return out

    def report_progress(self, job_id: str, attempt: int, percent: float | None, message: str | None) -> None:
        """Buffer a progress report of a running job (see ``supervisor.progress``)."""
        progress = self._progress
        if progress is None:
            with self._start_lock:
                if self._progress is None:
                    self._progress = ProgressBuffer(self.pool)
                    self._progress.start()
                progress = self._progress
        progress.record(job_id, attempt, percent, message)

    def flush_acks(self, timeout: float | None = None) -> bool:
        return self._acks.flush(timeout) if self._acks else True

    def close(self) -> None:
        if self._acks is not None:
            self._acks.stop(timeout=10)
        if self._progress is not None:
            self._progress.stop()
            try:
                with self.pool.connection(timeout=10) as c:
                    self._progress.write(c)
            except Exception as exc:
                log.warning("could not write the last progress reports: %s", exc)
        if self._listener is not None:
            self._listener.stop()
        for thread in (self._timer, self._keeper):
            if thread is not None:
                thread.stop()
        for m in self.middleware:
            if isinstance(m, Results) and isinstance(m.backend, PostgresBackend):
                m.backend.close()
        self.idle_claim_pool.close()
        self.pool.close()


def setup_broker(url: str | None = None, **options: Any) -> PostgresBroker:
    """Install a PostgresBroker as Dramatiq's global broker (producers, the dramatiq CLI).

    Call once, before importing actor modules. URL from the argument, else
    DATABASE_URL, else the embedded default.
    """
    current = dramatiq.broker.global_broker
    if isinstance(current, PostgresBroker) and (url is None or current.url == url):
        return current
    options.setdefault("keep_leases", True)  # nobody else renews them under the dramatiq CLI
    broker = PostgresBroker(url, **options)
    dramatiq.set_broker(broker)
    return broker
