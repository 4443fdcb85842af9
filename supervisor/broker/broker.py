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
from psycopg_pool import ConnectionPool, PoolTimeout

from .. import backoff, db, defaults
from ..identity import owner_id
from . import sql
from .acks import AckBatcher
from .capacity import Capacity
from .consumer import PostgresConsumer
from .leases import Leases
from .listener import Listener
from .message import PgMessageProxy, error_text, from_claimed_row, jsonb
from .middleware import JobOptions, Retries

log = logging.getLogger(__name__)

_transaction: contextvars.ContextVar[psycopg.Connection | None] = contextvars.ContextVar(
    "actor_supervisor_transaction", default=None
)


class PostgresBroker(Broker):
    """A Dramatiq broker whose queues are rows of the ``jobs`` table.

    Parameters:
      url: database URL; None means DATABASE_URL, else the embedded server.
      lease_seconds: how long a claim stays valid without a heartbeat.
      poll_interval: longest idle wait between claims when no NOTIFY arrives.
      max_retries / min_backoff / max_backoff: defaults for the Retries middleware
        (milliseconds, like Dramatiq's).
      pool_size: connections this process may open (claims, acks, retries).
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
    ) -> None:
        if middleware is None:
            middleware = [
                AgeLimit(),
                TimeLimit(),
                ShutdownNotifications(),
                Callbacks(),
                Pipelines(),
                Retries(max_retries=max_retries, min_backoff=min_backoff, max_backoff=max_backoff),
                CurrentMessage(),
                JobOptions(),
            ]
        super().__init__(middleware=middleware)
        self.url = db.resolve_url(url)
        self.owner = owner or owner_id()
        self.lease_seconds = lease_seconds
        self.poll_interval = poll_interval
        self.pool: ConnectionPool = db.make_pool(self.url, max_size=pool_size, name="broker")
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
        self.claiming = threading.Event()
        self.claiming.set()
        self.leases = Leases(self.pool, self.owner, lease_seconds)
        self._listener: Listener | None = None
        self._acks: AckBatcher | None = None
        self._start_lock = threading.Lock()
        self.jobs_done = 0

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
        if max_attempts is None:
            retries = self._retries()
            if retries is None:
                max_attempts = 1
            elif actor is None:
                max_attempts = retries.max_retries + 1
            else:
                max_attempts = retries.max_attempts_for(message, actor)
        return {
            "id": message.message_id,
            "queue": message.queue_name,
            "actor": message.actor_name,
            "args": list(message.args),
            "kwargs": message.kwargs,
            "options": options,
            "priority": int(options.get("priority") or 0),
            "delay_ms": int(delay or 0),
            "max_attempts": int(max_attempts),
            "dedupe_key": option("dedupe_key"),
            "concurrency_key": option("concurrency_key"),
        }

    def _retries(self) -> Retries | None:
        for m in self.middleware:
            if isinstance(m, Retries):
                return m
        return None

    @contextlib.contextmanager
    def _conn(self, conn: psycopg.Connection | None = None, *,
              pool: ConnectionPool | None = None) -> Iterator[psycopg.Connection]:
        conn = conn or (None if pool else _transaction.get())
        if conn is not None:
            yield conn
            return
        try:
            with (pool or self.pool).connection(timeout=10) as pooled:
                yield pooled
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise BrokerConnectionError(f"database unavailable ({db.redact(self.url)}): {exc}") from exc

    def enqueue(self, message: Message, *, delay: int | None = None, conn: psycopg.Connection | None = None):
        if isinstance(message, PgMessageProxy):
            return self._retry(message, delay)
        self.emit_before("enqueue", message, delay)
        row = self._row(message, delay)
        params = {**row, "args": jsonb(row["args"]), "kwargs": jsonb(row["kwargs"]),
                  "options": jsonb(row["options"])}
        with self._conn(conn) as c:
            for _ in range(5):
                if c.execute(sql.INSERT, params).fetchone() is not None or not row["dedupe_key"]:
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
        params = {
            "ids": [r["id"] for r in rows],
            "queues": [r["queue"] for r in rows],
            "actors": [r["actor"] for r in rows],
            "args": [jsonb(r["args"]) for r in rows],
            "kwargs": [jsonb(r["kwargs"]) for r in rows],
            "options": [jsonb(r["options"]) for r in rows],
            "priorities": [r["priority"] for r in rows],
            "delays": [r["delay_ms"] for r in rows],
            "max_attempts": [r["max_attempts"] for r in rows],
            "dedupe_keys": [r["dedupe_key"] for r in rows],
            "concurrency_keys": [r["concurrency_key"] for r in rows],
        }
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
                self._listener = Listener(self.url)
                self._listener.start()
            if self._acks is None:
                self._acks = AckBatcher(self._write_acks)
                self._acks.start()
            return self._listener, self._acks

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 30000) -> PostgresConsumer:
        if queue_name not in self.queues:
            raise QueueNotFound(queue_name)
        listener, _ = self._start()
        return PostgresConsumer(
            queue_name,
            prefetch=prefetch,
            timeout_ms=timeout,
            claim=lambda queue, n, idle: self.claim(queue, n, idle=idle),
            wakeup=listener.event_for(queue_name),
            capacity=self.capacity,
            claiming=self.claiming,
            poll_interval=self.poll_interval,
            outcomes=self,
        )

    def claim(self, queue: str, n: int, *, idle: bool = False) -> list[PgMessageProxy]:
        """Claim up to n rows; ``idle`` when the previous claim found the queue short."""
        params = {"queue": queue, "n": n, "owner": self.owner, "lease_s": self.lease_seconds}
        with self._conn(pool=self.idle_claim_pool if idle else self.pool) as c:
            rows = c.execute(sql.CLAIM, params).fetchall()
        out = [from_claimed_row(row) for row in rows]
        self.leases.hold([m.message_id for m in out])
        return out

    def _write_acks(self, ids: list[str], attempts: list[int]) -> None:
        with self.pool.connection(timeout=10) as c:
            c.execute(sql.ACK_MANY, {"ids": ids, "attempts": attempts, "owner": self.owner})

    def ack(self, message: PgMessageProxy) -> None:
        _, acks = self._start()
        acks.add(message.message_id, message.attempts)
        self.leases.let_go(message.message_id)
        self.jobs_done += 1

    def nack(self, message: PgMessageProxy) -> None:
        exc = getattr(message, "_exception", None)
        error = error_text(exc)
        reason = f"attempt {message.attempts} of {message.max_attempts}: {type(exc).__name__ if exc else 'failed'}"
        params = {"id": message.message_id, "attempts": message.attempts, "owner": self.owner,
                  "error": error, "reason": reason}
        try:
            self._write_until_done("record failure", sql.NACK, params)
        finally:
            self.leases.let_go(message.message_id)
            self.jobs_done += 1

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
        exc = getattr(message, "_exception", None)
        options = {k: v for k, v in message.options.items() if k != "traceback"}
        params = {
            "id": message.message_id,
            "attempts": message.attempts,
            "owner": self.owner,
            "options": jsonb(options),
            "error": error_text(exc),
            "delay_ms": int(delay or 0),
            "reason": f"attempt {message.attempts} of {message.max_attempts} failed"
            f" ({type(exc).__name__ if exc else 'retry'}); retry in {int(delay or 0)} ms",
        }
        self.emit_before("enqueue", message, delay)
        self._write_until_done("schedule retry", sql.RETRY, params)
        self.leases.let_go(message.message_id)
        # As Dramatiq's brokers do for a retry: middleware (metrics) sees it enqueued again.
        self.emit_after("enqueue", message, delay)
        return message

    def requeue(self, messages: Iterable[PgMessageProxy]) -> int:
        messages = list(messages)
        if not messages:
            return 0
        params = {
            "ids": [m.message_id for m in messages],
            "attempts": [m.attempts for m in messages],
            "owner": self.owner,
        }
        try:
            with self._conn() as c:
                count = db.one(c.execute(sql.REQUEUE, params))
        finally:
            self.leases.let_go(*(m.message_id for m in messages))
        return int(count)

    def flush_acks(self, timeout: float | None = None) -> bool:
        return self._acks.flush(timeout) if self._acks else True

    def close(self) -> None:
        if self._acks is not None:
            self._acks.stop(timeout=10)
        if self._listener is not None:
            self._listener.stop()
        self.idle_claim_pool.close()
        self.pool.close()

    # --- test and admin helpers ----------------------------------------------

    def flush(self, queue_name: str) -> None:
        with self._conn() as c:
            c.execute(sql.FLUSH_QUEUE, {"queue": queue_name})

    def flush_all(self) -> None:
        for queue in self.queues:
            self.flush(queue)

    def join(self, queue_name: str, *, timeout: int | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout / 1000
        while True:
            with self._conn() as c:
                live = db.one(c.execute(sql.LIVE_IN_QUEUE, {"queue": queue_name}))
            if live == 0:
                return
            if deadline is not None and time.monotonic() > deadline:
                raise dramatiq.errors.QueueJoinTimeout(queue_name)
            time.sleep(0.05)


def setup_broker(url: str | None = None, **options: Any) -> PostgresBroker:
    """Install a PostgresBroker as Dramatiq's global broker (for producers).

    Call once, before importing actor modules. URL from the argument, else
    DATABASE_URL, else the embedded default.
    """
    current = dramatiq.broker.global_broker
    if isinstance(current, PostgresBroker) and (url is None or current.url == url):
        return current
    broker = PostgresBroker(url, **options)
    dramatiq.set_broker(broker)
    return broker
