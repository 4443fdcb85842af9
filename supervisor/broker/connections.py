"""Where the broker's parts get a connection: the caller's transaction (inside
``PostgresBroker.transaction``), else the broker's pool; a database that cannot be
reached is Dramatiq's BrokerConnectionError. One definition, shared by the producer,
the claims and the outcomes (each is given a ``Connections``)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
from dramatiq.errors import BrokerConnectionError
from psycopg_pool import ConnectionPool, PoolTimeout

from .. import db

# The caller's connection inside PostgresBroker.transaction(): sends write through it.
callers_transaction: contextvars.ContextVar[psycopg.Connection | None] = contextvars.ContextVar(
    "actor_supervisor_transaction", default=None
)


@contextlib.contextmanager
def within(conn: psycopg.Connection) -> Iterator[psycopg.Connection]:
    """Sends in this block write through ``conn`` (see PostgresBroker.transaction)."""
    token = callers_transaction.set(conn)
    try:
        yield conn
    finally:
        callers_transaction.reset(token)


@dataclass(frozen=True)
class Connections:
    """The broker's pool and its URL (named, redacted, in the error a caller sees)."""

    pool: ConnectionPool
    url: str

    @contextlib.contextmanager
    def connection(self, conn: psycopg.Connection | None = None, *, own: bool = False,
                   timeout: float = 10.0) -> Iterator[psycopg.Connection]:
        """``conn`` if given, else the caller's transaction (unless ``own``: a claim never
        runs in one), else one of the pool's, waited for up to ``timeout``."""
        conn = conn or (None if own else callers_transaction.get())
        if conn is not None:
            yield conn
            return
        try:
            with self.pool.connection(timeout=timeout) as pooled:
                yield pooled
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise BrokerConnectionError(f"database unavailable ({db.redact(self.url)}): {exc}") from exc
