"""The per-process upkeep thread: lease heartbeat, registry row, reaper, retention."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .. import db, defaults
from ..broker import PostgresBroker
from ..broker import sql as jobs_sql
from .registry import Beat, Registration

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UpkeepSettings:
    heartbeat_seconds: float = defaults.HEARTBEAT_SECONDS
    reap_seconds: float = defaults.LEASE_SECONDS / 2
    retention_seconds: float = defaults.RETENTION_SECONDS
    prune_seconds: float = defaults.PRUNE_SECONDS


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

    def prune(self) -> int:
        with self.broker.pool.connection(timeout=10) as c:
            deleted = db.one(c.execute(
                jobs_sql.PRUNE, {"older_than_s": self.settings.retention_seconds, "limit": 5000}
            ))
        self.registration.prune(max(self.settings.retention_seconds, 86400))
        if deleted:
            log.info("pruned %d finished jobs older than %.0fs", deleted, self.settings.retention_seconds)
        return int(deleted)

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
