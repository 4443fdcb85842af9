"""Progress reports from inside an actor: ``supervisor.progress(pct, message)``.

A report costs a lock and an append: reports are gathered per process and
written by one thread, all of them in one statement (``sql.WRITE_PROGRESS``),
at most every ``interval`` seconds. The ack writer writes whatever is pending
in the same transaction as its acks, so a job's latest report is in the
database no later than its ``succeeded``.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
from typing import Any

import dramatiq
import psycopg
from dramatiq.middleware import CurrentMessage
from psycopg_pool import ConnectionPool

from . import sql
from .message import jsonb

log = logging.getLogger(__name__)

# Longest a report waits in the process before it is written.
FLUSH_INTERVAL = 0.5
# Reports kept per job between writes; more are dropped (the latest always stays).
MAX_EVENTS_PER_JOB = 100


class ProgressBuffer(threading.Thread):
    """The reports of one process not yet written; a daemon thread writes them."""

    def __init__(self, pool: ConnectionPool, *, interval: float = FLUSH_INTERVAL) -> None:
        super().__init__(name="progress-writer", daemon=True)
        self.pool = pool
        self.interval = interval
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()  # one write at a time, in report order
        self._events: list[tuple[str, datetime, float | None, str | None]] = []
        self._per_job: dict[str, int] = {}
        self._latest: dict[str, tuple[int, dict[str, Any]]] = {}
        self._wake = threading.Event()
        self._halt = threading.Event()

    def record(self, job_id: str, attempt: int, percent: float | None, message: str | None) -> None:
        at = datetime.now(UTC)
        latest = {"percent": percent, "message": message, "at": at.isoformat()}
        with self._lock:
            first = not self._latest
            self._latest[job_id] = (attempt, latest)
            n = self._per_job.get(job_id, 0)
            if n < MAX_EVENTS_PER_JOB:
                self._per_job[job_id] = n + 1
                self._events.append((job_id, at, percent, message))
        if first:
            self._wake.set()

    def pending(self) -> bool:
        with self._lock:
            return bool(self._latest)

    def write(self, conn: psycopg.Connection) -> int:
        """Write everything pending through ``conn`` (in the caller's transaction, if any)."""
        with self._write_lock:
            with self._lock:
                events, latest = self._events, self._latest
                self._events, self._latest, self._per_job = [], {}, {}
            if not latest:
                return 0
            try:
                conn.execute(sql.WRITE_PROGRESS, {
                    "ev_ids": [e[0] for e in events], "ev_at": [e[1] for e in events],
                    "ev_pct": [e[2] for e in events], "ev_msg": [e[3] for e in events],
                    "ids": list(latest), "attempts": [a for a, _ in latest.values()],
                    "progress": [jsonb(p) for _, p in latest.values()],
                })
            except BaseException:
                self._put_back(events, latest)
                raise
            return len(events)

    def _put_back(self, events: list, latest: dict[str, tuple[int, dict[str, Any]]]) -> None:
        with self._lock:
            self._events[:0] = events
            for job_id, value in latest.items():
                self._latest.setdefault(job_id, value)

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
