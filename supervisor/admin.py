"""Operator reads and fixes: jobs (list, page, show, progress, retry, cancel, in bulk),
queues (stats, capacity, pause, resume), the workers registry and schedule state.
Shared by the CLI and the HTTP API."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from . import db, defaults, jobsearch, registry
from .broker import reads, sql
from .broker.sql import joblog, timers
from .identity import operator
from .jobstates import JobState
from .worker import scheduler_sql


def show_job(conn: psycopg.Connection, job_id: str) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        job = cur.execute(reads.GET, {"id": job_id}).fetchone()
        if job is None:
            return None
        job["events"] = cur.execute(reads.EVENTS, {"id": job_id}).fetchall()
        job["progress_history"] = cur.execute(sql.PROGRESS, {"id": job_id}).fetchall()
        _describe_payload(job)
        return job


def _describe_payload(job: dict[str, Any]) -> None:
    """A non-JSON encoder's payload is opaque here (decoding it needs the producer's
    encoder, and unpickling is not for an admin tool): say so instead of showing bytes."""
    payload = job.get("payload")
    if payload is None:
        return
    job["payload"] = (f"cannot render: {len(payload)} bytes written by a non-JSON Dramatiq encoder "
                      "(e.g. PickleEncoder); args, kwargs and options are in it")
    for key in ("args", "kwargs", "options"):
        job[key] = "(in payload)"


def retry_job(conn: psycopg.Connection, job_id: str) -> bool:
    """Retry a failed or cancelled job, ended in job_history or in the log."""
    params = {"id": job_id, "who": operator()}
    with conn.transaction():
        if conn.execute(sql.RETRY_FAILED, params).fetchone() is not None:
            conn.execute(joblog.QUEUE_TO_LOG, params)  # (one store: the log, where the log takes it)
            return True
        return conn.execute(joblog.LOG_RETRY_FAILED, params).fetchone() is not None


def cancel_job(conn: psycopg.Connection, job_id: str) -> bool:
    """Cancel a pending, retryable or running job (its process interrupts it).
    Cancelling a cancelled job again is harmless: True, nothing written."""
    params = {"id": job_id, "who": operator(), "reason": "cancelled by operator"}
    # a timer before the log: one promoted meanwhile is the log's (a statement later, a new snapshot)
    row = (conn.execute(sql.CANCEL, params).fetchone() or conn.execute(timers.TIMER_CANCEL, params).fetchone()
           or conn.execute(joblog.LOG_CANCEL, params).fetchone())
    if row is not None:
        return True
    status = conn.execute(reads.STATUS, {"id": job_id}).fetchone()
    return status is not None and status[0] == "cancelled"


WAITS = ("wait_p50_s", "wait_p95_s", "wait_p99_s")


def queue_capacity(conn: psycopg.Connection, *, waits: bool = True) -> list[dict[str, Any]]:
    """v_queue_capacity: per queue counts, throughput and workers needed to drain; with
    ``waits``, also the start waits of the last hour's jobs, p50 / p95 / p99 (WAITS, None
    for a queue that finished none). /metrics leaves them out: they sort an hour of rows."""
    found = db.dicts(conn, reads.CAPACITY)
    if not waits:
        return found
    finished = {r["queue"]: r for r in db.dicts(conn, reads.FINISHED_BY_QUEUE)}
    return [{**q, **{k: finished.get(q["queue"], {}).get(k) for k in WAITS}} for q in found]


# Every status a job can have, in a job's order (jobstates.JobState).
JOB_STATUSES = tuple(s.value for s in JobState)


def job_status(value: object) -> str | None:
    """A status filter as given in a field (blank: none); ValueError when it is no job status."""
    status = value.strip() if isinstance(value, str) else value
    if status in (None, ""):
        return None
    if status not in JOB_STATUSES:
        raise ValueError(f"expected one of {', '.join(JOB_STATUSES)}, got {status!r}")
    return str(status)


@dataclass(frozen=True)
class JobFilter:
    """Which jobs a listing or a bulk action covers; None leaves a criterion out. The CLI,
    the API and the dashboard's form each build one (their fields differ), nothing else."""

    status: str | None = None
    queue: str | None = None
    actor: str | None = None
    text: str | None = None  # a substring of the JSON of args and kwargs
    created_after: datetime | None = None
    created_before: datetime | None = None
    finished_after: datetime | None = None
    finished_before: datetime | None = None
    # by id or id prefix, dedupe or concurrency key, a value inside the arguments
    search: jobsearch.Search = jobsearch.Search()

    def params(self) -> dict[str, Any]:
        """The bind parameters of ``reads.FILTERS`` (None: that filter is not given)."""
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "search"}
        return {**own, **self.search.params()}

    def names(self) -> frozenset[str]:
        """The filters given (``reads.FILTERS`` keys): the statement holds only theirs."""
        return frozenset(k for k, v in self.params().items() if v is not None and k in reads.FILTERS)

    @property
    def empty(self) -> bool:
        return not self.names()

    @property
    def scans(self) -> bool:
        """Some filter no index serves (a queue, an actor, text, a key, a value inside the
        arguments): a page reads a window of the newest jobs only (jobsearch.SCAN_ROWS)."""
        return bool(self.names() - reads.INDEXED)


