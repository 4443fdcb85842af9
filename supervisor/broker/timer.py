"""Wake a queue's consumers when its earliest future job becomes due (retries, delays)."""

from __future__ import annotations

import logging
import threading
import time

from psycopg_pool import ConnectionPool

from . import sql, threads
from .listener import Wakeups

log = logging.getLogger(__name__)

# NOTIFY payload prefix for "a row of this queue is due later" (sql.FINISH for a retry, the insert trigger).
LATER = "@"
# Fire this long after the due time: the claim compares run_at with the server's
# clock, so firing a hair early would find nothing and need another round.
SLACK_SECONDS = 0.001
# Reloads come from NOTIFY; under a flood of delayed sends, at most one per gap
# (deadlines still fire on time meanwhile).
MIN_GAP_SECONDS = 0.01
# Without any NOTIFY (the listener was away), look again this often. Consumers
# still poll on their own, so this only bounds how late a timer can be.
REFRESH_SECONDS = 30.0


class DueTimer(threading.Thread):
    """One per worker process: keeps a deadline per served queue and sets that
    queue's wake-up event (the one NOTIFY sets) when it passes.

    The deadlines come from one query over every served queue (``sql.NEXT_DUE``:
    queue -> seconds until its earliest future run_at), run again when
    ``refresh`` is set (a NOTIFY '@queue', or a queue newly served), after each
    wake-up it gives, and every ``REFRESH_SECONDS``.
    """

    def __init__(self, pool: ConnectionPool) -> None:
        super().__init__(name="due-timer", daemon=True)
        self.pool = pool
        self.refresh = threading.Event()
        self._wakeups: dict[str, threading.Event] = {}
        self._deadlines: dict[str, float] = {}
        self._lock = threading.Lock()
        self._halt = False

    def serve(self, queue: str, listener: Wakeups) -> threading.Event:
        """Time ``queue`` too; returns its wake-up event (set by NOTIFY 'queue' and by
        this timer). NOTIFY '@queue' refreshes the timer."""
        wakeup = listener.event_for(queue)
        listener.watch(LATER + queue, self.refresh)
        with self._lock:
            self._wakeups[queue] = wakeup
        self.refresh.set()
        return wakeup

    def next_due(self, queues: list[str]) -> dict[str, float]:
        with self.pool.connection(timeout=10) as c:
            return dict(c.execute(sql.NEXT_DUE, {"queues": queues}).fetchall())

    def stop(self) -> None:
        self._halt = True
        self.refresh.set()

    def _fire_due(self, now: float) -> bool:
        fired = [q for q, at in self._deadlines.items() if at <= now]
        for queue in fired:
            del self._deadlines[queue]
            self._wakeups[queue].set()
        return bool(fired)

    def _reload(self) -> None:
        with self._lock:
            queues = list(self._wakeups)
        due = self.next_due(queues)
        # Counted from when the answer arrived, which is after the server read its
        # clock: a deadline may be a little late, never early.
        answered = time.monotonic()
        self._deadlines = {q: answered + max(0.0, s) + SLACK_SECONDS for q, s in due.items()}

    def _reload_or_retry(self) -> float:
        """Reload the deadlines; return when to reload at the latest."""
        try:
            self._reload()
            return time.monotonic() + REFRESH_SECONDS
        except threads.EXPECTED as exc:  # the consumers' own poll covers the gap
            if not self._halt:
                threads.warn(log, "reading the next due jobs", exc, "retrying in 1s")
            return time.monotonic() + 1.0

    def run(self) -> None:
        with threads.lifetime(self.name, lambda: self._halt):
            self._run()

    def _run(self) -> None:
        next_refresh = 0.0
        last_reload = -MIN_GAP_SECONDS
        while not self._halt:
            now = time.monotonic()
            if self._fire_due(now):
                self.refresh.set()  # what comes next for those queues is not known yet
            reload_due = self.refresh.is_set() or now >= next_refresh
            if reload_due and now >= last_reload + MIN_GAP_SECONDS:
                self.refresh.clear()
                last_reload = now
                next_refresh = self._reload_or_retry()
                continue
            until = min([next_refresh, *self._deadlines.values()]) - now
            if reload_due:  # the event is set, so waiting on it would not block
                time.sleep(max(0.0, min(until, last_reload + MIN_GAP_SECONDS - now)))
            elif until > 0:
                self.refresh.wait(until)
