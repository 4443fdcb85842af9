"""Prefetch that follows the length of the jobs (a role with no `prefetch` set).

Holding more rows than threads pays only for jobs shorter than a claim's round
trip: the next batch is claimed while the current one runs (measured: W1, no-op
jobs, 2 processes x 8 threads, 6,400 -> 11,600 jobs/s). For long jobs it hoards:
a prefetched row waits a whole job for its thread while another process may sit
idle. So the extra rows are allowed only while the recent mean run time is short.
"""

from __future__ import annotations

from .. import defaults
from .capacity import Capacity

# Weight of the newest job in the running mean: about the last 20 jobs count.
_WEIGHT = 0.05


class Pace:
    """Sets ``capacity``'s limit to ``threads`` or ``most`` from each job's run time.

    Starts at ``threads``: jobs must show they are short before any row waits for a
    thread. Called from every worker thread without a lock: a lost update of the mean
    only delays a switch by a job or two. Switching back needs twice the threshold,
    so a mean hovering at it does not flip the limit at every job.
    """

    def __init__(self, capacity: Capacity, threads: int, most: int, *,
                 short_seconds: float = defaults.SHORT_JOB_SECONDS) -> None:
        self.capacity = capacity
        self.threads = threads
        self.most = max(most, threads)
        self.short_seconds = short_seconds
        self.mean = 10 * short_seconds
        self.short = False
        capacity.set_limit(threads)

    def finished(self, seconds: float) -> None:
        """A job ran for ``seconds`` (whatever its outcome)."""
        mean = self.mean = self.mean + (seconds - self.mean) * _WEIGHT
        if not self.short and mean < self.short_seconds:
            self.short = True
            self.capacity.set_limit(self.most)
        elif self.short and mean > 2 * self.short_seconds:
            self.short = False
            self.capacity.set_limit(self.threads)

    @property
    def limit(self) -> int:
        return self.most if self.short else self.threads
