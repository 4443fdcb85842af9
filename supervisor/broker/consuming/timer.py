"""Wake a queue's consumers when its earliest future job becomes due (retries, delays), or
when a limit key a claim found gated opens again (a token, the next day's quota, the end
of a block: broker/consuming/gates.py)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from psycopg_pool import ConnectionPool

from .. import sql, threads
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


class _Flag(threading.Event):
    """An event whose ``set`` also sets another (the timer waits on one event for all)."""

    def __init__(self, also: threading.Event) -> None:
        super().__init__()
        self.also = also

    def set(self) -> None:
        super().set()
        self.also.set()


class DueTimer(threading.Thread):
    """One per worker process: keeps a deadline per served queue and sets that
    queue's wake-up event (the one NOTIFY sets) when it passes.

    The deadlines come from one query over every served queue (``sql.NEXT_DUE``:
    queue -> seconds until its earliest future run_at), run again when
    ``refresh`` is set (a NOTIFY '@queue', or a queue newly served), after each
    wake-up it gives, and every ``REFRESH_SECONDS``. Gates (``due_in``: a claim's
    or a peer's NOTIFY '~queue seconds') are kept apart: no query knows them.
    """

    def __init__(self, pool: ConnectionPool) -> None:
        super().__init__(name="due-timer", daemon=True)
        self.pool = pool
        self._poke = threading.Event()  # what the thread waits on: a refresh or a new gate
        self.refresh = _Flag(self._poke)
        self._wakeups: dict[str, threading.Event] = {}
        self._deadlines: dict[str, float] = {}
        self._gates: dict[str, float] = {}
        self._lock = threading.Lock()
        self._halt = False
        # Told each queue whose deadline passed, before its consumers are woken (gates.py).
        self.on_fire: Callable[[str], None] | None = None

    def serve(self, queue: str, listener: Wakeups) -> threading.Event:
        """Time ``queue`` too; returns its wake-up event (set by NOTIFY 'queue' and by
        this timer). NOTIFY '@queue' refreshes the timer."""
        wakeup = listener.event_for(queue)
        listener.watch(LATER + queue, self.refresh)
        with self._lock:
            self._wakeups[queue] = wakeup
        self.refresh.set()
        return wakeup

    def due_in(self, queue: str, seconds: float) -> None:
        """Wake ``queue``'s consumers ``seconds`` from now (a gated limit key opens then),
        unless a gate of the queue opens sooner; a queue this process does not serve is
        ignored."""
        at = time.monotonic() + max(0.0, seconds) + SLACK_SECONDS
        with self._lock:
            if queue not in self._wakeups:
                return
            current = self._gates.get(queue)
            if current is not None and current <= at:
                return
            self._gates[queue] = at
        self._poke.set()

    def next_due(self, queues: list[str]) -> dict[str, float]:
        with self.pool.connection(timeout=10) as c:
            return dict(c.execute(sql.NEXT_DUE, {"queues": queues}).fetchall())

    def stop(self) -> None:
        self._halt = True
        self.refresh.set()

    def _fire_due(self, now: float) -> bool:
        """Wake the queues whose deadline passed; whether any was a row's (so what comes
        next for the queue is not known until the deadlines are read again)."""
        with self._lock:
            opened = [q for q, at in self._gates.items() if at <= now]
            for queue in opened:
                del self._gates[queue]
        fired = [q for q, at in self._deadlines.items() if at <= now]
        for queue in fired:
            del self._deadlines[queue]
        for queue in {*opened, *fired}:
            if self.on_fire is not None:
                self.on_fire(queue)
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
            self._poke.clear()
            now = time.monotonic()
            if self._fire_due(now):
                self.refresh.set()  # what comes next for those queues is not known yet
            reload_due = self.refresh.is_set() or now >= next_refresh
            if reload_due and now >= last_reload + MIN_GAP_SECONDS:
                self.refresh.clear()
                last_reload = now
                next_refresh = self._reload_or_retry()
                continue
            with self._lock:
                gates = list(self._gates.values())
            until = min([next_refresh, *self._deadlines.values(), *gates]) - now
            if reload_due:  # the event is set, so waiting on it would not block
                time.sleep(max(0.0, min(until, last_reload + MIN_GAP_SECONDS - now)))
            elif until > 0:
                self._poke.wait(until)
