"""Prefetch that follows the length of the jobs, and rows that never wait long for a thread.

Holding more rows than threads pays for jobs shorter than a claim's round trip:
the next batch is claimed while the current one runs (W1, no-op jobs, 2 processes
x 8 threads: 6,400 jobs/s with 8 rows held, 11,600 with 16, 15,000 with 32). It
pays for long jobs too, less: a process that holds exactly its threads claims only
once a job has ended, so the thread that ended waits the claim's round trip for its
next row (W3, 50 ms jobs on 16 threads: ~90 % of ideal). For long jobs, though,
rows held beyond the threads hoard: a prefetched row waits for a thread while another
process may sit idle. So a paced process (a role with no `prefetch` set) claims
ahead: it holds as many rows beyond its threads as its threads free within
``defaults.PREFETCH_WAIT_SECONDS`` at the recent mean run time (threads x wait /
mean, rounded down), up to ``defaults.PREFETCH_PER_THREAD`` x threads in all. A
thread that ends a job finds the next row waiting, and the slot it frees is claimed
again while the other threads run; a row beyond the threads waits about the wait at
most. The wait (50 ms) is longer than a claim's round trip because jobs end together:
a backlog claimed at once starts together, and 16 threads of 50 ms jobs that held 3
rows beyond them (a 10 ms wait) left 13 threads waiting a claim at every such end
(W3: 88-94 % of ideal; one row per thread beyond them: 95-96 %). 16 threads of 50 ms
jobs hold 16 rows more; 2 threads of 1 s jobs none (a fraction of a row is no row).

A mean follows the jobs that ended; the ones that come next may be longer (a switch
from short to long jobs, a host that stalls), and rows claimed at the short jobs'
pace then wait behind them. ``GiveBack`` bounds that wait on any host: once every
thread has been busy for ``defaults.GIVE_BACK_SECONDS`` with none ending while rows
wait, those rows go back to the queue, where a process with a free thread claims
them (this one holds no row beyond its threads until its jobs are short again).
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from ... import defaults
from .. import threads
from ..message import PgMessageProxy
from .capacity import Capacity
from .consumer import PostgresConsumer
from .fencing import Fence

log = logging.getLogger(__name__)

# Weight of the newest job in the running mean: about the last 20 jobs count.
_WEIGHT = 0.05
# GiveBack's patience at most (Pace.patience): rows are held beyond the threads only while
# the mean is under threads x PREFETCH_WAIT_SECONDS, so this binds only for many threads.
_MOST_PATIENCE = 0.1


class Pace:
    """Sets ``capacity``'s limit from each job's run time, between ``threads`` and ``most``.

    Starts at ``threads``: jobs must show they are short before any row waits for a
    thread. Called from every worker thread without a lock: a lost update of the
    mean only delays a change of the limit by a job or two. With ``follow`` off (a
    fixed prefetch) the limit stays at ``most``, except from a give-back to the next
    job's end.
    """

    def __init__(self, capacity: Capacity, threads: int, most: int, *,
                 wait_seconds: float = defaults.PREFETCH_WAIT_SECONDS, follow: bool = True) -> None:
        self.capacity = capacity
        self.threads = threads
        self.most = max(most, threads)
        self.wait_seconds = wait_seconds
        self.follow = follow
        self.mean = self.long  # no row beyond the threads yet
        # Each actor's own mean run time (the same weight): how many threads a batch wakes.
        self.actor_means: dict[str, float] = {}
        capacity.set_limit(threads if follow else self.most)

    @property
    def long(self) -> float:
        """A mean run time at which no row waits beyond the threads, with a margin: a few
        short jobs do not bring it down to a row beyond them at once."""
        return 2 * self.threads * self.wait_seconds

    def beyond(self, mean: float) -> int:
        """Rows held beyond the threads at a mean run time of ``mean``: as many as the
        threads free within the wait (each thread frees one every ``mean``)."""
        if mean <= 0:
            return self.most - self.threads
        return min(self.most - self.threads, int(self.threads * self.wait_seconds / mean))

    def patience(self) -> float:
        """How long GiveBack lets every thread run on, none ending, while rows wait: a job's
        mean run time, between ``defaults.GIVE_BACK_SECONDS`` and ``_MOST_PATIENCE``. Jobs
        that started together (a backlog claimed at once) end together, a mean run time
        later: rows claimed ahead of them are not stranded, they wait for that end; a
        spell longer than the mean says the jobs are longer than the mean. At a fixed
        prefetch the mean is not followed: ``GIVE_BACK_SECONDS``."""
        if not self.follow:
            return defaults.GIVE_BACK_SECONDS
        return min(_MOST_PATIENCE, max(defaults.GIVE_BACK_SECONDS, self.mean))

    def running(self, seconds: float) -> None:
        """The longest-running job has run ``seconds`` so far: once that is longer than the
        mean, it counts as a job at least that long. After a run of short jobs, long ones
        would otherwise be claimed at the short jobs' pace until the first of them ends."""
        if seconds > self.mean:
            self.finished(seconds)

    def gave_back(self, rows: int = 0) -> None:
        """Claimed rows found no thread in time and went back to the queue: the jobs
        ahead of them are long, whatever the mean says. No row beyond the threads until
        short jobs bring the mean down again (or, at a fixed prefetch, a job ends)."""
        self.mean = max(self.mean, self.long)
        if self.capacity.limit != self.threads:
            self.capacity.set_limit(self.threads)

    def wakes(self, messages: list[PgMessageProxy]) -> int | None:
        """How many waiting threads a claimed batch needs woken: its actors' mean run times
        over ``defaults.WAKE_SLICE_SECONDS``, at least one; None (one per message) while
        one of its actors has not run here yet. The threads awake take the rest as they
        end jobs; GiveBack wakes the others if none is taken for its look (WorkQueue.nudge)."""
        means = self.actor_means
        work = 0.0
        for message in messages:
            mean = means.get(message.actor_name)
            if mean is None:
                return None
            work += mean
        return max(1, math.ceil(work / defaults.WAKE_SLICE_SECONDS))

    def finished(self, seconds: float, actor: str | None = None) -> None:
        """A job (of ``actor``) ran for ``seconds`` (whatever its outcome)."""
        if actor is not None:
            mean = self.actor_means.get(actor)
            self.actor_means[actor] = seconds if mean is None else mean + (seconds - mean) * _WEIGHT
        if not self.follow:
            if self.capacity.limit != self.most:
                self.capacity.set_limit(self.most)
            return
        mean = self.mean = self.mean + (seconds - self.mean) * _WEIGHT
        limit = self.threads + self.beyond(mean)
        if limit != self.capacity.limit:
            self.capacity.set_limit(limit)


