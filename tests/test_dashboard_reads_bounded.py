"""Every read of the dashboard's pages and of the API's GET routes is bounded: none reads
the jobs tables whole, however many finished jobs they hold (issue 21, "Fast at 10 M").

Each page and route of ``bench/dashboard_reads.READS`` is served once by the real app (in
process, its pool's statements recorded) over a fill where most finished jobs lie outside
every window (``bench/dashboard_fill.py``: 120,000 over 7 days, 500 live; half of those
that ran in the job log's tables, job_log and job_done, as the default storage keeps them,
the rest in job_history). Each statement
that reads the jobs is then run again under EXPLAIN ANALYZE, its caps (a window's
``cap``, a search's ``scan_rows``, an exact count's ``upto``) set to CAP, and the rows
each scan of job_history, job_events, job_queue, job_log and job_done read are added up. As in
tests/test_table_health.py, sequential scans are priced out (a small table would be
read whole whatever its indexes); what counts is what is read rather than the plan's
shape: an index scan over every day is as unbounded as a Seq Scan.

Not EXPLAINed here: the exact count of failed jobs per queue (reads.FAILED_BY_QUEUE), run
only when a count_upto has found COUNT_EXACT_UPTO failed jobs or fewer."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from markupsafe import escape
from starlette.testclient import TestClient

from bench import dashboard_fill, dashboard_reads
from supervisor import admin, jobsearch
from tests.conftest import _throwaway, scalar

ROWS, LIVE = 120_000, 500
CAP = dashboard_reads.CAP
# Rows a statement may read from job_history, and from job_events: an hour of the fill
# (about 700 finished jobs), a capped window (CAP), and the Errors page's samples (20
# attempts for each of its 60 groups, each checked for a later attempt) fit in it; a
# day of the fill (17,000) or every failed attempt (36,000) does not.
BUDGET = 5_000
LOG_SHARE = 0.5


@pytest.fixture(scope="module")
def filled(worker_id: str) -> Iterator[str]:
    """A database of its own: the fill makes day partitions other tests do not expect."""
    with _throwaway(f"as_bounded_{worker_id}") as url:
        # a transaction running while the fill takes the log's cursors, as on a busy server:
        # their lo snapshots list it (the pending part once read the whole log for that)
        with psycopg.connect(url, autocommit=True) as conn, psycopg.connect(url) as running:
            running.execute("SELECT txid_current()")
            dashboard_fill.fill(conn, rows=ROWS, live=LIVE, days=7, log_share=LOG_SHARE)
            running.rollback()
            assert scalar(conn, "SELECT count(*) FROM job_cursor WHERE cardinality(ARRAY(SELECT pg_snapshot_xip(lo))) > 0") > 0
        yield url


def test_every_page_and_api_read_reads_a_bounded_slice_of_the_jobs(filled):
    recorded = dashboard_reads.Recorded()
    app = dashboard_reads.app(filled, recorded)
    with psycopg.connect(filled, autocommit=True) as conn:
        values = dashboard_reads.values(conn, ROWS)
        history = scalar(conn, "SELECT count(*) FROM job_history")
        done = scalar(conn, "SELECT count(*) FROM job_done")
        events = scalar(conn, "SELECT count(*) FROM job_events")
    # (the rare failure too) so that a whole read of any of them is far past BUDGET
    assert history + done == ROWS + 1 and min(history, done) > 40_000 and events > 30_000
    urls = [template.format(**values) for _, template in dashboard_reads.READS]
    # READS reaches every GET route the app has (an added page or route must be listed)
    assert dashboard_reads.uncovered(app, urls) == []

    client = TestClient(app)
    by_url: dict[str, list[tuple[str, Any]]] = {}
    try:
        for url in urls:
            answer = client.get(url)
            assert answer.status_code == 200 or (url == "/healthz" and answer.status_code == 503), (url, answer.text)
            by_url[url] = dashboard_reads.reads_of_jobs(recorded.taken())
    finally:
        app.state.supervisor.close()
    statements = {(t, repr(p)): (url, t, p) for url, found in by_url.items() for t, p in found}
    assert len(statements) > 40  # the pages' and routes' distinct reads (each window, each kind of filter)

    over = []
    with psycopg.connect(filled, autocommit=True) as conn:
        for url, text, params in statements.values():
            # seq scans priced out, as at millions of rows; jit off (it had made this test 220-290 s)
            read = dashboard_reads.rows_read_at_scale(conn, text, dashboard_reads.capped(params, CAP),
                                                      dashboard_reads.JOB_TABLES)
            # finished jobs and events: a window's worth at most; live rows: the backlog at
            # most, once for each arm of jobs_live (runnable rows, running rows)
            if max(read["job_history"], read["job_events"], read["job_log"], read["job_done"]) > BUDGET \
                    or read["job_queue"] > 2 * LIVE:
                over.append((url, read, " ".join(text.split())[:300]))
    assert not over, "\n".join(map(str, over))


def test_a_scan_of_the_jobs_view_is_priced_below_jit(filled):
    """An operator's count of the jobs view (psql, a reader's scan) is planned as what it is:
    the log's pending part was priced at millions of rows when there were none, so every
    count ran past JIT's thresholds and compiled for ~2 s to read for 60 ms."""
    with psycopg.connect(filled, autocommit=True) as conn:
        for query in ("SELECT count(*) FROM jobs", "SELECT status, count(*) FROM jobs GROUP BY status"):
            plan = scalar(conn, "EXPLAIN (FORMAT JSON) " + query)[0]["Plan"]
            assert plan["Total Cost"] < float(scalar(conn, "SELECT current_setting('jit_above_cost')")), (query, plan)
        pending = scalar(conn, "EXPLAIN (FORMAT JSON) SELECT * FROM job_log_pending()")[0]["Plan"]
        # none pending (each level's cursor is past its rows); priced at a fifth of the log's
        # rows at most (it was 2.28 M: 38 times the log)
        log_rows = scalar(conn, "SELECT count(*) FROM job_log")
        assert pending["Plan Rows"] < log_rows / 5 and scalar(conn, "SELECT count(*) FROM job_log_pending()") == 0


