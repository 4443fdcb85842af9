"""Where each queue's promoter reads job_timers from (migration 051, sql/timers.py): the
floor of its due index, as floors.py keeps the claim's floors of job_queue.

Under a pinned horizon the due index keeps an entry for every timer promoted since the
pin (the row deleted, the entry not yet marked dead), and a promotion that read the index
from its start would visit the heap for each. So each claim learns how far its promotion
read (``upto``: the server's now() when it moved every due row, else the latest run_at it
moved) and the next passes that, less SLACK_SECONDS, as the read's lower bound: the
entries behind it are passed over by a comparison in the index. A row behind the floor is
one whose write committed more than the slack after its run_at (a producer's long
transaction) or one a cancel held locked when the promoter passed: every SWEEP_SECONDS a
claim reads from the start (the floor NULL) and finds it. That read costs, under a pin,
what the floor saves the others, on the claim thread: paced by its cost (SWEEP_SHARE).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

# Behind the latest run_at promoted: rows committed up to this long after their run_at are
# still read by the floored promotions.
SLACK_SECONDS = 1.0
# A full read of a queue's due rows this often (the stragglers behind its floor), or less
# often while full reads are slow (a pin's dead entries): they take at most SWEEP_SHARE of
# the time, as floors.py paces its sweeps on the clock.
SWEEP_SECONDS = 2.0
SWEEP_SHARE = 0.005
# Timers moved into the log per claim: bounded, so one claim's transaction stays short; a
# claim that moved this many is followed by another at once.
PROMOTE_LIMIT = 1000


@dataclass(frozen=True)
class _Floor:
    upto: datetime  # how far the queue's last promotion read the due index (server clock)
    sweep_at: float  # monotonic: when the next full read is due


class TimerFloors:
    """Per queue: the floor the claims' promotions read job_timers from."""

    def __init__(self) -> None:
        self._floors: dict[str, _Floor] = {}
        self._lock = threading.Lock()

    def params(self, queue: str) -> dict[str, object]:
        """LOG_CLAIM_DUE's ``tfloor`` and ``tlimit`` for the queue's next claim: NULL (a full
        read) until a claim said how far it read, and every SWEEP_SECONDS."""
        floor = self._floors.get(queue)
        if floor is None or time.monotonic() >= floor.sweep_at:
            return {"tfloor": None, "tlimit": PROMOTE_LIMIT}
        return {"tfloor": floor.upto - timedelta(seconds=SLACK_SECONDS), "tlimit": PROMOTE_LIMIT}

    def read(self, queue: str, upto: datetime | None, *, full: bool, took_s: float = 0.0) -> None:
        """A claim read the queue's due index up to ``upto`` (None: the queue is paused),
        from its start if ``full``, in ``took_s`` seconds."""
        if upto is None:
            return
        with self._lock:
            floor = self._floors.get(queue)
            if full or floor is None:
                self._floors[queue] = _Floor(upto, time.monotonic() + max(SWEEP_SECONDS, took_s / SWEEP_SHARE))
            elif upto > floor.upto:
                self._floors[queue] = _Floor(upto, floor.sweep_at)
