"""Progress reports from inside an actor: ``supervisor.progress(pct, message)``.

A report is one dict store and no lock: each job's latest report sits in a
dict that only job threads write (one key each, the job they run) and one
thread writes to the database every ``interval`` seconds, in one statement
(``sql.WRITE_PROGRESS``): the history row and ``jobs.progress`` of each
running job whose report changed since the last write, and the history row of
each job acked meanwhile. The ack writer takes the latest report of the jobs
it acks and sets their ``jobs.progress`` in the ack itself, so a job's latest
report lands with its ``succeeded`` at no extra round trip or row update; its
history row goes with the next write. A no-op job that reports ten times costs
one history row and nothing on the ack's critical path.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import dramatiq
import psycopg
from dramatiq.middleware import CurrentMessage
from psycopg.adapt import Dumper
from psycopg.pq import Format
from psycopg.types.array import ListBinaryDumper
from psycopg_pool import ConnectionPool

from . import sql, threads

log = logging.getLogger(__name__)

# Longest a report waits in the process before it is written.
FLUSH_INTERVAL = 0.5


_json_string = json.encoder.encode_basestring  # str -> quoted JSON (C)

# (attempt, unix time, percent, message)
Report = tuple[int, float, float | None, str | None]
# (job id, attempt) -> does this process still run that attempt? (Leases.holds)
Holds = Callable[[tuple[str, int]], bool]


class _JsonText(str):
    """A JSON document already formatted, sent as binary jsonb (its text, a version byte)."""


class _JsonbArray(list[_JsonText | None]):
    """The ack's ``jsonb[]`` of reports, sent in binary. psycopg's text array format
    escapes every double quote of every element through a regex substitution:
    ~40 us per report, more than the rest of a no-op job's progress costs."""


class _JsonTextBinaryDumper(Dumper):
    format = Format.BINARY
    oid = psycopg.adapters.types["jsonb"].oid

    def dump(self, obj: _JsonText) -> bytes:
        return b"\x01" + obj.encode()


# On the global map, which every connection opened afterwards starts from; only
# these two private classes are affected.
psycopg.adapters.register_dumper(_JsonText, _JsonTextBinaryDumper)
psycopg.adapters.register_dumper(_JsonbArray, ListBinaryDumper)


def _value(report: Report) -> _JsonText:
    """A report as ``jobs.progress`` holds it, as JSON text formatted here (~4x
    cheaper than a dict through json.dumps; it runs once per acked job)."""
    percent = "null" if report[2] is None else repr(report[2])
    message = "null" if report[3] is None else _json_string(report[3])
    at = datetime.fromtimestamp(report[1], UTC).isoformat()
    return _JsonText(f'{{"percent":{percent},"message":{message},"at":"{at}"}}')


