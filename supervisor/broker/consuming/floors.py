"""Where a process's next claim of a queue starts reading: its claim floors.

Under a pinned xmin horizon (a transaction left open, a long REPEATABLE READ report, a
replica's hot_standby_feedback) vacuum removes nothing, and the claim index keeps an
entry for every row claimed since the pin: a claim that reads a level from its start
passes over all of them, and each costs a heap visit (measured: a claim of 20 rows
read 60,000 entries, 14 ms, after 3,000 claims under a pin). So each process remembers,
per queue and priority level, the run_at of the last row it claimed; its next claims
start there, less ``SLACK_SECONDS``, and pass over only what was claimed since.

A runnable row behind a floor is a straggler, and the floors are only a hint: a claim
with no floors (a sweep) reads every level from its start. The process's
``StragglerProbe`` asks every ``SWEEP_SECONDS`` (less often while its rounds are slow:
``PROBE_SHARE``), on its own thread, with one of the pool's connections,
whether any runnable row waits behind a floor (``sql.STRAGGLERS``), and only then makes
the queue's next claim sweep: under a pinned horizon that question costs what a sweep
costs (65 ms after 45 s of a 1,500 jobs/s stream, where a floored claim takes 3 ms), but
no claim waits for it. Without a probe (a process that has not started one, or a queue
of more levels than the claim reads one by one) the claims sweep every
``SWEEP_SECONDS`` (less often while sweeps are slow: ``SWEEP_SHARE``). A claim also sweeps at
a process's first claim of a queue, after it gave rows back, and when any process gave
rows back (NOTIFY '!queue': a requeue keeps a row's run_at, its place in line). The
stragglers: a row whose enqueue committed more than the slack after its run_at (the
run_at of a row enqueued inside a long transaction is that transaction's start), and a
row another process's claim locked and then rolled back. Rows that come back by lease
loss, retry or an operator's retry get run_at = now(), after every floor.

The keyed part of the claim (sql/flow.py) reads waiting rows from a floor of its own, one
per queue: the oldest waiting row's run_at as the probe last read it, less the slack
(``waiting_floor``); a reset drops it, and until the next reading the keyed claims read
every waiting row.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from psycopg_pool import ConnectionPool

from ... import db
from .. import sql, threads
from .gates import NO_FLOOR

log = logging.getLogger(__name__)

# Rows committed up to this long after their run_at are found by every claim.
SLACK_SECONDS = 1.0
# ... while the database's xmin horizon moves. While a transaction holds it back longer than
# SLACK_SECONDS (a pin, a long report), the index entries of rows claimed in the slack are
# dead but cannot be marked so, and every claim visits each one's heap tuple: at 6,000
# jobs/s a slack of 1 s made a claim read ~180 buffers where it read ~25, +50-60 % server CPU
# per row claimed, flat over the pin's age (bench/pin_statements.py; 0.1 s: +5-15 %). The
# probe watches the horizon and the claims then take this slack; rows committed later than
# it after their run_at are the probe's to find (2 s at most), as are those of the long
# transactions themselves.
HELD_SLACK_SECONDS = 0.1
# A sweep at least this often, for the stragglers.
SWEEP_SECONDS = 2.0
# ... and at most this share of the claim thread's time: the next sweep comes no sooner
# than the last one's duration divided by it. A sweep stalls the queue's claims while it
# runs, and under a pinned horizon it reads every entry claimed since the pin (65 ms after
# 45 s of a 1,500 jobs/s stream, where a floored claim took 3 ms): every 2 s, it made the
# claim's p99 and enqueue-to-start p99 grow with the pin's age (bench/pressure.py). At
# 0.5 % the jobs that wait behind sweeps stay under the p99; a cheap sweep (a few ms) keeps
# the 2 s, so stragglers wait longer only while sweeps are slow (13 s behind a 65 ms one).
SWEEP_SHARE = 0.005
# Where sql.CLAIM's rows carry their priority and run_at (after the message's columns), and
# whether the row waited for a limit key: those are read key by key (sql/flow.py), never
# from a floor, and move none.
PRIORITY_COLUMN, RUN_AT_COLUMN, KEYED_COLUMN = 10, 11, 12

SWEEP: dict[str, Any] = {"floor_levels": None, "floor_at": None, "kfloor": NO_FLOOR}
# A probe's "no straggler" stands this many of its rounds' intervals: a probe that stopped
# answering (the database away, the thread gone) lets the claims sweep on the clock again.
PROBE_VALID_ROUNDS = 3
PROBE_VALID_SECONDS = PROBE_VALID_ROUNDS * SWEEP_SECONDS
# The probe's share of one connection of the worker's pool: its next round comes no sooner
# than the last one's duration divided by it. Under a pinned horizon a round reads every
# entry claimed since the pin below the floors (150-350 ms a round 60-90 s into a pin at
# 4,000 jobs/s), and every 2 s it held one of the two connections claims and acks share
# 10-17 % of the time. At 5 % stragglers wait up to 7 s then, not 2 (cheap rounds keep 2 s).
PROBE_SHARE = 0.05
# A queue with more floor levels than this is swept on the clock, not probed: the claim
# reads only its first levels one by one (sql/claiming.py's _LEVELS_ONE_BY_ONE).
LEVELS_PROBED = 16
# NOTIFY payload prefix for "rows of this queue went back in line" (sql.FINISH's requeue).
REQUEUED = "!"


class ClaimFloors:
    """Per queue: priority level -> the run_at of the last row claimed, and when the
    queue was last swept. Thread-safe: a queue's consumer claims, and outcomes (a
    requeue) and the listener (NOTIFY '!queue') reset."""

    def __init__(self, *, slack: float = SLACK_SECONDS, sweep_every: float = SWEEP_SECONDS,
                 clock: Callable[[], float] = time.monotonic, held_slack: float = HELD_SLACK_SECONDS) -> None:
        self.slack = self.moving_slack = timedelta(seconds=slack)
        self.held_slack = timedelta(seconds=min(slack, held_slack))
        self.sweep_every = sweep_every
        self.clock = clock
        self._floors: dict[str, dict[int, datetime]] = {}
        self._swept: dict[str, float] = {}
        self._every: dict[str, float] = {}  # per queue: seconds to the next sweep (SWEEP_SHARE)
        self._probed: dict[str, tuple[float, float]] = {}  # per queue: when a probe last found none, for how long
        # per queue: the waiting floor the probe read (the oldest waiting row's run_at), when, for how long
        self._waiting: dict[str, tuple[datetime, float, float]] = {}
        self._resets: dict[str, int] = {}  # per queue: resets so far (a probe's reading older than one is void)
        self._lock = threading.Lock()

    def params(self, queue: str) -> tuple[dict[str, Any], bool]:
        """sql.CLAIM's floor parameters for the next claim of ``queue``, and whether it is
        a sweep (no floors)."""
        with self._lock:
            floors = self._floors.get(queue)
            swept = self._swept.get(queue)
            now = self.clock()
            probed = self._probed.get(queue)
            on_the_clock = probed is None or now - probed[0] > probed[1]  # no probe answers
            kfloor = self._waiting_floor(queue, now)
            if not floors or swept is None or (on_the_clock and now - swept >= self._every.get(queue, self.sweep_every)):
                return {**SWEEP, "kfloor": kfloor}, True
            return {**self._floor_params(floors), "kfloor": kfloor}, False

    def _waiting_floor(self, queue: str, now: float) -> Any:
        """Where the keyed part reads the queue's waiting rows from: the probe's reading less
        the slack while it stands, else every row (NO_FLOOR)."""
        waiting = self._waiting.get(queue)
        if waiting is None or now - waiting[1] > waiting[2]:
            return NO_FLOOR
        return waiting[0] - self.slack

    def resets(self, queue: str) -> int:
        """How many times the queue was reset: a probe notes it before it reads."""
        with self._lock:
            return self._resets.get(queue, 0)

    def waiting_floor(self, queue: str, oldest: datetime, resets: int, valid_s: float = PROBE_VALID_SECONDS) -> None:
        """The probe's reading of the queue's oldest waiting row (sql.WAITING_FLOOR_AT), read
        after ``resets`` resets: its keyed claims read waiting rows from there for
        ``valid_s``, unless a reset came since (a row requeued during the read may be older)."""
        with self._lock:
            if self._resets.get(queue, 0) == resets:
                self._waiting[queue] = (oldest, self.clock(), valid_s)

    def _floor_params(self, floors: dict[int, datetime]) -> dict[str, Any]:
        levels = list(floors)
        return {"floor_levels": db.array_text(levels),
                "floor_at": db.array_text([(floors[p] - self.slack).isoformat() for p in levels])}

    def probe_params(self, queue: str) -> dict[str, Any] | None:
        """sql.STRAGGLERS' floors for ``queue``; None when there is nothing a probe can tell
        (no floors yet, or more levels than the claim reads one by one: below those it
        reads from the lowest floor, which the probe does not ask about)."""
        with self._lock:
            floors = self._floors.get(queue)
            if not floors or len(floors) > LEVELS_PROBED:
                return None
            return {"queue": queue, **self._floor_params(floors)}

    def horizon(self, held_seconds: float) -> None:
        """The probe's reading: how long the oldest transaction of the database has held the
        xmin horizon back; past the moving slack, claims take the held one."""
        self.slack = self.held_slack if held_seconds > self.moving_slack.total_seconds() else self.moving_slack

    def probed(self, queue: str, valid_s: float = PROBE_VALID_SECONDS) -> None:
        """A probe found no straggler in ``queue``: its claims need not sweep on the clock
        for ``valid_s`` (a few of the probe's intervals)."""
        with self._lock:
            self._probed[queue] = (self.clock(), valid_s)

    def claimed(self, queue: str, rows: Sequence[Sequence[Any]], sweep: bool, seconds: float = 0.0) -> None:
        """Move the floors of ``queue`` past the rows a claim returned (sql.CLAIM rows);
        ``seconds``: how long the claim took (a sweep's sets when the next one comes)."""
        with self._lock:
            if sweep:
                self._swept[queue] = self.clock()
                self._every[queue] = max(self.sweep_every, seconds / SWEEP_SHARE)
            floors = self._floors.setdefault(queue, {})
            for row in rows:
                if len(row) > KEYED_COLUMN and row[KEYED_COLUMN]:
                    continue
                level, run_at = row[PRIORITY_COLUMN], row[RUN_AT_COLUMN]
                if level not in floors or run_at > floors[level]:
                    floors[level] = run_at

    def reset(self, queue: str) -> None:
        """Rows of ``queue`` went back in line (a requeued waiting row keeps its run_at):
        the next claim sweeps, and reads every waiting row until the probe reads again."""
        with self._lock:
            self._swept.pop(queue, None)
            self._waiting.pop(queue, None)
            self._resets[queue] = self._resets.get(queue, 0) + 1


class SweepSignal(threading.Event):
    """Watched as NOTIFY '!queue' (a requeue, by any process): the queue's next claim
    sweeps, and its consumer claims at once (``set`` also sets its wake-up)."""

    def __init__(self, floors: ClaimFloors, queue: str, wakeup: threading.Event) -> None:
        super().__init__()
        self.floors = floors
        self.queue = queue
        self.wakeup = wakeup

    def set(self) -> None:
        self.floors.reset(self.queue)
        self.wakeup.set()


class StragglerProbe(threading.Thread):
    """One per process: every ``SWEEP_SECONDS`` asks, for each queue it serves, whether a
    runnable row waits behind one of the process's floors (``sql.STRAGGLERS``); if so the
    queue's ``SweepSignal`` is set (its next claim sweeps, at once), else the floors are
    told (its claims do not sweep on the clock). A database error is one line and the next
    round tries again (threads.py); meanwhile the claims sweep on the clock again."""

    def __init__(self, pool: ConnectionPool, floors: ClaimFloors, every: float = SWEEP_SECONDS) -> None:
        super().__init__(name="straggler-probe", daemon=True)
        self.pool = pool
        self.floors = floors
        self.every = every
        self.interval = every  # to the next round: every, or longer while rounds are slow
        self._signals: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._halt = threading.Event()

    def watch(self, queue: str, signal: threading.Event) -> None:
        with self._lock:
            self._signals[queue] = signal

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        with threads.lifetime(self.name, self._halt.is_set):
            while not self._halt.wait(self.interval):
                try:
                    self.check()
                except threads.EXPECTED as exc:
                    threads.warn(log, "looking for jobs behind the claim floors", exc)

    def check(self) -> list[str]:
        """One round; returns the queues found with a straggler. Sets the interval to the
        next (``PROBE_SHARE``)."""
        with self._lock:
            signals = dict(self._signals)
        if not signals:
            return []
        found, clean = [], []
        oldest: dict[str, tuple[datetime, int]] = {}
        started = time.monotonic()
        with self.pool.connection(timeout=10) as c:  # one connection a round, whatever the queues
            self.floors.horizon(float(db.one(c.execute(sql.HORIZON_HELD))))
            for queue, signal in signals.items():
                resets = self.floors.resets(queue)
                oldest[queue] = (db.one(c.execute(sql.WAITING_FLOOR_AT, {"queue": queue})), resets)
                if (params := self.floors.probe_params(queue)) is None:
                    continue
                if db.one(c.execute(sql.STRAGGLERS, params)):
                    found.append(queue)
                    signal.set()
                else:
                    clean.append(queue)
        self.interval = max(self.every, (time.monotonic() - started) / PROBE_SHARE)
        for queue in clean:
            self.floors.probed(queue, PROBE_VALID_ROUNDS * self.interval)
        for queue, (at, resets) in oldest.items():
            self.floors.waiting_floor(queue, at, resets, PROBE_VALID_ROUNDS * self.interval)
        return found
