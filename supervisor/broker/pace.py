"""Prefetch that follows the length of the jobs (a role with no `prefetch` set).

Holding more rows than threads pays for jobs shorter than a claim's round trip:
the next batch is claimed while the current one runs (W1, no-op jobs, 2 processes
x 8 threads: 6,400 jobs/s with 8 rows held, 11,600 with 16, 15,000 with 32). For
long jobs it hoards: a prefetched row waits whole jobs for its thread while
another process may sit idle. So a process holds as many rows beyond its threads
as keep that wait under ``defaults.PREFETCH_WAIT_SECONDS`` at the recent mean run
time: none for jobs of 10 ms or more, up to ``defaults.PREFETCH_PER_THREAD`` x
threads in all for jobs of a few milliseconds or less.
"""

from __future__ import annotations

from .. import defaults
from .capacity import Capacity

# Weight of the newest job in the running mean: about the last 20 jobs count.
_WEIGHT = 0.05


class Pace:
    """Sets ``capacity``'s limit from each job's run time, between ``threads`` and ``most``.

    Starts at ``threads``: jobs must show they are short before any row waits for a
    thread. Called from every worker thread without a lock: a lost update of the
    mean only delays a change of the limit by a job or two.
    """

    def __init__(self, capacity: Capacity, threads: int, most: int, *,
                 wait_seconds: float = defaults.PREFETCH_WAIT_SECONDS) -> None:
        self.capacity = capacity
        self.threads = threads
        self.most = max(most, threads)
        self.wait_seconds = wait_seconds
        self.mean = 2 * wait_seconds  # as if long: no row beyond the threads yet
        capacity.set_limit(threads)

    def running(self, seconds: float) -> None:
        """The longest-running job has run ``seconds`` so far: once that is longer than the
        mean, it counts as a job at least that long. After a run of short jobs, long ones
        would otherwise be claimed at the short jobs' pace until the first of them ends."""
        if seconds > self.mean:
            self.finished(seconds)

    def finished(self, seconds: float) -> None:
        """A job ran for ``seconds`` (whatever its outcome)."""
        mean = self.mean = self.mean + (seconds - self.mean) * _WEIGHT
        # The rows queued behind each thread wait one mean run time each.
        behind = self.wait_seconds / mean if mean > 0 else float(self.most)
        limit = min(self.most, self.threads * (1 + int(behind)))
        if limit != self.capacity.limit:
            self.capacity.set_limit(limit)
