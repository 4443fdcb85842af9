"""PostgresBackend: Dramatiq's ``RateLimiterBackend`` on PostgreSQL (``limiter_keys``).

Every Dramatiq rate limiter (ConcurrentRateLimiter, BucketRateLimiter, WindowRateLimiter)
and ``Barrier`` works with it across processes and hosts, and across restarts, with no
Redis. The contract is the one Dramatiq's Redis backend keeps: each key is an integer
with a TTL (milliseconds, set again by every write), an expired key reads as absent, and
an event that ``wait_notify`` publishes stays visible to ``wait`` for its TTL. A wait
LISTENs before it looks, so it wakes on the NOTIFY, not at a poll. The statements are in
sql/limiter.py.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import dramatiq
import psycopg
from dramatiq.errors import BrokerConnectionError
from dramatiq.rate_limits import RateLimiterBackend
from psycopg_pool import ConnectionPool, PoolTimeout

from .. import backoff, db, defaults
from .sql import limiter as sql

# A wait looks again at least this often, even without a NOTIFY (one lost in a reconnect).
RECHECK_SECONDS = 5.0
# Without LISTEN (a pooled URL and no direct one), a wait reads this often.
POLL_SECONDS = 0.05
# What a lost connection raises: an arrival is tried again on it (see ARRIVAL_RETRY_SECONDS).
CONNECTION_ERRORS = (psycopg.OperationalError, PoolTimeout, BrokerConnectionError)
# Bounds for an increment with no lower bound, a decrement with no upper one (bigint).
_UNBOUNDED = 1 << 62


def _digest(key: str) -> str:
    return hashlib.md5(key.encode()).hexdigest()  # noqa: S324  (a name for a NOTIFY payload, not a secret)


class PostgresBackend(RateLimiterBackend):
    """A rate-limiter backend on the supervisor's database.

    Parameters:
      url: database URL. None (and no ``pool``): the database of the global PostgresBroker
        (``supervisor.setup_broker()``, or the worker process's), found at first use, and
        its ``actor_pool`` (a limiter inside an actor is the actor's own work); without
        such a broker, DATABASE_URL, else the embedded server.
      pool: connections to use (the broker passes its own for group callbacks); give ``url``
        with it, for ``wait``'s LISTEN.
      listen_url: where ``wait`` LISTENs (default: url; "" for nowhere: waits poll).
    """

    def __init__(self, *, url: str | None = None, pool: ConnectionPool | None = None,
                 listen_url: str | None = None) -> None:
        self._url = url
        self._listen_url = listen_url
        self._pool = pool
        self._own_pool: ConnectionPool | None = None
        self._wait_pool: ConnectionPool | None = None
        self._lock = threading.Lock()

    # --- where the connections come from ----------------------------------------------------

    def _resolve(self) -> None:
        """Fix url, listen_url and pool at first use (the global broker may come later than
        the limiter, which actor modules often make at import)."""
        with self._lock:
            if self._pool is not None and self._url is not None:
                return
            broker = dramatiq.broker.global_broker
            broker_url = getattr(broker, "url", None)
            if self._url is None and self._pool is None and isinstance(broker_url, str):
                self._url = broker_url
                if self._listen_url is None:
                    self._listen_url = getattr(broker, "listen_url", None)
                self._pool = broker.actor_pool  # type: ignore[union-attr]  # a PostgresBroker's
                return
            self._url = db.resolve_url(self._url)
            if self._pool is None:
                self._own_pool = self._pool = db.make_pool(self._url, min_size=0, max_size=16, name="limiter")

    @property
    def pool(self) -> ConnectionPool:
        if self._pool is None or self._url is None:
            self._resolve()
        assert self._pool is not None
        return self._pool

    @property
    def listen_url(self) -> str:
        if self._url is None:
            self._resolve()
        assert self._url is not None
        return self._url if self._listen_url is None else self._listen_url

    def _waiters(self) -> ConnectionPool:
        """Connections that wait for a NOTIFY: apart, so a long wait never holds one the
        broker or the actors need."""
        if self._wait_pool is None:
            url = self.listen_url
            with self._lock:
                if self._wait_pool is None:
                    self._wait_pool = db.make_pool(url, min_size=0, max_size=8, name="limiter-waits")
        return self._wait_pool

    def _one(self, statement: str, params: dict[str, Any]) -> Any:
        with self.pool.connection(timeout=10) as c:
            row = c.execute(statement, params).fetchone()
        return None if row is None else row[0]

    # --- Dramatiq's RateLimiterBackend --------------------------------------------------------

    def add(self, key: str, value: int, ttl: int) -> bool:
        """Set ``key`` to ``value`` if it is absent (or expired)."""
        return bool(self._one(sql.ADD, {"key": key, "value": int(value), "ttl_ms": int(ttl)}))

    def incr(self, key: str, amount: int, maximum: int, ttl: int) -> bool:
        """Add ``amount`` unless the value would exceed ``maximum``."""
        params = {"key": key, "amount": int(amount), "maximum": int(maximum), "ttl_ms": int(ttl)}
        if amount <= maximum:
            return bool(self._one(sql.INCR, params))
        return self._step_existing(key, amount, -_UNBOUNDED, maximum, ttl)

    def decr(self, key: str, amount: int, minimum: int, ttl: int) -> bool:
        """Subtract ``amount`` unless the value would fall below ``minimum``."""
        params = {"key": key, "amount": int(amount), "minimum": int(minimum), "ttl_ms": int(ttl)}
        if -amount >= minimum:
            return bool(self._one(sql.DECR, params))
        return self._step_existing(key, -amount, minimum, _UNBOUNDED, ttl)

    def _step_existing(self, key: str, delta: int, minimum: int, maximum: int, ttl: int) -> bool:
        # An absent key (0) would go out of bounds: only an existing row may move.
        return bool(self._one(sql.STEP_EXISTING, {"key": key, "delta": int(delta), "minimum": int(minimum),
                                                  "maximum": int(maximum), "ttl_ms": int(ttl)}))

    def incr_and_sum(self, key: str, keys: Callable[[], Iterable[str]], amount: int, maximum: int,
                     ttl: int) -> bool:
        """Add ``amount`` to ``key`` unless it, or the sum over ``keys()``, would exceed ``maximum``."""
        params = {"key": key, "keys": list(keys()), "amount": int(amount), "maximum": int(maximum),
                  "ttl_ms": int(ttl)}
        with self.pool.connection(timeout=10) as c:
            c.execute(sql.ENSURE, params)  # committed alone: no lock held out of key order
            with c.transaction():
                return c.execute(sql.INCR_AND_SUM, params).fetchone() is not None

    def wait(self, key: str, timeout: int | None) -> bool:
        """Until an event is published on ``key`` (True), or ``timeout`` ms pass (False;
        None waits for ever). An event published before the wait began counts."""
        deadline = None if timeout is None else time.monotonic() + timeout / 1000
        if not self.listen_url:
            return self._poll(key, deadline)
        digest = _digest(key)
        with self._waiters().connection(timeout=10) as c:
            c.execute(f"LISTEN {sql.CHANNEL}")
            try:
                while True:
                    if self._seen(c, key):  # after LISTEN: an event from now on wakes us
                        return True
                    remaining = RECHECK_SECONDS if deadline is None else deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    for note in c.notifies(timeout=min(remaining, RECHECK_SECONDS)):
                        if note.payload == digest:
                            break
            finally:
                c.execute(f"UNLISTEN {sql.CHANNEL}")

    def _seen(self, conn: psycopg.Connection, key: str) -> bool:
        return conn.execute(sql.EVENT_SEEN, {"key": key}).fetchone() is not None

    def _poll(self, key: str, deadline: float | None) -> bool:
        pause = threading.Event()
        while True:
            with self.pool.connection(timeout=10) as c:
                if self._seen(c, key):
                    return True
            remaining = POLL_SECONDS if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                return False
            pause.wait(min(remaining, POLL_SECONDS))

    def wait_notify(self, key: str, ttl: int) -> None:
        """Publish an event on ``key``, kept for ``ttl`` ms, and wake its waiters."""
        with self.pool.connection(timeout=10) as c:
            c.execute(sql.NOTIFY_EVENT, {"key": key, "ttl_ms": int(ttl)})

    # --- the group completion barrier (groups.py) ---------------------------------------------

    def arrive(self, key: str, member: str, ttl: int, on_last: Callable[[psycopg.Connection], None]) -> bool | None:
        """Count ``member`` at the barrier ``key`` once; the member that counts last calls
        ``on_last`` with the connection, in the same transaction (sends made there commit
        with the arrival, or neither does). True: this member was the last; False: others
        are still to come; None: it had arrived already, or the barrier is gone. Tried again
        while the database is unreachable (an arrival is idempotent)."""
        def once() -> bool | None:
            with self.pool.connection(timeout=10) as c, c.transaction():
                row = c.execute(sql.ARRIVE, {"key": key, "member": member, "ttl_ms": int(ttl)}).fetchone()
                if row is None:
                    return None
                if row[0] != 0:  # others still to come (below 0: more members than parties, never sent again)
                    return False
                on_last(c)
                return True

        return backoff.retry(once, f"group member {member}'s arrival", first=0.2,
                             give_up_after=defaults.ARRIVAL_RETRY_SECONDS, retry_on=CONNECTION_ERRORS)

    def close(self) -> None:
        """Close the connections this backend opened (never a pool it was given or borrowed)."""
        for pool in (self._wait_pool, self._own_pool):
            if pool is not None:
                pool.close()
        self._wait_pool = self._own_pool = None
