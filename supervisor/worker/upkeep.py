"""The per-process upkeep thread: lease heartbeat, registry row, reaper, retention."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import defaults
from ..broker import PostgresBroker
from ..broker import results as results_sql
from ..broker import sql as jobs_sql
from ..config import Retention
from . import scheduler_sql
from .registry import Beat, Registration

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UpkeepSettings:
    heartbeat_seconds: float = defaults.HEARTBEAT_SECONDS
    reap_seconds: float = defaults.LEASE_SECONDS / 2
    retention: Retention = field(default_factory=Retention)
    prune_seconds: float = defaults.PRUNE_SECONDS
    prune_batch: int = defaults.PRUNE_BATCH
    # Batches one prune runs per kind at most; the rest waits for the next prune.
    prune_max_batches: int = 50


class Upkeep(threading.Thread):
    """One thread per worker process.

    Every beat it renews the leases of all of this process's running jobs
    with one UPDATE and refreshes its ``workers`` row. Less often (with
    jitter, so a fleet does not reap in lockstep) it returns expired leases
    of dead hosts to pending and prunes old finished jobs. Database errors
    are logged and retried on the next beat; the thread never dies of them.
    """

    def __init__(
        self,
        broker: PostgresBroker,
        registration: Registration,
        *,
        settings: UpkeepSettings,
        state: Callable[[], str],
    ) -> None:
        super().__init__(name="upkeep", daemon=True)
        self.broker = broker
        self.registration = registration
        self.settings = settings
        self.state = state
        self._halt = threading.Event()

    def beat(self) -> None:
        self.broker.leases.heartbeat()
        self.registration.beat(Beat(self.state(), self.broker.leases.count(), self.broker.jobs_done))

    def _batches(self, statement: str, **params: object) -> int:
        """Run a bounded DELETE until it comes back short: each batch commits on
        its own, so no lock is held longer than one batch takes."""
        s = self.settings
        total = 0
        for _ in range(s.prune_max_batches):
            with self.broker.pool.connection(timeout=10) as c:
                n = c.execute(statement, {**params, "limit": s.prune_batch}).rowcount
            total += n
            if n < s.prune_batch:
                break
        return total

    def prune(self) -> dict[str, int]:
        """Delete what the retention settings no longer keep; returns counts by kind."""
        r = self.settings.retention
        counts = {status: self._batches(jobs_sql.PRUNE, status=status, older_than_s=getattr(r, status))
                  for status in ("succeeded", "failed", "cancelled")}
        counts["events"] = self._batches(jobs_sql.PRUNE_EVENTS, older_than_s=r.events)
        counts["progress"] = self._batches(jobs_sql.PRUNE_PROGRESS, older_than_s=r.events)
        counts["runs"] = self._batches(scheduler_sql.PRUNE_RUNS, older_than_s=r.runs)
        counts["results"] = (self._batches(results_sql.PRUNE)
                             + self._batches(results_sql.PRUNE_OLD, older_than_s=r.results))
        self.registration.prune(max(r.succeeded, 86400))
        if any(counts.values()):
            log.info("pruned %s", ", ".join(f"{n} {kind}" for kind, n in counts.items() if n), extra={"pruned": counts})
        return counts

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        s = self.settings
        now = time.monotonic()
        next_reap = now + random.uniform(0, s.reap_seconds)
        next_prune = now + random.uniform(s.prune_seconds / 10, s.prune_seconds)
        while not self._halt.wait(s.heartbeat_seconds):
            for due, task in (("beat", self.beat), ("reap", self.broker.leases.reap_expired), ("prune", self.prune)):
                now = time.monotonic()
                if due == "reap" and now < next_reap or due == "prune" and now < next_prune:
                    continue
                try:
                    task()
                except Exception as exc:
                    log.warning("upkeep %s failed (%s); will retry", due, exc)
                if due == "reap":
                    next_reap = now + s.reap_seconds * random.uniform(0.8, 1.2)
                elif due == "prune":
                    next_prune = now + s.prune_seconds * random.uniform(0.8, 1.2)
