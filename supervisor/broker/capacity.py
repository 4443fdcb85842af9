"""How many claimed-but-unfinished messages a process may hold."""

from __future__ import annotations

import threading


class Capacity:
    """Shared by the consumers of every queue, so a process never claims more rows
    than it has threads to run them, however many queues it serves.

    Only consumers reserve and release: a claim reserves, and the consumer that
    claimed releases on ack, nack, requeue or an unused reservation.
    """

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.used = 0
        self._cond = threading.Condition()

    def set_limit(self, limit: int) -> None:
        with self._cond:
            self.limit = max(1, limit)
            self._cond.notify_all()

    def reserve(self, want: int) -> int:
        with self._cond:
            n = max(0, min(want, self.limit - self.used))
            self.used += n
            return n

    def release(self, n: int = 1) -> None:
        if n <= 0:
            return
        with self._cond:
            self.used -= n
            self._cond.notify_all()

    def wait_free(self, timeout: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self.used < self.limit, timeout)
