"""The per-process upkeep thread: lease heartbeat, registry row, reaper, retention."""

from __future__ import annotations

import logging
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from .broker import PostgresBroker
from .queries import jobs as jobs_sql
from .queries import workers as workers_sql

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UpkeepSettings:
    heartbeat_seconds: float = 10.0
    reap_seconds: float = 15.0
    retention_seconds: float = 7 * 24 * 3600.0
    prune_seconds: float = 300.0


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
        *,
        role: str,
        queues: list[str],
        settings: UpkeepSettings,
        state: Callable[[], str] = lambda: "running",
        in_flight: Callable[[], int] = lambda: 0,
    ) -> None:
        super().__init__(name="upkeep", daemon=True)
        self.broker = broker
        self.role = role
        self.queues = queues
        self.settings = settings
        self.state = state
        self.in_flight = in_flight
        self._halt = threading.Event()
        self._proc = psutil.Process()
        self._proc.cpu_percent(None)
        self.beats = 0

    def register(self) -> None:
        with self.broker.pool.connection(timeout=30) as c:
            c.execute(
                workers_sql.REGISTER,
                {"id": self.broker.owner, "host": socket.gethostname(), "pid": self._proc.pid,
                 "role": self.role, "queues": self.queues},
            )

    def beat(self) -> None:
        self.broker.heartbeat()
        with self.broker.pool.connection(timeout=10) as c:
            c.execute(
                workers_sql.BEAT,
                {"id": self.broker.owner, "state": self.state(), "rss": self._proc.memory_info().rss,
                 "cpu": self._proc.cpu_percent(None), "in_flight": self.in_flight(),
                 "done": self.broker.jobs_done},
            )
        self.beats += 1

    def reap(self) -> None:
        self.broker.reap_expired()

    def prune(self) -> int:
        with self.broker.pool.connection(timeout=10) as c:
            deleted = c.execute(
                jobs_sql.PRUNE, {"older_than_s": self.settings.retention_seconds, "limit": 5000}
            ).fetchone()[0]
            c.execute(workers_sql.PRUNE, {"older_than_s": max(self.settings.retention_seconds, 86400)})
        if deleted:
            log.info("pruned %d finished jobs older than %.0fs", deleted, self.settings.retention_seconds)
        return deleted

    def mark_stopped(self, state: str = "stopped") -> None:
        try:
            with self.broker.pool.connection(timeout=5) as c:
                c.execute(workers_sql.STOPPED, {"id": self.broker.owner, "state": state})
        except Exception as exc:
            log.warning("could not mark worker row stopped: %s", exc)

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        s = self.settings
        now = time.monotonic()
        next_reap = now + random.uniform(0, s.reap_seconds)
        next_prune = now + random.uniform(s.prune_seconds / 10, s.prune_seconds)
        while not self._halt.wait(s.heartbeat_seconds):
            for due, task in (("beat", self.beat), ("reap", self.reap), ("prune", self.prune)):
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
