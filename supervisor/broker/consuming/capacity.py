"""How many claimed-but-unfinished messages a process may hold."""

from __future__ import annotations

import threading


class Capacity:
    """Shared by the consumers of every queue, so a process never claims more rows
    than it has threads to run them, however many queues it serves.

    Only consumers reserve and release: a claim reserves, and the consumer that
    claimed releases on ack, nack, requeue or an unused reservation.

    ``aside``: claimed rows whose jobs run without a thread (async actors' coroutines on
    the event loop, worker/executor_async.py). The bound grows by as many while they
    run, so a few threads can keep many coroutines in flight (their own bound is the
    role's async_limit); Pace sets ``limit``, the threads' part, alone.
    """

    def __init__(self, limit: int, *, within: Capacity | None = None) -> None:
        self.limit = max(1, limit)
        self.used = 0
        self.aside = 0
        # A bound inside another: a queue's prefetch inside its process's capacity.
        # Reserving takes from both; releasing gives back to both.
        self.within = within
        # The condition's own lock, taken bare on the per-job paths (Condition's __enter__
        # and __exit__ are Python frames around it).
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        # Threads in wait_free, the only waiters: a release with none wakes nobody (a
        # release per job, so notify_all's own work counted).
        self._waiting = 0

    def set_limit(self, limit: int) -> None:
        with self._cond:
            self.limit = max(1, limit)
            self._cond.notify_all()

    def reserve(self, want: int) -> int:
        with self._cond:
            n = max(0, min(want, self.limit + self.aside - self.used))
            self.used += n
        if self.within is not None and n:
            got = self.within.reserve(n)
            self._give_back(n - got)
            n = got
        return n

    def set_aside(self, n: int) -> None:
        """``n`` more (or, negative, fewer) claimed rows run without a thread: the bound
        grows (or shrinks) by as much, here and in the enclosing capacity."""
        with self._cond:
            self.aside += n
            self._cond.notify_all()
        if self.within is not None:
            self.within.set_aside(n)

    def release(self, n: int = 1) -> None:
        self._give_back(n)
        self.release_within(n)

    def release_within(self, n: int = 1) -> None:
        """Give back to the enclosing capacity only (this bound keeps the slot)."""
        within = self.within
        while within is not None:
            within._give_back(n)  # noqa: SLF001  (the same class: a bound inside a bound)
            within = within.within

    def release_own(self, n: int = 1) -> None:
        """Give back to this bound only (the enclosing one was given back already)."""
        self._give_back(n)

    def _give_back(self, n: int) -> None:
        if n <= 0:
            return
        with self._lock:
            self.used -= n
            if self._waiting:
                self._cond.notify_all()

    def wait_free(self, timeout: float) -> None:
        """Wait until a reserve may succeed: this bound has room, then the one it is within."""
        with self._cond:
            full = self.used >= self.limit + self.aside
            if full:
                self._waiting += 1
                try:
                    self._cond.wait_for(lambda: self.used < self.limit + self.aside, timeout)
                finally:
                    self._waiting -= 1
        if not full and self.within is not None:
            self.within.wait_free(timeout)
