"""What a process keeps between claims for the keyed part of the claim (sql/flow.py): per
queue, the key it served last (its turn cursor) and the wake-up it announced last.

A claim that finds keys gated by time (no token, the day's quota used, a block) says how
many seconds until the first opens. The process sets its own timer for then
(``DueTimer.due_in``) and, when that is sooner than what it announced last, the claim
itself announces it (NOTIFY '~queue seconds'): every process serving the queue wakes when
a token is due, whichever of them is free then, with no poll.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ..sql.flow import ANNOUNCE_MARGIN  # a gate announced again only when sooner by this

# Prefix of the NOTIFY payload '~queue seconds' (sql/flow.py's kannounce, sql.FINISH's limited).
GATE = "~"
# Prefix of the NOTIFY payload '+queue': the queue has waiting rows now (the insert trigger,
# sql.FINISH, the releases, a freed slot): its claims read them (sql.CLAIM_KEYED).
WAITING = "+"
# A queue claimed without reading waiting rows asks whether it has some this often (and at
# its first claim): the notices above may have been missed (a listener away, a pooled URL
# with no LISTEN). The longest a queue's keys, all found gated, go unread too.
PROBE_SECONDS = 2.0
# A keyed claim cut at max_keys that found every key it read gated: the queue's next keyed
# claim (reading on from there) comes this long after, doubling while they all are, up to
# PROBE_SECONDS; meanwhile its plain rows are claimed at a plain claim's cost. A gate of a
# key read opens on time (the timer), a notice ('+queue') ends the pause.
CUT_PAUSE = 0.05
# Keys a claim may visit: enough for half of them gated at each claim, and a bound on
# what one claim reads when most are (the rest is for the next claim, at once).
EXTRA_KEYS = 16
# A keyed claim that follows cut claims which found every key gated reads 4x the keys
# of the one before, up to this many: a lap of the queue's keys takes a few claims, not
# one per max_keys (each claim's fixed cost, ~4 ms of planning and the plain part, paid
# again). A scan that reaches every key is not cut: the queue then waits for its first
# gate to open, at most PROBE_SECONDS (2,000 gated jobs of 200 keys behind a drain of
# plain jobs: 5 keyed claims a process a second, 2 now; bench_limits.py L2).
MOST_KEYS = 1024
# The waiting floor (sql/flow.py's WAITING_FLOOR) of a claim that knows none: read every
# waiting row (broker/consuming/floors.py keeps the process's).
NO_FLOOR = "-infinity"


def max_keys(n: int, streak: int = 0) -> int:
    """How many keys a claim of ``n`` rows may visit, after ``streak`` cut claims that found
    every key gated."""
    return min(MOST_KEYS, (2 * n + EXTRA_KEYS) << (2 * min(streak, 8)))


def first_turn(n: int) -> dict[str, object]:
    """The keyed parameters of a claim of ``n`` rows by a process that knows nothing yet
    (its first, or a one-off claim: tests, benchmarks)."""
    return {"cursor": "", "max_keys": max_keys(n), "announced": None, "kfloor": NO_FLOOR}


def waiting_queue(payload: str) -> str | None:
    """The queue of a '+queue' payload; None if it is not one."""
    return payload[len(WAITING):] if payload.startswith(WAITING) else None


def parse(payload: str) -> tuple[str, float] | None:
    """The queue and seconds of a '~queue seconds' payload; None if it is not one."""
    if not payload.startswith(GATE):
        return None
    queue, _, seconds = payload[len(GATE):].rpartition(" ")
    try:
        return queue, max(0.0, float(seconds))
    except ValueError:
        return None


class Gates:
    """Per queue: whether it has waiting rows (its claims are sql.CLAIM_KEYED then), when it
    was last probed for them, the cursor (last key served) and the announced wake-up
    (monotonic)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._keyed: set[str] = set()
        self._dormant: dict[str, float] = {}  # keyed, but every key read was gated: until then
        self._streak: dict[str, int] = {}  # keyed claims in a row that found every key gated
        # Notices and deadlines per queue, counted: a claim that was under way when one came
        # read the queue before it, so what it found does not undo it (learned()).
        self._notices: dict[str, int] = {}
        self._asked: dict[str, int] = {}
        self._probed: dict[str, float] = {}
        self._cursor: dict[str, str] = {}
        self._announced: dict[str, float] = {}
        self._max_keys: dict[str, int] = {}  # what the queue's last claim was allowed to read
        self._lock = threading.Lock()

    def statement(self, queue: str) -> tuple[bool, bool]:
        """(keyed, probe) for the queue's next claim (sql.claim): keyed while it has waiting
        rows, except while the last keyed claim found every key it read gated (its plain
        rows are claimed meanwhile at a plain claim's cost); else a probe every
        PROBE_SECONDS."""
        now = self.clock()
        with self._lock:
            self._asked[queue] = self._notices.get(queue, 0)
        if queue in self._keyed:
            until = self._dormant.get(queue)
            return (until is None or until <= now), False
        with self._lock:
            last = self._probed.get(queue)
            if last is not None and now - last < PROBE_SECONDS:
                return False, False
            self._probed[queue] = now
        return False, True

    def waiting(self, queue: str) -> None:
        """A notice: the queue has waiting rows now ('+queue', or a gate of it opens)."""
        with self._lock:
            self._notices[queue] = self._notices.get(queue, 0) + 1
            self._keyed.add(queue)
            self._dormant.pop(queue, None)
            self._streak.pop(queue, None)

    def gated(self, queue: str) -> None:
        """A peer's '~queue seconds': the queue has waiting rows, one of its keys opens later
        (the timer wakes it then): its claims read waiting rows, no pause is cut short."""
        with self._lock:
            self._keyed.add(queue)

    def wake(self, queue: str) -> None:
        """A deadline of the queue passed (its timer): a gated key, or a delayed waiting row,
        may be claimable now."""
        with self._lock:
            self._notices[queue] = self._notices.get(queue, 0) + 1
            self._dormant.pop(queue, None)

    def params(self, queue: str, n: int) -> dict[str, Any]:
        """The claim's keyed parameters for ``queue``."""
        with self._lock:
            cursor = self._cursor.get(queue, "")
            at = self._announced.get(queue)
            most = self._max_keys[queue] = max_keys(n, self._streak.get(queue, 0))
        now = self.clock()
        return {**first_turn(n), "cursor": cursor, "announced": None if at is None or at <= now else at - now,
                "max_keys": most}

    def learned(self, queue: str, n: int, wait: float | None, cursor: str | None, keys: int,
                took: int | None) -> None:
        """What a claim of ``n`` rows said in its META row (sql.WAIT_COLUMN, CURSOR_COLUMN,
        KEYS_COLUMN: keys with waiting rows seen, none sends the queue back to the plain
        claim; TOOK_COLUMN: rows taken from keys). A keyed claim that took none found every
        key it read gated: the keys are read again when the first opens (``wait``), after
        CUT_PAUSE (doubling, each such claim reading 4x the keys: MOST_KEYS) if the scan
        stopped at max_keys, at most PROBE_SECONDS later, or at a notice or a deadline of
        the queue."""
        now = self.clock()
        with self._lock:
            noticed = self._notices.get(queue, 0) != self._asked.get(queue, 0)  # during the claim
            if keys or noticed:
                self._keyed.add(queue)
            else:
                self._keyed.discard(queue)
            if keys and took == 0 and not noticed:
                streak = self._streak[queue] = self._streak.get(queue, 0) + 1
                pause = PROBE_SECONDS
                if wait is not None and wait > 0:
                    pause = min(pause, wait)
                if keys >= self._max_keys.get(queue, max_keys(n)):  # cut: keys beyond it not read yet
                    pause = min(pause, CUT_PAUSE * 2 ** min(streak - 1, 16))
                self._dormant[queue] = now + pause
            else:
                self._streak.pop(queue, None)
                self._dormant.pop(queue, None)
            if cursor is not None:
                self._cursor[queue] = cursor
            if wait is not None and wait > 0:
                at = self.clock() + wait
                known = self._announced.get(queue)
                if known is None or known <= self.clock() or at < known - ANNOUNCE_MARGIN:
                    self._announced[queue] = at