def test_counts_past_what_can_be_counted_say_about_and_how(filled):
    """On the same fill: a count past COUNT_EXACT_UPTO is the planner's estimate and says
    so (JSON and pages), a search's count is what its window holds, the failed jobs kept
    per queue are estimated from statistics, and the queue choices need no read of the jobs."""
    app = dashboard_reads.app(filled, dashboard_reads.Recorded())
    client = TestClient(app)
    with psycopg.connect(filled, autocommit=True) as conn:
        total = scalar(conn, "SELECT count(*) FROM jobs")
        by_status = dict(conn.execute("SELECT status, count(*) FROM jobs GROUP BY status").fetchall())
        failed = dict(conn.execute("SELECT queue, count(*) FROM jobs WHERE status = 'failed' GROUP BY queue").fetchall())
        rare = scalar(conn, "SELECT count(*) FILTER (WHERE queue = 'rare') FROM (SELECT queue FROM jobs"
                            " ORDER BY created_at DESC, id DESC LIMIT %s) AS w", (jobsearch.SCAN_ROWS,))
    try:
        count = client.get("/api/v1/jobs").json()["count"]
        assert (count["exact"], count["estimated_by"]) == (False, admin.BY_PLANNER)
        assert abs(count["count"] - total) < total / 20, (count, total)
        state = client.get("/api/v1/system/state").json()["jobs"]
        assert state["running"] == {"count": by_status["running"], "exact": True, "estimated_by": None}
        assert (state["succeeded"]["exact"], state["succeeded"]["estimated_by"]) == (False, admin.BY_PLANNER)
        assert abs(state["succeeded"]["count"] - by_status["succeeded"]) < by_status["succeeded"] / 20
        # a queue has no index: its count is the matches among the newest SCAN_ROWS jobs, at least
        window = client.get("/api/v1/jobs?queue=rare").json()
        assert window["count"]["count"] == rare and window["count"]["exact"] is False
        assert window["count"]["estimated_by"] == admin.BY_WINDOW and window["count"]["counted_to"]
        assert window["scan"]["rows"] == jobsearch.SCAN_ROWS

        page = client.get("/jobs").text
        assert '<p id="count">about ' in page and str(escape(admin.BY_PLANNER)) in page
        # the queue choices: those with live rows and those in the recorder's samples (rare)
        assert re.findall(r"<option[^>]*>([a-z]+)</option>", page.split('name="queue"')[1].split("</select>")[0]) \
            == sorted([*dashboard_fill.QUEUES, "rare"])
        queues = client.get("/queues").text
        for queue, n in failed.items():
            cell = re.search(rf'<tr data-queue="{queue}">.*?<td class="n failed"[^>]*>about (\d+)</td>', queues, re.S)
            assert cell and abs(int(cell[1]) - n) <= n / 20, (queue, n, cell and cell[1])
        # the rare group's sample, found by its own index
        groups = client.get("/api/v1/errors?since=7d").json()["groups"]
        monthly = next(g for g in groups if g["actor"] == "report_monthly")
        assert monthly["attempts"] == 1 and monthly["sample"]["message"] == "LookupError: no ledger for 1999-12"
    finally:
        app.state.supervisor.close()
