"""Progress reports from inside an actor: ``supervisor.progress(pct, message)``.

A report costs a lock and a dict store: reports are gathered per process and
written by one thread, all of them in one statement (``sql.WRITE_PROGRESS``),
at most every ``interval`` seconds. The ack writer writes whatever is pending
just before its acks, so a job's latest report is in the database no later
than its ``succeeded``.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime

import dramatiq
import psycopg
from dramatiq.middleware import CurrentMessage
from psycopg_pool import ConnectionPool

from . import sql

log = logging.getLogger(__name__)

# Longest a report waits in the process before it is written.
FLUSH_INTERVAL = 0.5


class ProgressBuffer(threading.Thread):
    """The reports of one process not yet written; a daemon thread writes them.

    Coalesced: per job, only the latest report of each write interval is kept,
    so a job that reports in a tight loop costs one row per interval, not one
    per call (the history keeps a report at least every ``interval`` seconds).
    """

    def __init__(self, pool: ConnectionPool, *, interval: float = FLUSH_INTERVAL) -> None:
        super().__init__(name="progress-writer", daemon=True)
        self.pool = pool
        self.interval = interval
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()  # one write at a time, in report order
        # job id -> (attempt, unix time, percent, message) of its latest report
        self._latest: dict[str, tuple[int, float, float | None, str | None]] = {}
        self._wake = threading.Event()
        self._halt = threading.Event()

    def record(self, job_id: str, attempt: int, percent: float | None, message: str | None) -> None:
        report = (attempt, time.time(), percent, message)
        with self._lock:
            first = not self._latest
            self._latest[job_id] = report
        if first:
            self._wake.set()

    def pending(self) -> bool:
        with self._lock:
            return bool(self._latest)

    def write(self, conn: psycopg.Connection) -> int:
        """Write everything pending through ``conn``: one statement. Returns reports written."""
        with self._write_lock:
            with self._lock:
                latest, self._latest = self._latest, {}
            if not latest:
                return 0
            at = [datetime.fromtimestamp(r[1], UTC) for r in latest.values()]
            percents = [r[2] for r in latest.values()]
            messages = [r[3] for r in latest.values()]
            try:
                conn.execute(sql.WRITE_PROGRESS, {
                    "ids": list(latest), "attempts": [r[0] for r in latest.values()],
                    "at": at, "percents": percents, "messages": messages,
                })
            except BaseException:
                with self._lock:  # keep them for the next write, unless newer reports came
                    self._latest = {**latest, **self._latest}
                raise
            return len(latest)

    def stop(self) -> None:
        self._halt.set()
        self._wake.set()

    def run(self) -> None:
        while not self._halt.is_set():
            self._wake.wait()
            self._halt.wait(self.interval)  # let reports gather: one write per interval
            self._wake.clear()
            if not self.pending():
                continue
            try:
                with self.pool.connection(timeout=10) as conn:
                    self.write(conn)
            except Exception as exc:
                log.warning("could not write progress reports (%s); will retry", exc)
                self._wake.set()


def progress(percent: float | None, message: str | None = None) -> None:
    """Report the current job's progress (0-100, and/or a message) from inside an actor.

    Cheap enough to call in a loop: the report is buffered and written with the
    process's next progress write (within half a second, and before the ack).
    Outside a job (no current message), it does nothing.
    """
    current = CurrentMessage.get_current_message()
    report = getattr(dramatiq.get_broker(), "report_progress", None)
    if current is None or report is None:
        return
    if percent is not None:
        percent = max(0.0, min(100.0, float(percent)))
    report(current.message_id, getattr(current, "attempts", 0), percent, message)
