"""The resource guard, run inside each worker process.

It lives in the child because its main action, pausing and resuming claims, is
an in-process call on the broker: no round trip through the master, and the
master never polls N processes with psutil. Recycling is different: a process
past max_rss or max_jobs only *asks* the master, which rolls the role one
process at a time (start a replacement, wait until it is ready, drain the old
one) so a role never recycles all at once.

memory_percent and cpu_percent are host-wide (psutil.virtual_memory() and
psutil.cpu_percent()): they protect the machine, and a process that stops
claiming lets the pressure fall. To avoid flapping, a paused process resumes
only once both are below 90% of their thresholds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psutil

from ..config import Limits

if TYPE_CHECKING:
    from ..broker import PostgresBroker

log = logging.getLogger(__name__)

RESUME_FRACTION = 0.9


@dataclass
class Reading:
    memory_percent: float
    cpu_percent: float
    rss: int
    process_cpu: float


class Guard:
    def __init__(self, limits: Limits, ask_recycle: Callable[[str], None]) -> None:
        self.limits = limits
        self.ask_recycle = ask_recycle
        self.paused_for: str | None = None
        self.recycle_asked = False
        self._proc = psutil.Process()
        self._proc.cpu_percent(None)
        psutil.cpu_percent(None)
        self.last: Reading | None = None

    def read(self) -> Reading:
        lim = self.limits
        self.last = Reading(
            memory_percent=psutil.virtual_memory().percent if lim.memory_percent else 0.0,
            cpu_percent=psutil.cpu_percent(None) if lim.cpu_percent else 0.0,
            rss=self._proc.memory_info().rss,
            process_cpu=self._proc.cpu_percent(None),
        )
        return self.last

    def over(self, r: Reading, fraction: float) -> str | None:
        lim = self.limits
        if lim.memory_percent and r.memory_percent >= lim.memory_percent * fraction:
            return f"host memory {r.memory_percent:.0f}% >= {lim.memory_percent:g}%"
        if lim.cpu_percent and r.cpu_percent >= lim.cpu_percent * fraction:
            return f"host CPU {r.cpu_percent:.0f}% >= {lim.cpu_percent:g}%"
        return None

    def check(self, broker: PostgresBroker, jobs_done: int) -> Reading:
        """Pause or resume claiming, and ask for a recycle once. Returns the reading."""
        r = self.read()
        if self.paused_for is None:
            why = self.over(r, 1.0)
            if why:
                self.paused_for = why
                broker.pause_claiming()
                log.warning("resource guard: %s; not claiming until it recovers", why)
        elif self.over(r, RESUME_FRACTION) is None:
            log.info("resource guard: recovered (%s no longer true); claiming again", self.paused_for)
            self.paused_for = None
            broker.resume_claiming()
        if not self.recycle_asked:
            lim = self.limits
            why = None
            if lim.max_rss and r.rss > lim.max_rss:
                why = f"max_rss: {r.rss >> 20}MB > {lim.max_rss >> 20}MB"
            elif lim.max_jobs and jobs_done >= lim.max_jobs:
                why = f"max_jobs: {jobs_done} jobs done >= {lim.max_jobs}"
            if why:
                self.recycle_asked = True
                log.info("asking the master to recycle this process (%s)", why)
                self.ask_recycle(why)
        return r