class ProgressBuffer(threading.Thread):
    """The latest report of each job this process runs; a daemon thread writes them.

    Coalesced: per job, only the latest report of each write interval reaches
    the database (the history keeps at most one row per job per interval, plus
    the last one), so a job that reports in a tight loop costs one row per
    interval, not one per call. A report equal to the job's previous one is
    dropped at once.

    Threads: job threads only store into ``_latest`` (each under its own job's
    key); the ack thread pops the keys of the jobs it acks and appends them to
    ``_ended``; the writer thread copies ``_latest`` (one C call, atomic under
    the GIL), writes what changed, remembers what it wrote in ``_written`` (its
    own), and forgets the jobs this process no longer runs (``holds``).
    """

    def __init__(self, pool: ConnectionPool, *, interval: float = FLUSH_INTERVAL,
                 holds: Holds | None = None) -> None:
        super().__init__(name="progress-writer", daemon=True)
        self.pool = pool
        self.interval = interval
        self._holds = holds
        self._latest: dict[str, Report] = {}  # job id -> its latest report
        self._written: dict[str, Report] = {}  # job id -> the report last written (same object)
        self._ended: collections.deque[tuple[str, Report]] = collections.deque()  # acked, history unwritten
        self._write_lock = threading.Lock()  # one writer at a time (the thread, close, tests)
        self._halt = threading.Event()

    def record(self, job_id: str, attempt: int, percent: float | None, message: str | None) -> None:
        latest = self._latest
        prev = latest.get(job_id)
        if prev is not None and prev[2] == percent and prev[3] == message and prev[0] == attempt:
            return  # nothing new to show: keep the earlier time, write nothing
        latest[job_id] = (attempt, time.time(), percent, message)

    def pending(self) -> bool:
        written = self._written
        return bool(self._ended) or any(written.get(i) is not r for i, r in self._latest.copy().items())

    def write(self, conn: psycopg.Connection) -> int:
        """Write everything pending through ``conn``: one statement. Returns reports written."""
        with self._write_lock:
            ended: list[tuple[str, Report]] = []
            with contextlib.suppress(IndexError):
                while True:  # popleft is atomic; the ack thread may append meanwhile
                    ended.append(self._ended.popleft())
            written = self._written
            running = [(i, r) for i, r in self._latest.copy().items() if written.get(i) is not r]
            # An acked job's report already written while it ran needs no second row.
            history = [(i, r) for i, r in ended if written.get(i) is not r]
            if running or history:
                try:
                    with conn.transaction():  # committed before the reports count as written
                        conn.execute(sql.WRITE_PROGRESS, self._params(running, history))
                except BaseException:
                    self._ended.extendleft(reversed(ended))
                    raise
            for i, r in running:
                written[i] = r
            for i, _ in ended:
                written.pop(i, None)
            self._forget_finished()
            return len(running) + len(history)

    @staticmethod
    def _params(running: list[tuple[str, Report]], ended: list[tuple[str, Report]]) -> dict[str, list[Any]]:
        both = running + ended
        return {"ids": [i for i, _ in both], "attempts": [r[0] for _, r in both],
                "at": [r[1] for _, r in both],  # unix time: to_timestamp() in SQL, no datetime here
                "percents": [r[2] for _, r in both], "messages": [r[3] for _, r in both],
                # jobs.progress of acked jobs was set by their ack: history rows only
                "running": [True] * len(running) + [False] * len(ended)}

    def _forget_finished(self) -> None:
        """Drop the written reports of attempts this process no longer runs (failed,
        retried, interrupted: no ack came to take them). The job thread of such an
        attempt is done with its key. Only a new attempt of the same job claimed by
        this process, reporting between the check and the pop, could lose a report
        (the next one, or its ack, shows it again)."""
        if self._holds is None:
            return
        latest, written = self._latest, self._written
        for i, r in list(written.items()):
            if latest.get(i) is r and not self._holds((i, r[0])):
                latest.pop(i, None)
                written.pop(i, None)

    @contextlib.contextmanager
    def for_ack(self, conn: psycopg.Connection, ids: list[str]) -> Iterator[list[Any] | None]:
        """Around an ack batch: take the latest reports of the acked jobs and yield
        them as ``jobs.progress`` values for the ack to set (None where a job has
        none, or its report is already in the row; None when no job has any).

        No database work here: their history rows go with the next write. If the
        ack fails, the reports go back for the next write (or the retried ack)."""
        latest, written = self._latest, self._written
        taken = [(i, r) for i in ids if (r := latest.pop(i, None)) is not None]
        if not taken:
            yield None
            return
        by_id = dict(taken)
        values = _JsonbArray(None if (r := by_id.get(i)) is None or written.get(i) is r else _value(r) for i in ids)
        try:
            yield values if any(v is not None for v in values) else None
        except BaseException:
            for i, r in taken:
                latest.setdefault(i, r)  # keep unwritten reports, unless a newer one came meanwhile
            raise
        self._ended.extend(taken)

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        with threads.lifetime(self.name, self._halt.is_set):
            while not self._halt.wait(self.interval):  # let reports gather: one write per interval
                if not self.pending():
                    with self._write_lock:
                        self._forget_finished()
                    continue
                try:
                    with self.pool.connection(timeout=10) as conn:
                        self.write(conn)
                except threads.EXPECTED as exc:
                    threads.warn(log, "writing progress reports", exc)


# Per worker thread: (the current message, its job id, attempt, the buffer's
# record), looked up once per job. A message proxy's message_id goes
# through __getattr__ (~0.7 us): ten reports per job would pay it ten times.
_job = threading.local()


def progress(percent: float | None, message: str | None = None) -> None:
    """Report the current job's progress (0-100, and/or a message) from inside an actor.

    Cheap enough to call in a loop (well under a microsecond, no lock, no I/O):
    the report is kept in memory and written with the process's next progress
    write (within half a second) or with the job's ack. Outside a job (no current
    message), it does nothing.
    """
    current = CurrentMessage.get_current_message()
    if current is None:
        return
    cached = getattr(_job, "cached", None)
    if cached is None or cached[0] is not current:
        buffer = getattr(dramatiq.get_broker(), "progress_buffer", None)
        if buffer is None:  # not a PostgresBroker: nowhere to write
            return
        # Holding the proxy keeps its id from being reused by the next job's proxy.
        cached = _job.cached = (current, current.message_id, getattr(current, "attempts", 0), buffer().record)
    if percent is not None:
        percent = float(percent)
        if percent < 0.0:
            percent = 0.0
        elif percent > 100.0:
            percent = 100.0
        elif percent != percent:  # NaN: JSON has no such number
            percent = None
    if message is not None and type(message) is not str:
        message = str(message)
    cached[3](cached[1], cached[2], percent, message)
