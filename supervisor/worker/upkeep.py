"""The per-process upkeep thread: lease heartbeat, registry row, reaper, retention,
and the jobs table's vacuum trigger."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

from .. import audit, db, defaults
from ..broker import PostgresBroker, threads
from ..broker import results as results_sql
from ..broker import sql as jobs_sql
from ..broker.sql import fair, jobkeys, joblog, slots
from ..broker.sql import limiter as limiter_sql
from ..broker.sql import workflows as workflows_sql
from ..config import Retention
from ..registry import Beat, Registration
from . import liveness, scheduler_sql

log = logging.getLogger(__name__)


def vacuum_due(conn: psycopg.Connection, *, dead_rows: int = defaults.VACUUM_DEAD_ROWS,
               min_seconds: float = defaults.VACUUM_MIN_SECONDS) -> int | None:
    """The dead tuples of jobs if a vacuum is due: at least ``dead_rows`` of them, no
    (auto)vacuum in the last ``min_seconds`` and none running; else None.

    Autovacuum visits a database once a minute at most (autovacuum_naptime), and not at
    all where it is off; at a few thousand jobs/s the claim index gathers a hundred
    thousand dead entries by then, which every claim steps over."""
    row = conn.execute(jobs_sql.JOBS_VACUUM_DUE, {"dead_rows": dead_rows, "min_s": min_seconds}).fetchone()
    return None if row is None else int(row[0])


@dataclass(frozen=True)
class UpkeepSettings:
    heartbeat_seconds: float = defaults.HEARTBEAT_SECONDS
    reap_seconds: float = defaults.LEASE_SECONDS / 2
    retention: Retention = field(default_factory=Retention)
    prune_seconds: float = defaults.PRUNE_SECONDS
    prune_batch: int = defaults.PRUNE_BATCH
    vacuum_dead_rows: int = defaults.VACUUM_DEAD_ROWS  # 0: leave jobs to autovacuum
    vacuum_check_seconds: float = defaults.VACUUM_CHECK_SECONDS
    vacuum_min_seconds: float = defaults.VACUUM_MIN_SECONDS

    @property
    def prune_every(self) -> float:
        """Seconds between prunes: often enough that the shortest retention is
        overshot by a fraction of itself (the table stays flat), at most prune_seconds."""
        shortest: float = min(vars(self.retention).values())
        return max(defaults.PRUNE_MIN_SECONDS, min(self.prune_seconds, shortest / defaults.PRUNE_PER_RETENTION))


class Upkeep(threading.Thread):
    """One thread per worker process.

    Every beat it renews the leases of all of this process's running jobs
    with one UPDATE and refreshes its ``workers`` row; every quarter beat it releases
    the jobs of processes found dead (liveness.py). Less often (with
    jitter, so a fleet does not reap in lockstep) it returns expired leases
    of dead hosts to pending and prunes old finished jobs. Every few seconds
    it checks whether jobs needs a vacuum and, if so, runs it on a thread of
    its own (a vacuum can take seconds; the beats must not wait for it); so
    does the prune, on a connection of its own.
    Database errors are logged and retried on the next beat; the thread never
    dies of them. Any other error ends the process (see broker/threads.py).
    """

    def __init__(
        self,
        broker: PostgresBroker,
        registration: Registration,
        *,
        settings: UpkeepSettings,
        state: Callable[[], str],
        paused: Callable[[], str | None] = lambda: None,
    ) -> None:
        super().__init__(name="upkeep", daemon=True)
        self.broker = broker
        self.registration = registration
        self.settings = settings
        self.state = state
        self.paused = paused  # why the process does not claim (its beat carries it to the registry)
        self._halt = threading.Event()
        self._vacuum: threading.Thread | None = None
        self._prune: threading.Thread | None = None

    def beat(self) -> None:
        self.broker.leases.heartbeat()
        self.registration.beat(Beat(self.state(), self.broker.leases.count(), self.broker.jobs_done,
                                    self.paused()))

    def sweep_slots(self) -> int:
        """Hand the free slots of keys with parked jobs to them (sql/slots.py: the window a
        claim's SKIP LOCKED leaves, and slots whose job ended by a path that writes no key);
        one probe of an empty table when nothing is parked. How many jobs it handed."""
        with self.broker.pool.connection(timeout=10) as c:
            row = c.execute(slots.LOG_SWEEP_BLOCKED).fetchone()
        return int(row[0]) if row else 0

    def vacuum(self) -> int | None:
        """Analyze jobs if the planner's row count is stale, then vacuum it if due (see
        vacuum_due); returns the dead tuples the vacuum found, or None.

        One process at a time: a vacuum takes a lock that conflicts with itself, and
        VACUUM_JOBS skips the table instead of waiting for it. Never blocks a claim: see
        sql.VACUUM_JOBS."""
        s = self.settings
        with self.broker.pool.connection(timeout=10) as c:
            c.execute(jobs_sql.PRUNE_SLOTS, {"older_than_s": defaults.SLOT_KEEP_SECONDS})
            stale = c.execute(jobs_sql.JOBS_STATS_STALE, {"min_rows": defaults.STATS_MIN_ROWS}).fetchone()
            dead = vacuum_due(c, dead_rows=s.vacuum_dead_rows, min_seconds=s.vacuum_min_seconds)
        if stale is not None:
            # On the broker's connections: a sampled ANALYZE takes 0.1-0.3 s, and every
            # process finds the statistics stale at once when a drain starts (on one of
            # its own, four workers held a third connection each then: the DESIGN's two).
            self._maintain(jobs_sql.ANALYZE_JOBS, "analyzed jobs (%d rows the planner did not count)", stale[0],
                           key="analyzed", own_connection=False)
        if dead is not None:
            self._maintain(jobs_sql.VACUUM_JOBS, "vacuumed jobs (%d dead tuples)", dead, key="vacuumed")
        self._log_tables()
        return dead

    def _log_tables(self) -> None:
        """The job log's leases and cursors (storage "log"): the cursor rows no claim reads go
        (a bounded batch), the fair keys' floors no turn reads (sql/fair.py), and the narrow tables are vacuumed once their dead tuples pile up
        (sql/joblog.py). Where the log is unused, two short statements that find nothing."""
        s = self.settings
        with self.broker.pool.connection(timeout=10) as c:
            c.execute(joblog.LOG_PRUNE_CURSORS, {"limit": s.prune_batch})
            c.execute(fair.LOG_PRUNE_FLOORS, {"idle_s": fair.FLOOR_IDLE_SECONDS})
            row = c.execute(joblog.LOG_VACUUM_DUE, {"dead_rows": defaults.LOG_VACUUM_DEAD_ROWS,
                                                    "min_s": s.vacuum_min_seconds}).fetchone()
        if row is not None:
            self._maintain(joblog.VACUUM_LOG, "vacuumed the job log's leases and cursors (%d dead tuples)", row[0],
                           key="vacuumed_log")

    def _maintain(self, statement: str, what: str, rows: int, *, key: str, own_connection: bool = True) -> None:
        started = time.monotonic()
        # A connection of its own for the seconds a vacuum runs (one process of the fleet at
        # a time): the broker's few connections are for claims, acks and heartbeats.
        with (db.connect(self.broker.url, name=db.MAINTENANCE_NAME) if own_connection
              else self.broker.pool.connection(timeout=10)) as c:
            c.execute(statement, prepare=False)
        log.info(what + " in %.1fs", rows, time.monotonic() - started, extra={key: rows})

    def start_vacuum(self) -> None:
        """Check (and vacuum) on a thread of its own, one at a time per process."""
        if self.settings.vacuum_dead_rows > 0:
            self._vacuum = self._apart(self._vacuum, "vacuum", self.vacuum)

    def _apart(self, last: threading.Thread | None, what: str, task: Callable[[], object]) -> threading.Thread:
        """``task`` on a thread of its own (``upkeep-WHAT``), unless ``last``, the thread it
        had last, is still at it: one at a time per process. A database error is one
        warning line (the next round tries again); any other ends the process (threads.py)."""
        if last is not None and last.is_alive():
            return last

        def run() -> None:
            with threads.lifetime(f"upkeep-{what}", self._halt.is_set):
                try:
                    task()
                except threads.EXPECTED as exc:
                    threads.warn(log, f"upkeep {what}", exc)

        thread = threading.Thread(target=run, name=f"upkeep-{what}", daemon=True)
        thread.start()
        return thread

    def _batches(self, conn: psycopg.Connection, statement: str, **params: object) -> int:
        """Run a bounded DELETE until it comes back short: each batch commits on
        its own, so no lock is held longer than one batch takes. After each batch it
        waits as long as the batch took: a prune of a busy table (tens of batches) takes
        at most half of one database session's time, and none of its snapshots is
        open between batches (back-to-back batches on the broker's connections made claims
        and acks seconds late: bench/README.md, "Retention off the claim path")."""
        size = self.settings.prune_batch
        total = 0
        while True:
            started = time.monotonic()
            n = conn.execute(statement, {**params, "limit": size}).rowcount
            total += n
            if n < size or self._halt.wait(time.monotonic() - started):
                return total

    def _history(self, conn: psycopg.Connection, status: str, older_than_s: float) -> int:
        """Finished jobs of one status past their retention: days made ahead, whole days
        dropped, then the rows no whole day covers (sql/history.py)."""
        dropped = 0
        try:
            for days in range(jobs_sql.DAYS_AHEAD + 1):
                with conn.transaction():
                    conn.execute(jobs_sql.ADD_DAY, {"status": status, "days": days})
            with conn.transaction():
                row = conn.execute(jobs_sql.DROP_DAYS, {"status": status, "older_than_s": older_than_s}).fetchone()
                dropped = int(row[1]) if row else 0
        except psycopg.errors.LockNotAvailable:
            log.info("job history of %s: a reader held a partition; its days are kept until the next prune", status)
        return dropped + self._batches(
            conn, jobs_sql.PRUNE_ROWS, status=status, older_than_s=older_than_s)

    def _log_days(self, conn: psycopg.Connection, older_than_s: float) -> int:
        """The job log's days: made ahead, and those past the retention of succeeded jobs
        dropped whole (sql/joblog.py); how many log rows went."""
        try:
            for days in range(jobs_sql.DAYS_AHEAD + 1):
                with conn.transaction():
                    conn.execute(joblog.LOG_ADD_DAY, {"days": days})
            with conn.transaction():
                row = conn.execute(joblog.LOG_DROP_DAYS, {"older_than_s": older_than_s}).fetchone()
            with conn.transaction():
                conn.execute(joblog.LOG_SUMMARIZE_DONE)
            return int(row[1]) if row else 0
        except psycopg.errors.LockNotAvailable:
            log.info("job log: a reader held a day; its days are kept until the next prune")
            return 0

    def _keys(self, conn: psycopg.Connection) -> int:
        """The dedupe keys whose job ended (sql/jobkeys.py, 052): job_keys read once through in
        key order, a bounded batch a statement, each followed by a wait as long as it took
        (as ``_batches``); how many went. Nothing depends on it but job_keys' size: a taker
        takes over a key whose holder ended."""
        total, after = 0, None
        while True:
            started = time.monotonic()
            row = conn.execute(jobkeys.PRUNE_KEYS, {"after": after, "limit": self.settings.prune_batch}).fetchone()
            pruned, after = (0, None) if row is None else (int(row[0]), row[1])
            total += pruned
            if after is None or self._halt.wait(time.monotonic() - started):
                return total

    def prune(self) -> dict[str, int]:
        """Delete what the retention settings no longer keep; returns counts by kind."""
        r = self.settings.retention
        # A connection of its own for the seconds a prune of a busy table takes: on the
        # broker's two, claims and acks queued behind it.
        with db.connect(self.broker.url, name=db.MAINTENANCE_NAME) as c:
            counts = {status: self._history(c, status, getattr(r, status))
                      for status in ("succeeded", "failed", "cancelled")}
            counts["log"] = self._log_days(c, r.succeeded)
            counts["keys"] = self._keys(c)
            counts["events"] = self._batches(c, jobs_sql.PRUNE_EVENTS, older_than_s=r.events)
            counts["progress"] = self._batches(c, jobs_sql.PRUNE_PROGRESS, older_than_s=r.events)
            counts["runs"] = self._batches(c, scheduler_sql.PRUNE_RUNS, older_than_s=r.runs)
            counts["results"] = (self._batches(c, results_sql.PRUNE)
                                 + self._batches(c, results_sql.PRUNE_OLD, older_than_s=r.results))
            counts["audit"] = self._batches(c, audit.PRUNE, older_than_s=r.audit)
            # finished workflows by their state's retention, as their steps' jobs (steps counted)
            counts["workflow steps"] = sum(self._batches(c, workflows_sql.PRUNE, state=state,
                                                         older_than_s=getattr(r, state))
                                           for state in ("succeeded", "failed", "cancelled"))
            for kind, statement in limiter_sql.PRUNES.items():  # past their TTL: already read as absent
                counts[kind] = self._batches(c, statement)
        self.registration.prune(max(r.succeeded, 86400))
        if any(counts.values()):
            log.info("pruned %s", ", ".join(f"{n} {kind}" for kind, n in counts.items() if n), extra={"pruned": counts})
        return counts

    def start_prune(self) -> None:
        """Prune on a thread of its own, one at a time per process: a prune of a busy
        table takes seconds, and the beats must not wait for it."""
        self._prune = self._apart(self._prune, "prune", self.prune)

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        with threads.lifetime(self.name, self._halt.is_set):
            self._run()

    def _run(self) -> None:
        s = self.settings
        now = time.monotonic()
        # Each task's next due time; the first reap and prune are spread at random
        # (with jitter after), so a fleet started together does not act in lockstep.
        due = {"beat": now + s.heartbeat_seconds, "reap": now + random.uniform(0, s.reap_seconds),
               "prune": now + random.uniform(s.prune_every / 10, s.prune_every),
               "vacuum": now + random.uniform(0, s.vacuum_check_seconds),
               "dead": now + random.uniform(0, s.heartbeat_seconds / 4),
               "slots": now + random.uniform(0, slots.SWEEP_SECONDS)}
        tasks: dict[str, Callable[[], object]] = {
            "beat": self.beat, "reap": self.broker.leases.reap_expired, "prune": self.start_prune,
            "vacuum": self.start_vacuum, "dead": lambda: liveness.release_dead(self.broker.leases, self.registration),
            "slots": self.sweep_slots}
        every = {"beat": s.heartbeat_seconds, "reap": s.reap_seconds, "prune": s.prune_every,
                 "vacuum": s.vacuum_check_seconds, "dead": s.heartbeat_seconds / 4, "slots": slots.SWEEP_SECONDS}
        while not self._halt.wait(max(0.0, min(due.values()) - time.monotonic())):
            for name, task in tasks.items():
                now = time.monotonic()
                if now < due[name]:
                    continue
                try:
                    task()
                except threads.EXPECTED as exc:
                    threads.warn(log, f"upkeep {name}", exc)
                jitter = 1.0 if name == "beat" else random.uniform(0.8, 1.2)
                due[name] = now + every[name] * jitter