class GiveBack(threading.Thread):
    """Gives back the rows that wait in the worker's queue while every thread is busy
    and none has ended a job for ``patience()`` seconds (Pace.patience: the jobs' mean
    run time, at least ``after``).

    Looks every ``after`` / 2 seconds: the queue's length, how many jobs run (the
    Fence) and when one last ended; a row waits a stuck spell of ``patience()`` to
    ``patience()`` + ``after`` / 2. It takes the waiting rows out of the worker's queue as
    Dramatiq's own worker does when it stops, and hands them to their queue's
    consumer, which writes them back to pending (``PostgresConsumer.give_back``).
    Nothing on a job's own path: a saturated process of short jobs costs one look
    per interval. A look that comes late (the process got no CPU: its jobs could not
    end either) starts the spell afresh.
    """

    def __init__(self, work_queue: queue.Queue[Any], consumers: Mapping[str, Any], fence: Fence, threads: int, *,
                 after: float = defaults.GIVE_BACK_SECONDS,
                 on_give_back: Callable[[int], None] | None = None,
                 patience: Callable[[], float] | None = None) -> None:
        super().__init__(name="give-back", daemon=True)
        self.work_queue = work_queue
        self.consumers = consumers  # Dramatiq's Worker.consumers: queue name -> its consumer thread
        self.fence = fence
        self.threads = threads
        self.after = after
        self.on_give_back = on_give_back
        self.patience = patience or (lambda: after)
        self._since: float | None = None  # start of the current stuck spell, as first seen
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        # threads.py's policy: a database error is one line and the next check tries
        # again; a bug ends the process (rows would otherwise wait for ever, unseen).
        with threads.lifetime(self.name, self._halt.is_set):
            interval = self.after / 2
            due = time.monotonic() + interval
            while not self._halt.wait(max(0.0, due - time.monotonic())):
                now = time.monotonic()
                if now - due > interval:
                    self._since = None  # stalled: nothing could end meanwhile; look again
                else:
                    try:
                        self.check(now)
                    except threads.EXPECTED as exc:
                        threads.warn(log, "giving rows back", exc)
                due = now + interval

    def check(self, now: float) -> int:
        """Give back the waiting rows if the threads have been stuck for ``patience()``;
        returns how many went back. First, rows that wait while no thread took one since
        the last look wake the waiting threads (a batch wakes only the threads its
        actors' means say it needs: executor_threads.WorkQueue.nudge)."""
        nudge = getattr(self.work_queue, "nudge", None)
        if nudge is not None:
            nudge()
        stuck = self.work_queue.qsize() > 0 and self.fence.running_count() >= self.threads
        if not stuck:
            self._since = None
            return 0
        if self._since is None or self.fence.finished_at >= self._since:
            self._since = now  # a spell starts (or a job ended: it starts again)
            return 0
        if now - self._since < self.patience():
            return 0
        waited = now - self._since
        self._since = None
        return self._give_back(waited)

    def _give_back(self, waited: float) -> int:
        items: list[Any] = []
        while True:
            try:
                items.append(self.work_queue.get_nowait())
            except queue.Empty:
                break
            self.work_queue.task_done()  # taken, not run: Worker.join() must not wait for it
        by_queue: dict[str, list[Any]] = defaultdict(list)
        for item in items:
            by_queue[item.message.queue_name].append(item)
        given = 0
        for name, queued in by_queue.items():
            thread = self.consumers.get(name)
            consumer = getattr(thread, "consumer", None)
            messages = [item.message for item in queued]
            if not isinstance(consumer, PostgresConsumer) or not all(
                    isinstance(m, PgMessageProxy) for m in messages):
                self._put_back(queued)
                continue
            try:
                given += consumer.give_back(messages, waited)
            except Exception as exc:  # the database is away: they wait for a thread here instead
                log.warning("could not give back %d jobs of %s (%s)", len(messages), name, exc)
                self._put_back(queued)
        if given and self.on_give_back is not None:
            self.on_give_back(given)
        return given

    def _put_back(self, items: list[Any]) -> None:
        for item in items:
            self.work_queue.put(item)