@dataclass(frozen=True)
class JobsPage:
    rows: list[dict[str, Any]]
    # Where the next page starts (created_at, id), None when there is none. After a search
    # whose window ended before the page filled: the window's last row (older ones unread).
    after: tuple[datetime, str] | None
    # A search only: the window's size, and when it was cut before the oldest job, the
    # creation time of the last job it read (older jobs were not searched by this page).
    scan_rows: int | None = None
    scanned_to: datetime | None = None


def jobs_page(conn: psycopg.Connection, where: JobFilter, *, limit: int, after: tuple[datetime, str] | None = None,
              columns: str = reads.LIST_COLUMNS, scan_rows: int = jobsearch.SCAN_ROWS) -> JobsPage:
    """Newest first, ``limit`` rows after the (created_at, id) cursor ``after``. A search no
    index serves reads at most ``scan_rows`` jobs, in one statement (see ``JobsPage``)."""
    after_at, after_id = after or (None, None)
    params = {**where.params(), "after_at": after_at, "after_id": after_id, "limit": limit + 1,
              "scan_rows": scan_rows}
    names, has_after = where.names(), after is not None
    if not where.scans:
        rows = db.dicts(conn, reads.jobs_page(columns, names, has_after), params)
        if len(rows) > limit:
            return JobsPage(rows[:limit], _cursor(rows[limit - 1]))
        return JobsPage(rows, None)
    got = db.dicts(conn, reads.window_page(columns, names, has_after), params)
    rows = [r for r in got if r["hit"] and r["i"] <= scan_rows]
    if len(rows) > limit:
        page = JobsPage(rows[:limit], _cursor(rows[limit - 1]), scan_rows)
    else:
        # The page read its whole window; the window's last row and the one after it came
        # last: with the second, older jobs were left unread and the next page starts there.
        cut = any(r["i"] > scan_rows for r in got)
        edge = next((r for r in got if r["i"] == scan_rows), None) if cut else None
        page = JobsPage(rows, _cursor(edge) if edge else None, scan_rows, edge["created_at"] if edge else None)
    for r in got:
        del r["hit"], r["i"]
    return page


def _cursor(row: dict[str, Any]) -> tuple[datetime, str]:
    return row["created_at"], str(row["id"])


# A count past this is the planner's estimate: an exact one would read every matching row.
COUNT_EXACT_UPTO = 10_000
# How a count that is not exact was made (the API's "estimated_by", the pages' notes).
BY_PLANNER = (f"the planner's estimate from the tables' statistics (pg_class.reltuples, pg_stats), "
              f"past an exact count of {COUNT_EXACT_UPTO:,}")
BY_WINDOW = f"the matches among the newest {jobsearch.SCAN_ROWS:,} jobs: at least this many"
BY_DAY_STATISTICS = ("each failed day's statistics: its rows (pg_class.reltuples) times the queue's "
                     "frequency among them (pg_stats), as the planner estimates")


@dataclass(frozen=True)
class Count:
    """How many jobs match; past what can be counted at once, an estimate that says how
    it was made (``estimated_by``, None when exact)."""

    n: int
    estimated_by: str | None = None
    # A search's count (the matches in its window) when older jobs were left uncounted:
    # the creation time of the last job it read. The count is then a lower bound.
    counted_to: datetime | None = None

    @property
    def exact(self) -> bool:
        return self.estimated_by is None

    def json(self) -> dict[str, Any]:
        return {"count": self.n, "exact": self.exact, "estimated_by": self.estimated_by,
                **({"counted_to": self.counted_to} if self.counted_to is not None else {})}


def count_jobs(conn: psycopg.Connection, where: JobFilter, *, scan_rows: int = jobsearch.SCAN_ROWS) -> Count:
    """Exact up to COUNT_EXACT_UPTO (indexed filters: every row read matches, so that many
    at most are read), the planner's estimate past it. A search no index serves counts
    its matches in its window of the newest ``scan_rows`` jobs (a lower bound when older
    ones were left uncounted)."""
    names, params = where.names(), where.params()
    if where.scans:
        matches, edge = conn.execute(reads.window_count(names), {**params, "scan_rows": scan_rows}).fetchone() or (0, None)
        return Count(int(matches), None if edge is None else BY_WINDOW, edge)
    row = conn.execute(reads.count_upto(names), {**params, "upto": COUNT_EXACT_UPTO + 1}).fetchone()
    exact = int(row[0]) if row else 0
    if exact <= COUNT_EXACT_UPTO:
        return Count(exact)
    with psycopg.ClientCursor(conn) as cur:  # EXPLAIN takes no bind parameters
        plan = cur.execute(reads.count_plan(names), params).fetchone()
    live = conn.execute(reads.count_log_live(names), {**params, "upto": COUNT_EXACT_UPTO + 1}).fetchone()
    estimate = (int(plan[0][0]["Plan"]["Plan Rows"]) if plan else 0) + (int(live[0]) if live else 0)
    return Count(max(estimate, exact), BY_PLANNER)


