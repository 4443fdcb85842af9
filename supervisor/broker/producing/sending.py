"""A producer's write (``enqueue``, ``enqueue_many``): one message's INSERT, and the
write on a connection of the broker's pool, made again on a fresh connection when the
server ends the connection.

Writing again is harmless: every message carries its id, the primary key, so a write
that did commit before its connection died inserts nothing the second time (INSERT
... ON CONFLICT DO NOTHING; COPY meets the unique violation and the batch goes through
INSERT_MANY, which skips every row), and a dedupe key finds the row the first write
made live. A write whose outcome the client never learned is therefore written again,
not guessed at. Only an error that writing again cannot cure (bad input: a data or
programming error) is raised at once; the server's or the network's (``OperationalError``:
the connection ended, the server restarting, no connection in time) are retried until
the time allowed runs out, then raised as one ``BrokerConnectionError``. So is a write
that meets a read-only server (SQLSTATE 25006, a primary demoted in a failover): its
session is closed and the write goes to whichever server now takes writes.

A write inside the caller's own transaction (``broker.transaction(conn)`` or ``conn=``)
never comes here: the server rolled that transaction back with its connection, and
only the caller can redo it, so its error reaches the caller unchanged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from dramatiq.errors import BrokerConnectionError
from dramatiq.message import Message
from psycopg_pool import ConnectionPool

from ... import backoff, db
from .. import sql

log = logging.getLogger(__name__)

T = TypeVar("T")

# A try's wait for a connection never falls below this, however little time is left:
# a pool asked with (almost) no timeout fails without trying.
MIN_CONNECTION_WAIT = 0.5


def insert_one(conn: psycopg.Connection, row: dict[str, Any], message: Message[Any]) -> Message[Any]:
    """One message's row (``sql.INSERT``); the message back, carrying the live job's id
    when its dedupe key has one (which is its own row when an earlier try committed)."""
    for _ in range(5):
        if conn.execute(sql.INSERT, row).fetchone() is not None or not row["dedupe_key"]:
            break
        live = conn.execute(sql.LIVE_BY_DEDUPE_KEYS, {"keys": [row["dedupe_key"]]}).fetchone()
        if live is not None:
            return dataclasses.replace(message, message_id=str(live[1]))
        # the live duplicate finished between our INSERT and SELECT: try again
    return message


def one_line(exc: BaseException) -> str:
    """An error's text on one line (libpq's spans several)."""
    return " ".join(backoff.describe(exc).split())


def write_retrying(pool: ConnectionPool, url: str, write: Callable[[psycopg.Connection], T], what: str, *,
                   give_up_after: float) -> T:
    """``write`` on a connection of ``pool``, again on a fresh one after an
    OperationalError, for up to ``give_up_after`` seconds: at once the first time
    (the idle connections the server ended are weeded out first), then with a short
    backoff. ``write`` must be safe to repeat (see the module's docstring)."""
    started = time.monotonic()
    deadline = started + give_up_after
    waits = backoff.delays(first=0.05, cap=1.0)
    tries = 0
    while True:
        tries += 1
        try:
            with pool.connection(timeout=max(MIN_CONNECTION_WAIT, deadline - time.monotonic())) as c:
                try:
                    return write(c)
                except psycopg.errors.ReadOnlySqlTransaction:
                    # SQLSTATE 25006: this session's server is (now) a standby. The session
                    # will never write again: closed, the pool drops it and connects anew,
                    # and a multi-host URL's target_session_attrs=read-write finds the primary.
                    c.close()
                    raise
        except (psycopg.OperationalError, psycopg.errors.ReadOnlySqlTransaction) as exc:
            # PoolTimeout and the server's shutdowns (57P01 admin_shutdown) are OperationalErrors
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrokerConnectionError(
                    f"could not {what}: database unavailable ({db.redact(url)}) for"
                    f" {time.monotonic() - started:.1f}s over {tries} tries; last error: {one_line(exc)}"
                ) from exc
            log.warning("could not %s (%s); writing again on a fresh connection", what, one_line(exc))
            with contextlib.suppress(Exception):
                pool.check()  # the server ended the idle ones too, most likely: drop them all now
            if tries > 1:
                time.sleep(min(next(waits), left))
