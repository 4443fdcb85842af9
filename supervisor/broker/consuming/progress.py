"""Progress reports from inside an actor: ``supervisor.progress(pct, message, event=None)``.

A report is a dict store and a deque append, no lock: each job's latest report
sits in a dict that only job threads write (one key each, the job they run), and
every report joins the job's queue of unwritten ones. One thread writes to the
database every ``interval`` seconds, in one statement (``sql.WRITE_PROGRESS``):
a history row for every report made since the last write (with its ``event``
kind: reports are not merged away, up to ``MAX_REPORTS`` per job per write) and
``jobs.progress`` of each running job (its latest). The ack writer takes the
latest report of the jobs it acks and sets their ``jobs.progress`` in the ack
itself, so a job's latest report lands with its ``succeeded`` at no extra round
trip or row update; its history rows go with the next write.
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

from .. import sql, threads

log = logging.getLogger(__name__)

# Longest a report waits in the process before it is written.
FLUSH_INTERVAL = 0.5


_json_string = json.encoder.encode_basestring  # str -> quoted JSON (C)

# A job that reports in a tight loop keeps, per write interval, its first reports
# and its latest, this many in all: the history shows every event of a job that
# reports a few, and costs a bounded number of rows for one that reports thousands.
MAX_REPORTS = 32

# (attempt, unix time, percent, message, event kind)
Report = tuple[int, float, float | None, str | None, str | None]
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
    event = "" if report[4] is None else f',"event":{_json_string(report[4])}'
    return _JsonText(f'{{"percent":{percent},"message":{message},"at":"{at}"{event}}}')


class ProgressBuffer(threading.Thread):
    """Each job's latest report and its reports not yet written; a daemon thread writes them.

    Every report becomes a history row (a report equal to the job's previous one is
    dropped at once), up to ``MAX_REPORTS`` per job per write interval: past that,
    the newest replaces the last one kept. ``jobs.progress`` gets the latest.

    Threads: job threads store into ``_latest`` and append to their job's deque in
    ``_unwritten`` (each under its own job's key); the ack thread pops the latest
    reports of the jobs it acks and, once the ack committed, names them in
    ``_ended``; the writer thread drains the deques (popleft and append are atomic),
    writes, remembers what it wrote last per job in ``_written`` (its own), and
    forgets the jobs this process no longer runs (``holds``) or acked.
    """

    def __init__(self, pool: ConnectionPool, *, interval: float = FLUSH_INTERVAL,
                 holds: Holds | None = None) -> None:
        super().__init__(name="progress-writer", daemon=True)
        self.pool = pool
        self.interval = interval
        self._holds = holds
        self._latest: dict[str, Report] = {}  # job id -> its latest report
        self._unwritten: dict[str, collections.deque[Report]] = {}  # job id -> reports with no history row yet
        self._written: dict[str, Report] = {}  # job id -> the report last written (same object)
        self._ended: collections.deque[str] = collections.deque()  # acked: forget once their rows are written
        self._write_lock = threading.Lock()  # one writer at a time (the thread, close, tests)
        self._halt = threading.Event()

    def record(self, job_id: str, attempt: int, percent: float | None, message: str | None,
               event: str | None = None) -> None:
        latest = self._latest
        prev = latest.get(job_id)
        if (prev is not None and prev[2] == percent and prev[3] == message and prev[4] == event
                and prev[0] == attempt):
            return  # nothing new to show: keep the earlier time, write nothing
        report = latest[job_id] = (attempt, time.time(), percent, message, event)
        queue = self._unwritten.get(job_id)
        if queue is None:
            queue = self._unwritten[job_id] = collections.deque()
        elif len(queue) >= MAX_REPORTS:
            with contextlib.suppress(IndexError):  # the writer may have drained it meanwhile
                queue.pop()
        queue.append(report)

    def pending(self) -> bool:
        return bool(self._ended) or any(self._unwritten.copy().values())

    def write(self, conn: psycopg.Connection) -> int:
        """Write everything pending through ``conn``: one statement. Returns reports written."""
        with self._write_lock:
            ended: list[str] = []
            with contextlib.suppress(IndexError):
                while True:  # popleft is atomic; the ack thread may append meanwhile
                    ended.append(self._ended.popleft())
            taken: list[tuple[str, collections.deque[Report], list[Report]]] = []
            for job_id, queue in self._unwritten.copy().items():
                reports: list[Report] = []
                with contextlib.suppress(IndexError):
                    while True:
                        reports.append(queue.popleft())
                if reports:
                    taken.append((job_id, queue, reports))
            if taken:
                try:
                    with conn.transaction():  # committed before the reports count as written
                        conn.execute(sql.WRITE_PROGRESS, self._params(taken))
                except BaseException:
                    for _, queue, reports in taken:
                        queue.extendleft(reversed(reports))
                    self._ended.extendleft(reversed(ended))
                    raise
            written = self._written
            for job_id, _, reports in taken:
                written[job_id] = reports[-1]
            for job_id in ended:
                self._forget(job_id)
            self._forget_finished()
            return sum(len(reports) for _, _, reports in taken)

    @staticmethod
    def _params(taken: list[tuple[str, Any, list[Report]]]) -> dict[str, list[Any]]:
        rows = [(job_id, r, k == len(reports) - 1) for job_id, _, reports in taken for k, r in enumerate(reports)]
        return {"ids": [i for i, _, _ in rows], "attempts": [r[0] for _, r, _ in rows],
                "at": [r[1] for _, r, _ in rows],  # unix time: to_timestamp() in SQL, no datetime here
                "percents": [r[2] for _, r, _ in rows], "messages": [r[3] for _, r, _ in rows],
                "events": [r[4] for _, r, _ in rows],
                # jobs.progress from each job's latest row only (fenced in SQL to running jobs)
                "latest": [last for _, _, last in rows]}

    def _forget(self, job_id: str) -> None:
        queue = self._unwritten.get(job_id)
        if queue is None or not queue:
            self._unwritten.pop(job_id, None)
            self._written.pop(job_id, None)
        else:  # reports made after the ack took its latest (cannot happen: the job ended); next write
            self._ended.append(job_id)

    def _forget_finished(self) -> None:
        """Drop the reports of attempts this process no longer runs (failed, retried,
        interrupted: no ack came to take them) once they are written. The job thread
        of such an attempt is done with its key. Only a new attempt of the same job
        claimed by this process, reporting between the check and the pop, could lose
        a report (the next one, or its ack, shows it again)."""
        if self._holds is None:
            return
        latest, written, unwritten = self._latest, self._written, self._unwritten
        for i, r in list(written.items()):
            if latest.get(i) is r and not unwritten.get(i) and not self._holds((i, r[0])):
                latest.pop(i, None)
                written.pop(i, None)
                unwritten.pop(i, None)

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
        self._ended.extend(i for i, _ in taken)

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


def progress(percent: float | None, message: str | None = None, event: str | None = None) -> None:
    """Report the current job's progress (0-100, and/or a message) from inside an actor;
    ``event`` names the kind of report (``"fetched"``, ``"retrying-upstream"``...).

    Cheap enough to call in a loop (about a microsecond, no lock, no I/O): the
    report is kept in memory and written with the process's next progress write
    (within half a second) or with the job's ack. Every report is kept in the job's
    history, up to ``MAX_REPORTS`` per job per write interval. Outside a job (no
    current message), it does nothing.
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
    if event is not None and type(event) is not str:
        event = str(event)
    cached[3](cached[1], cached[2], percent, message, event)