def page_count(conn: psycopg.Connection, where: JobFilter, page: JobsPage, *, first: bool) -> Count:
    """The count beside a page: a search's first page that read its whole window has
    counted its matches already (no second read); otherwise ``count_jobs``."""
    if first and page.scan_rows is not None and (page.after is None or page.scanned_to is not None):
        return Count(len(page.rows), None if page.scanned_to is None else BY_WINDOW, page.scanned_to)
    return count_jobs(conn, where)


def change_matching(conn: psycopg.Connection, where: JobFilter, change: Callable[[psycopg.Connection, str], bool],
                    *, limit: int, scan_rows: int = jobsearch.SCAN_ROWS) -> tuple[list[str], int]:
    """Apply ``change`` (retry_job, cancel_job) to up to ``limit`` jobs matching ``where``,
    oldest first, one job at a time (each is its own fenced statement); a search covers
    the jobs of its window (the newest ``scan_rows``), as its listing and count do.
    Returns the ids changed and how many matched."""
    ids = matching_ids(conn, where, limit=limit, scan_rows=scan_rows)
    return [i for i in ids if change(conn, i)], len(ids)


def matching_ids(conn: psycopg.Connection, where: JobFilter, *, limit: int,
                 scan_rows: int = jobsearch.SCAN_ROWS) -> list[str]:
    """Up to ``limit`` ids matching ``where``, oldest first (a search: within its window)."""
    params = {**where.params(), "limit": limit, "scan_rows": scan_rows}
    return [r[0] for r in conn.execute(reads.matching_ids(where.names(), where.scans), params).fetchall()]


def counts_by_status(conn: psycopg.Connection) -> dict[str, Count]:
    """Jobs per status (JOB_STATUSES), each exact up to COUNT_EXACT_UPTO."""
    return {s: count_jobs(conn, JobFilter(status=s)) for s in JOB_STATUSES}


def failed_by_queue(conn: psycopg.Connection) -> tuple[dict[str, int], str | None]:
    """Failed jobs kept per queue, and how they were estimated (None: counted): counted
    while the failed days hold COUNT_EXACT_UPTO rows or fewer, else from their statistics."""
    few = count_jobs(conn, JobFilter(status="failed")).exact
    statement, how = (reads.FAILED_BY_QUEUE, None) if few else (reads.FAILED_BY_QUEUE_ESTIMATE, BY_DAY_STATISTICS)
    return {q: int(n) for q, n in conn.execute(statement).fetchall()}, how


def queue_names(conn: psycopg.Connection) -> list[str]:
    """The queues a filter may name (reads.QUEUE_NAMES: never a read of the jobs)."""
    return [q for (q,) in conn.execute(reads.QUEUE_NAMES).fetchall()]


def workers(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """The `workers` registry: live processes and those stopped in the last hour."""
    return db.dicts(conn, registry.LIST)


def schedule_state(conn: psycopg.Connection, *, runs: int) -> tuple[dict[str, dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """Per schedule: its lock row (last fire) and its ``runs`` most recent runs."""
    with conn.cursor(row_factory=dict_row) as cur:
        locks = {r["job_name"]: r for r in cur.execute(scheduler_sql.LOCKS).fetchall()}
        recent: dict[str, list[dict[str, Any]]] = {}
        for r in cur.execute(scheduler_sql.RECENT_RUNS, {"per_schedule": runs}).fetchall():
            recent.setdefault(r["job_name"], []).append(r)
    return locks, recent


def pause_queue(conn: psycopg.Connection, queue: str, reason: str | None = None, who: str | None = None) -> bool:
    """Stop claims from ``queue`` on every host (running jobs finish). False: already paused."""
    params = {"queue": queue, "who": who or operator(), "reason": reason}
    return conn.execute(sql.PAUSE_QUEUE, params).fetchone() is not None


def resume_queue(conn: psycopg.Connection, queue: str) -> bool:
    """Let ``queue`` be claimed again, waking idle consumers. False: it was not paused."""
    return conn.execute(sql.RESUME_QUEUE, {"queue": queue}).fetchone() is not None


def paused_queues(conn: psycopg.Connection) -> list[dict[str, Any]]:
    return db.dicts(conn, sql.PAUSED_QUEUES)


def schedule_history(conn: psycopg.Connection, name: str, limit: int = 20) -> list[dict[str, Any]]:
    """The most recent runs of one schedule, newest first."""
    return db.dicts(conn, scheduler_sql.HISTORY, {"name": name, "limit": limit})


def latest_runs(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """The latest run of every schedule."""
    return db.dicts(conn, scheduler_sql.LATEST_RUNS)


def masters(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """Every master's registry row, freshest first, with ``beat_age`` in seconds."""
    return db.dicts(conn, registry.MASTERS)


def live_processes_by_role(conn: psycopg.Connection) -> dict[str, int]:
    """Processes per role that beat recently, on every host."""
    rows = conn.execute(registry.LIVE_BY_ROLE, {"fresh_s": 3 * defaults.HEARTBEAT_SECONDS}).fetchall()
    return {role: n for role, n in rows}
