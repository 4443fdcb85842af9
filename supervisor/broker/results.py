"""PostgresBackend: Dramatiq's Results middleware storing results in ``job_results``.

``message.get_result(block=True)``, ``group(...).get_results()`` and pipelines
work as with Dramatiq's own backends. A blocking get LISTENs before it looks,
and storing a result NOTIFYs its key, so a waiter wakes when the result
commits, not at the next poll. Every statement on ``job_results`` is here.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import psycopg
from dramatiq.broker import MessageProxy
from dramatiq.message import Message
from dramatiq.results.backend import DEFAULT_TIMEOUT, Missing, ResultBackend
from dramatiq.results.errors import ResultMissing, ResultTimeout
from dramatiq.results.result import wrap_exception, wrap_result
from psycopg_pool import ConnectionPool

from .. import db
from .message import jsonb

CHANNEL = "actor_supervisor_results"
# A blocking get looks again at least this often, even without a NOTIFY.
RECHECK_SECONDS = 5.0
# Without LISTEN (a pooled URL and no listen_url), a blocking wait reads this often.
POLL_SECONDS = 0.05

# Store (or replace) a result, copy it onto its job row, and wake its waiters.
STORE = """
WITH stored AS (
    INSERT INTO job_results (key, job_id, value, expires_at)
    VALUES (%(key)s, %(job_id)s, %(value)s, now() + %(ttl_ms)s * interval '1 millisecond')
    ON CONFLICT (key) DO UPDATE
       SET job_id = EXCLUDED.job_id, value = EXCLUDED.value, stored_at = now(), expires_at = EXCLUDED.expires_at
    RETURNING key
), job AS (
    UPDATE job_queue SET result = %(result)s WHERE id = %(job_id)s
), finished AS (  -- stored after its ack (a result backend used outside our worker)
    UPDATE job_history SET result = %(result)s WHERE id = %(job_id)s
)
SELECT pg_notify('actor_supervisor_results', stored.key) FROM stored
"""

# A failure's exception: Dramatiq stores it after the nack (Results.after_nack), so a log
# job's failed done row is already written without it; the exception goes on that row (its
# job's final one: the id's failed done row with no result), as STORE puts it on job_history's.
# An update of a done row, off the job's path (as an operator's retry's): only a failure
# with stored results pays it.
STORE_EXCEPTION = STORE.replace("""), finished AS (""", """), failed AS (
    UPDATE job_done SET result = %(result)s WHERE id = %(job_id)s AND status = 'failed' AND result IS NULL
), finished AS (""")

GET = "SELECT value FROM job_results WHERE key = %(key)s AND expires_at > now()"

# Retention: expired results, and any result stored longer ago than the cap.
PRUNE = """
DELETE FROM job_results WHERE key IN (
    SELECT key FROM job_results WHERE expires_at < now() ORDER BY expires_at LIMIT %(limit)s)
"""

PRUNE_OLD = """
DELETE FROM job_results WHERE key IN (
    SELECT key FROM job_results WHERE stored_at < now() - %(older_than_s)s * interval '1 second'
     ORDER BY stored_at LIMIT %(limit)s)
"""


def _as_json(value: Any) -> Any:
    """What ``jobs.result`` shows: the value itself when it is JSON, else its repr."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return {"repr": repr(value)}
    return value


def _job_id(message_id: str) -> str | None:
    try:
        return str(uuid.UUID(message_id))
    except ValueError:
        return None


class PostgresBackend(ResultBackend):
    """A result backend on the supervisor's database.

    Parameters:
      url: database URL (None: DATABASE_URL, else the embedded server).
      pool: connections to store and read with (the broker passes its own);
        blocking waits always use connections of their own.
      listen_url: where blocking waits LISTEN (default: url; "" for nowhere: a
        pooled URL with no direct one, so waits poll).
      namespace, encoder, use_namespace_prefix_keys: as for every Dramatiq backend.
    """

    def __init__(self, *, url: str | None = None, pool: ConnectionPool | None = None,
                 namespace: str = "dramatiq-results", encoder: Any = None,
                 use_namespace_prefix_keys: bool = False, listen_url: str | None = None) -> None:
        super().__init__(namespace=namespace, encoder=encoder, use_namespace_prefix_keys=use_namespace_prefix_keys)
        self._url = db.resolve_url(url)
        self._listen_url = self._url if listen_url is None else listen_url
        self._pool = pool
        self._owns_pool = pool is None
        self._wait_pool: ConnectionPool | None = None
        self._lock = threading.Lock()

    @property
    def pool(self) -> ConnectionPool:
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = db.make_pool(self._url, min_size=0, name="results")
        return self._pool

    def _waiters(self) -> ConnectionPool:
        """Connections that wait for a NOTIFY: separate, so a long wait never takes a
        connection the broker needs for claims and acks."""
        if self._wait_pool is None:
            with self._lock:
                if self._wait_pool is None:
                    self._wait_pool = db.make_pool(self._listen_url, min_size=0, max_size=8,
                                                   name="result-waits")
        return self._wait_pool

    # --- storing ---------------------------------------------------------------------

    def store_result(self, message: Message[Any] | MessageProxy, result: Any, ttl: int) -> None:
        self._write(message, wrap_result(result), ttl)

    def store_exception(self, message: Message[Any] | MessageProxy, exception: Exception, ttl: int) -> None:
        self._write(message, wrap_exception(exception), ttl, statement=STORE_EXCEPTION)

    def _write(self, message: Message[Any] | MessageProxy, value: Any, ttl: int, *, statement: str = STORE) -> None:
        params = {
            "key": self.build_message_key(message),
            "job_id": _job_id(message.message_id),
            "value": self.encoder.encode(value),
            "ttl_ms": int(ttl),
            "result": jsonb(_as_json(value)),
        }
        with self.pool.connection(timeout=10) as c:
            c.execute(statement, params)
        if getattr(message, "log_row", None) is not None:  # a job of the log: its done row, with its outcome
            message.log_result = params["result"]  # type: ignore[union-attr]  # PgMessageProxy's

    # --- reading ---------------------------------------------------------------------

    def _get(self, message_key: str) -> Any:
        with self.pool.connection(timeout=10) as c:
            return self._read(c, message_key)

    def _read(self, conn: psycopg.Connection, message_key: str) -> Any:
        row = conn.execute(GET, {"key": message_key}).fetchone()
        return Missing if row is None else self.encoder.decode(bytes(row[0]))

    def unwrap_result(self, res: Any) -> Any:
        # Dramatiq's, with the hints it lacks: the gets below call it typed.
        return super().unwrap_result(res)  # type: ignore[no-untyped-call]  # dramatiq leaves it unannotated

    def get_result(self, message: Message[Any] | MessageProxy, *, block: bool = False,
                   timeout: int | None = None) -> Any:
        """The message's result; with ``block``, wait up to ``timeout`` ms for it."""
        key = self.build_message_key(message)
        if not block:
            found = self._get(key)
            if found is Missing:
                raise ResultMissing(message)
            return self.unwrap_result(found)
        deadline = time.monotonic() + (DEFAULT_TIMEOUT if timeout is None else timeout) / 1000
        if not self._listen_url:
            return self._poll(message, key, deadline)
        with self._waiters().connection(timeout=10) as c:
            c.execute(f"LISTEN {CHANNEL}")
            try:
                while True:
                    found = self._read(c, key)  # after LISTEN: a result stored from now on wakes us
                    if found is not Missing:
                        return self.unwrap_result(found)
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise ResultTimeout(message)
                    for note in c.notifies(timeout=min(remaining, RECHECK_SECONDS)):
                        if note.payload == key:
                            break
            finally:
                c.execute(f"UNLISTEN {CHANNEL}")

    def _poll(self, message: Message[Any] | MessageProxy, key: str, deadline: float) -> Any:
        """Blocking wait without LISTEN (a pooled URL only): read again every POLL_SECONDS."""
        pause = threading.Event()
        while True:
            found = self._get(key)
            if found is not Missing:
                return self.unwrap_result(found)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ResultTimeout(message)
            pause.wait(min(remaining, POLL_SECONDS))

    def close(self) -> None:
        """Close the connections this backend opened (never a pool it was given)."""
        for pool in (self._wait_pool, self._pool if self._owns_pool else None):
            if pool is not None:
                pool.close()
