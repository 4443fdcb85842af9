"""Progress reports from inside an actor: ``supervisor.progress(pct, message)``.

A report costs a lock and a dict store: reports are gathered per process and
written by one thread, all of them in one statement (``sql.WRITE_PROGRESS``),
at most every ``interval`` seconds. The ack writer takes the pending reports of
the jobs it acks and sets their ``jobs.progress`` in the ack itself, so a job's
latest report lands with its ``succeeded`` at no extra row update.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import dramatiq
import psycopg
from dramatiq.middleware import CurrentMessage
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from . import sql
from .message import jsonb

log = logging.getLogger(__name__)

# Longest a report waits in the process before it is written.
FLUSH_INTERVAL = 0.5


# (attempt, unix time, percent, message)
Report = tuple[int, float, float | None, str | None]


def _params(reports: dict[str, Report]) -> dict[str, list[Any]]:
    values = reports.values()
    return {"ids": list(reports), "attempts": [r[0] for r in values],
            "at": [datetime.fromtimestamp(r[1], UTC) for r in values],
            "percents": [r[2] for r in values], "messages": [r[3] for r in values]}


def _value(report: Report) -> Jsonb:
    """A report as ``jobs.progress`` holds it."""
    return jsonb({"percent": report[2], "message": report[3],
                  "at": datetime.fromtimestamp(report[1], UTC).isoformat()})


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
        self._latest: dict[str, Report] = {}  # job id -> its latest report
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
            try:
                conn.execute(sql.WRITE_PROGRESS, _params(latest))
            except BaseException:
                self._put_back(latest)
                raise
            return len(latest)

    @contextlib.contextmanager
    def for_ack(self, conn: psycopg.Connection, ids: list[str]) -> Iterator[list[Any] | None]:
        """Around an ack batch: queue the history rows of the acked jobs' pending
        reports on ``conn`` in pipeline mode (they go with the ack in one round
        trip) and yield their latest as ``jobs.progress`` values for the ack to
        set (None where a job has none; None when no job has any).

        Under the write lock, so an older report of one of these jobs still
        being written by the thread lands first, never after the ack."""
        with self._write_lock:
            with self._lock:
                taken = {i: self._latest.pop(i) for i in ids if i in self._latest}
            try:
                if not taken:
                    yield None
                    return
                with conn.pipeline():  # the caller's ack is queued behind; errors surface at the sync
                    conn.execute(sql.INSERT_PROGRESS, _params(taken))
                    yield [_value(taken[i]) if i in taken else None for i in ids]
            except BaseException:
                self._put_back(taken)
                raise

    def _put_back(self, reports: dict[str, Report]) -> None:
        """Keep unwritten reports for the next write, unless newer ones came meanwhile."""
        with self._lock:
            self._latest = {**reports, **self._latest}

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
