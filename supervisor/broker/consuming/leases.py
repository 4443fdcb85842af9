"""Leases: which rows a process holds, renewing them, and returning others'.

Usable without a broker (the master's janitor releases a dead child's leases
with nothing but a pool and its own owner id).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from ... import defaults
from .. import logstore, sql
from ..sql import joblog
from .completer import Finish, finish_params, log_finish_params, write_log_outcomes

log = logging.getLogger(__name__)


# One delivery of a job: (job id, attempt number), the lease fence.
Hold = tuple[str, int]


def fence_margin(lease_seconds: float) -> float:
    """How long before its lease expires a process stops a job it could not renew."""
    return min(lease_seconds * defaults.FENCE_MARGIN_FRACTION, defaults.FENCE_MARGIN_MAX)


def reap_params(who: str, *, margin_s: float, limit: int = 1000, me: str | None = None,
                why: str = "lease expired") -> dict[str, object]:
    """sql.REAP_EXPIRED's parameters: leases expired ``margin_s`` ago of every owner that
    does not beat, and of ``me`` (an owner that may have orphaned rows), up to ``limit``."""
    return {"limit": limit, "who": who, "why": why, "margin_s": margin_s, "me": me,
            "fresh_beats": defaults.REAP_FRESH_BEATS, "default_max_losses": defaults.MAX_LEASE_LOSSES}


class Leases:
    """The rows ``owner`` has claimed and not finished, and the statements on them.

    The heartbeat renews exactly these (see ``sql.HEARTBEAT``): one UPDATE per
    process per beat, not per job. Each hold has a deadline on this process's
    monotonic clock, taken before the statement that claimed or renewed it was
    sent, minus a margin: past it the lease may have expired, and the job must
    stop (``overdue``, see fencing.py). A held row the heartbeat did not renew
    was reclaimed or cancelled: ``on_lost`` is told at once.

    ``beat_expiry`` (set by a process that other processes release by its beat, see
    worker/liveness.py): once a renewal, or a connection attempt of the pool, has
    failed, and until a renewal succeeds, a hold is also due to stop ``beat_expiry``
    (less a margin) after its last renewal was sent: the age at which a process with
    no session left on the server is released. A process that is merely slow, or
    frozen (it tries nothing), keeps its lease's deadline.
    """

    def __init__(self, pool: ConnectionPool, owner: str, lease_seconds: float,
                 reap_margin: float = defaults.REAP_MARGIN_SECONDS, batches: logstore.Batches | None = None) -> None:
        self.pool = pool
        # the log batches this process holds (the broker's); its jobs' leases are their batches'
        self.batches = batches if batches is not None else logstore.Batches()
        self.owner = owner
        self.lease_seconds = lease_seconds
        self.reap_margin = reap_margin
        self.beat_expiry: float | None = None
        self.on_lost: Callable[[list[Hold]], None] = lambda holds: None
        # job id -> (attempt, when the statement that claimed or last renewed it was sent;
        # inf once reported overdue)
        self._held: dict[str, tuple[int, float]] = {}
        # A renewal, or a connection attempt of the pool, failed since the last renewal
        # that succeeded: this process may have no session left on the server.
        self._unreachable = False
        # When rows of this owner may last have been left running unheld (see
        # may_have_orphaned); None when none can be.
        self._orphaned_at: float | None = None
        self._lock = threading.Lock()

    def may_have_orphaned(self) -> None:
        """Rows of this owner may be running that it does not hold: a claim whose answer
        was lost, jobs it stopped (overdue: the heartbeat renews their rows until the
        job lets go), unreadable rows it could not fail. Nothing
        renews them, and other processes' reaps skip this owner while it beats
        (sql.REAP_EXPIRED): its own reaps read its rows until a reap has run after
        their leases ran out."""
        with self._lock:
            self._orphaned_at = time.monotonic()

    def connection_failed(self, pool: ConnectionPool | None = None) -> None:
        """The pool could not open a connection (its ``reconnect_failed``): renewals
        waiting for one may wait long, so the beat's expiry counts from now on."""
        self._unreachable = True

    def _limit(self) -> float:
        """How long after its claim or last renewal was sent a hold must stop."""
        limit = self.lease_seconds - fence_margin(self.lease_seconds)
        if self.beat_expiry is not None and self._unreachable:
            limit = min(limit, self.beat_expiry - fence_margin(self.beat_expiry))
        return limit

    def hold(self, holds: list[Hold], since: float | None = None) -> None:
        """Start holding claimed rows; ``since``: monotonic time the claim was sent."""
        since = time.monotonic() if since is None else since
        with self._lock:
            for job_id, attempt in holds:
                self._held[job_id] = (attempt, since)

    def let_go(self, *job_ids: str) -> None:
        with self._lock:
            for job_id in job_ids:
                self._held.pop(job_id, None)

    def holds(self, hold: Hold) -> bool:
        with self._lock:
            held = self._held.get(hold[0])
        return held is not None and held[0] == hold[1]

    def holds_job(self, job_id: str) -> list[Hold]:
        with self._lock:
            held = self._held.get(job_id)
        return [] if held is None else [(job_id, held[0])]

    def held(self) -> list[Hold]:
        with self._lock:
            return [(job_id, attempt) for job_id, (attempt, _) in self._held.items()]

    def count(self) -> int:
        """Jobs claimed by this process and not finished (running or about to)."""
        with self._lock:
            return len(self._held)

    def overdue(self, now: float) -> list[Hold]:
        """Holds past their deadline, each reported once."""
        out = []
        limit = self._limit()
        with self._lock:
            for job_id, (attempt, since) in self._held.items():
                if since + limit <= now:
                    out.append((job_id, attempt))
                    self._held[job_id] = (attempt, math.inf)
        if out:  # the jobs stop; their rows stay ours until reaped (renewed until each lets go)
            self.may_have_orphaned()
        return out

    def heartbeat(self) -> int:
        """Renew the lease of every job this process runs: one UPDATE (made again on
        a fresh connection if the server ended the first). Returns rows renewed; held
        rows that were not renewed are reported to ``on_lost``."""
        started = time.monotonic()
        with self._lock:
            sent = [(job_id, attempt) for job_id, (attempt, _) in self._held.items()]
        if not sent and not self.batches:  # nothing held, and no ended batch's lease row to drop
            self._unreachable = False
            return 0
        params = {"ids": [job_id for job_id, _ in sent if self.batches.row(job_id) is None], "owner": self.owner,
                  "lease_s": self.lease_seconds}
        try:
            renewed = self._renew(params)
        except PoolTimeout:
            self._unreachable = True
            raise
        except psycopg.OperationalError:  # once more, at once: the server likely ended its connection
            self._unreachable = True  # meanwhile, and until a renewal succeeds (see _limit)
            with contextlib.suppress(Exception):
                self.pool.check()
            renewed = self._renew(params)
        self._unreachable = False
        with self._lock:
            for job_id, attempt in sent:
                held = self._held.get(job_id)
                if job_id in renewed and held is not None and held[0] == attempt and held[1] != math.inf:
                    self._held[job_id] = (attempt, started)
        lost = [h for h in sent if h[0] not in renewed]
        if lost:
            self.on_lost(lost)
        return len(renewed)

    def _renew(self, params: dict[str, object]) -> set[str]:
        """The held ids renewed: job_queue's rows by sql.HEARTBEAT, the log's by their
        batches (sql.LOG_RENEW, which also drops the batches whose outcomes are all written)."""
        batches, ended = self.batches.held(), self.batches.take_ended()
        try:
            with self.pool.connection(timeout=10) as c:
                renewed = {row[0] for row in c.execute(sql.HEARTBEAT, params).fetchall()} if params["ids"] else set()
                if batches or ended:
                    kept = [row[0] for row in c.execute(joblog.LOG_RENEW, {
                        "batches": batches, "ended": ended, "owner": self.owner,
                        "lease_s": self.lease_seconds}).fetchall()]
                    renewed.update(self.batches.jobs_of(kept))
        except BaseException:
            self.batches.give_back(ended)
            raise
        return renewed

    def fail_unreadable(self, bad: list[tuple[str, int, str]]) -> None:
        """Fail held rows that cannot become messages ((id, attempt, why) each), at
        once and alone. One try: the claim just worked; if this fails, the leases
        expire and a later claim fails them."""
        for job_id, _, why in bad:
            log.error("job %s %s; failing it", job_id, why)
        rows = [Finish(job_id, attempt, "failed", error=why, error_type="Unreadable", error_where="", reason=why)
                for job_id, attempt, why in bad]
        logged = [r for r in rows if self.batches.row(r.id, r.attempt) is not None]
        rows = [r for r in rows if self.batches.row(r.id, r.attempt) is None]
        try:
            with self.pool.connection(timeout=10) as c:
                if rows:
                    c.execute(sql.FINISH, finish_params(self.owner, rows))
                if logged:
                    where = [w for r in logged if (w := self.batches.row(r.id, r.attempt)) is not None]
                    write_log_outcomes(c, self.batches, [r.id for r in logged],
                                       lambda done: log_finish_params(self.owner, logged, where, done))
        except (psycopg.OperationalError, PoolTimeout) as exc:  # never lose the good rows claimed with them
            self.may_have_orphaned()
            log.warning("could not fail %d unreadable job(s) (%s); their leases will expire", len(bad), exc)

    def reap_expired(self, limit: int = 1000) -> list[tuple[str, str, str]]:
        """Return leases (of any owner) expired for longer than the reap margin to
        pending, or failed when out of lease losses. The margin covers the time a
        process needs to notice and interrupt a job it could not renew. Processes that
        beat are skipped (see sql.REAP_EXPIRED), this one too unless it may have
        orphaned rows."""
        started, orphaned = time.monotonic(), self._orphaned_at
        with self.pool.connection(timeout=10) as c:
            rows = c.execute(sql.REAP_EXPIRED, reap_params(self.owner, margin_s=self.reap_margin, limit=limit,
                                                           me=None if orphaned is None else self.owner)).fetchall()
            # the log's batches: every owner renews all it holds at each beat, so an expired one
            # is held by nobody who can still finish it
            rows += c.execute(joblog.LOG_RELEASE, logstore.release_params(
                self.owner, why="lease expired", margin_s=self.reap_margin, limit=limit)).fetchall()
        if orphaned is not None and len(rows) < limit and started > orphaned + self.lease_seconds + self.reap_margin:
            # every row it may have orphaned then had expired: this reap released them
            # (unless a newer orphaning came since: that one stands)
            with self._lock:
                if self._orphaned_at == orphaned:
                    self._orphaned_at = None
        for job_id, status, owner in rows:
            log.warning("reclaimed job %s from %s (lease expired) -> %s", job_id, owner, status)
        return [(str(r[0]), r[1], r[2]) for r in rows]

    def release_dead(self, stale_beats: float) -> list[tuple[str, str, str]]:
        """Release the rows of processes that died (see ``sql.RELEASE_DEAD``): their
        beat older than ``stale_beats`` of their beat intervals, and no session left."""
        with self.pool.connection(timeout=10) as c:
            rows = c.execute(sql.RELEASE_DEAD, {
                "stale_beats": stale_beats, "who": self.owner, "default_max_losses": defaults.MAX_LEASE_LOSSES,
                "why": "its process stopped beating and has no session left"}).fetchall()
            rows += c.execute(joblog.LOG_RELEASE, logstore.release_params(
                self.owner, why="its process stopped beating and has no session left",
                stale_beats=stale_beats)).fetchall()
        for job_id, status, owner in rows:
            log.warning("reclaimed job %s from %s (no beat, no session: the process is gone) -> %s",
                        job_id, owner, status)
        return [(str(r[0]), r[1], r[2]) for r in rows]

    def release_owner(self, owner: str, why: str = "released") -> list[tuple[str, str, str]]:
        """Release every job leased to ``owner`` now (its process is gone or stopping)."""
        with self.pool.connection(timeout=10) as c:
            rows = c.execute(sql.RELEASE_OWNER, {"owner": owner, "who": self.owner, "why": why,
                                                 "default_max_losses": defaults.MAX_LEASE_LOSSES}).fetchall()
            rows += c.execute(joblog.LOG_RELEASE, logstore.release_params(self.owner, why=why,
                                                                          owners=[owner])).fetchall()
        return [(str(r[0]), r[1], r[2]) for r in rows]
