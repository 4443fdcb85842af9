"""Leases: which rows a process holds, renewing them, and returning others'.

Usable without a broker (the master's janitor releases a dead child's leases
with nothing but a pool and its own owner id).
"""

from __future__ import annotations

import logging
import threading

from psycopg_pool import ConnectionPool

from . import sql

log = logging.getLogger(__name__)


class Leases:
    """The rows ``owner`` has claimed and not finished, and the statements on them.

    The heartbeat renews exactly these (see ``sql.HEARTBEAT``): one UPDATE per
    process per beat, not per job.
    """

    def __init__(self, pool: ConnectionPool, owner: str, lease_seconds: float) -> None:
        self.pool = pool
        self.owner = owner
        self.lease_seconds = lease_seconds
        self._held: set[str] = set()
        self._lock = threading.Lock()

    def hold(self, job_ids: list[str]) -> None:
        with self._lock:
            self._held.update(job_ids)

    def let_go(self, *job_ids: str) -> None:
        with self._lock:
            self._held.difference_update(job_ids)

    def count(self) -> int:
        """Jobs claimed by this process and not finished (running or about to)."""
        with self._lock:
            return len(self._held)

    def heartbeat(self) -> int:
        """Renew the lease of every job this process runs: one UPDATE. Returns rows renewed."""
        with self._lock:
            ids = list(self._held)
        if not ids:
            return 0
        with self.pool.connection(timeout=10) as c:
            params = {"ids": ids, "owner": self.owner, "lease_s": self.lease_seconds}
            return c.execute(sql.HEARTBEAT, params).rowcount

    def reap_expired(self, limit: int = 1000) -> list[tuple[str, str, str]]:
        """Return expired leases (of any owner) to pending, or failed when out of attempts."""
        with self.pool.connection(timeout=10) as c:
            rows = c.execute(sql.REAP_EXPIRED, {"limit": limit, "who": self.owner, "why": "lease expired"}).fetchall()
        for job_id, status, owner in rows:
            log.warning("reclaimed job %s from %s (lease expired) -> %s", job_id, owner, status)
        return [(str(r[0]), r[1], r[2]) for r in rows]

    def release_owner(self, owner: str, why: str = "released") -> list[tuple[str, str, str]]:
        """Release every job leased to ``owner`` now (its process is gone or stopping)."""
        with self.pool.connection(timeout=10) as c:
            rows = c.execute(sql.RELEASE_OWNER, {"owner": owner, "who": self.owner, "why": why}).fetchall()
        return [(str(r[0]), r[1], r[2]) for r in rows]
