"""A job inserted by SQL through the jobs view (psql, another language) that the log can
hold goes to it (migration 055's jobs_view_write): due now into job_log, with a run_at to
come into job_timers, its dedupe key taken in job_keys, a limit key the log takes on its
row; the view, its defaults and its edits (UPDATE, DELETE) work as they did; a worker runs it
once; every other row (a rate limit, a running or finished row) goes where it went."""

from __future__ import annotations

import threading
import time
from typing import Any

import dramatiq
import psycopg
import pytest

from tests.conftest import in_process_worker, scalar, wait_for
from tests.run_notes import most_at_once

QUEUE = "by-sql"


def where(conn: psycopg.Connection, job: Any) -> list[str]:
    """The tables that hold a live row of the job."""
    return [t for t in ("job_log", "job_timers", "job_queue", "job_history")
            if scalar(conn, f"SELECT count(*) FROM {t} WHERE id = %s", (job,))]  # noqa: S608 (names above)


def test_a_row_inserted_by_sql_goes_to_the_log_shows_as_before_and_runs_once(conn, broker):
    runs: list[Any] = []
    lock = threading.Lock()

    @dramatiq.actor(broker=broker, queue_name=QUEUE, actor_name="vi_record", max_retries=0)
    def record(n: int, key: str | None = None) -> None:
        with lock:
            runs.append(n)
        time.sleep(0.05)
        if n < 0:
            raise ValueError("one attempt: the actor's budget")

    job = scalar(conn, "INSERT INTO jobs (queue, actor, kwargs, priority) VALUES (%s, 'vi_record', '{\"n\": 1}', 3)"
                       " RETURNING id", (QUEUE,))
    assert where(conn, job) == ["job_log"]
    assert conn.execute("SELECT status, queue, actor, kwargs, priority, attempts, max_attempts, lease_losses"
                        " FROM jobs WHERE id = %s", (job,)).fetchone() \
        == ("pending", QUEUE, "vi_record", {"n": 1}, 3, 0, None, 0)
    later = scalar(conn, "INSERT INTO jobs (queue, actor, kwargs, run_at) VALUES (%s, 'vi_record', '{\"n\": 2}',"
                         " now() + interval '1 hour') RETURNING id", (QUEUE,))
    assert where(conn, later) == ["job_timers"]
    assert scalar(conn, "SELECT run_at > now() + interval '50 minutes' FROM jobs WHERE id = %s AND status = 'pending'",
                  (later,))
    bad = scalar(conn, "INSERT INTO jobs (queue, actor, args) VALUES (%s, 'vi_record', '[-1]') RETURNING id", (QUEUE,))
    # the dedupe key: taken by the first row; a second insert of it writes no row
    keyed = scalar(conn, "INSERT INTO jobs (queue, actor, args, dedupe_key) VALUES (%s, 'vi_record', '[3]', 'vi-k')"
                         " RETURNING id", (QUEUE,))
    assert conn.execute("INSERT INTO jobs (queue, actor, args, dedupe_key) VALUES (%s, 'vi_record', '[4]', 'vi-k')"
                        " RETURNING id", (QUEUE,)).fetchall() == []
    assert [str(r[0]) for r in conn.execute("SELECT job_id FROM job_keys WHERE key = 'vi-k'")] == [str(keyed)]
    # an id a live job has is refused, as job_queue's key refused it
    with pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute("INSERT INTO jobs (id, queue, actor) VALUES (%s, %s, 'vi_record')", (job, QUEUE))
    with in_process_worker(broker, [QUEUE]):
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE id = ANY(%s::uuid[])"
                                      " AND status IN ('succeeded', 'failed')", ([job, bad, keyed],)) == 3, 30,
                 message="the three due jobs to end")
    assert sorted(runs) == [-1, 1, 3]
    assert dict(conn.execute("SELECT id, status FROM jobs WHERE id = ANY(%s::uuid[])", ([job, bad, keyed],))) \
        == {job: "succeeded", bad: "failed", keyed: "succeeded"}
    assert scalar(conn, "SELECT max_attempts FROM jobs WHERE id = %s", (bad,)) is None  # filled in by its worker
    assert scalar(conn, "SELECT count(*) FROM job_queue") == 0
    assert conn.execute("SELECT DISTINCT from_status, to_status FROM job_events WHERE job_id = %s", (bad,)).fetchall() \
        == [("running", "failed")]


def test_a_concurrency_keyed_row_holds_its_limit_in_the_log(conn, broker):
    spans: list[tuple[float, float]] = []
    lock = threading.Lock()

    @dramatiq.actor(broker=broker, queue_name=QUEUE, actor_name="vi_slow", max_retries=0)
    def slow(n: int) -> None:
        began = time.monotonic()
        time.sleep(0.1)
        with lock:
            spans.append((began, time.monotonic()))

    ids = [scalar(conn, "INSERT INTO jobs (queue, actor, args, flow_key, flow, concurrency_key) VALUES"
                        " (%s, 'vi_slow', jsonb_build_array(%s::int), 'vi-one', '{\"c\": 1}', 'vi-one') RETURNING id",
                  (QUEUE, n)) for n in range(4)]
    assert {w for j in ids for w in where(conn, j)} == {"job_log"}
    with in_process_worker(broker, [QUEUE]):
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE id = ANY(%s::uuid[]) AND status = 'succeeded'",
                                (ids,)) == 4, 30, message="the keyed rows to end")
    assert len(spans) == 4 and most_at_once(spans) == 1
    assert conn.execute("SELECT DISTINCT concurrency_key, flow_key FROM jobs WHERE id = ANY(%s::uuid[])",
                        (ids,)).fetchall() == [("vi-one", "vi-one")]


def test_rows_the_log_cannot_hold_go_where_they_went_and_edits_work_as_before(conn):
    rated = scalar(conn, "INSERT INTO jobs (queue, actor, flow_key, flow) VALUES (%s, 'a', 'vi-r', '{\"r\": 1.0}')"
                         " RETURNING id", (QUEUE,))
    assert where(conn, rated) == ["job_log"]  # the log paces a rate (054)
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (rated,)) == "pending"
    one_slot = scalar(conn, "INSERT INTO jobs (queue, actor, concurrency_key) VALUES (%s, 'a', 'vi-c') RETURNING id",
                      (QUEUE,))
    running = scalar(conn, "INSERT INTO jobs (queue, actor, status, lease_owner, claimed_at) VALUES"
                           " (%s, 'a', 'running', 'someone', now()) RETURNING id", (QUEUE,))
    failed = scalar(conn, "INSERT INTO jobs (queue, actor, status, finished_at) VALUES (%s, 'a', 'failed', now())"
                          " RETURNING id", (QUEUE,))
    assert [where(conn, j) for j in (one_slot, running, failed)] == [["job_queue"], ["job_queue"], ["job_history"]]
    # an edit of a log job through the view: applied, the job left in the log (057)
    logged = scalar(conn, "INSERT INTO jobs (queue, actor) VALUES (%s, 'a') RETURNING id", (QUEUE,))
    timed = scalar(conn, "INSERT INTO jobs (queue, actor, run_at) VALUES (%s, 'a', now() + interval '1 hour')"
                         " RETURNING id", (QUEUE,))
    assert conn.execute("UPDATE jobs SET priority = 9 WHERE id = ANY(%s::uuid[])", ([logged, timed],)).rowcount == 2
    assert dict(conn.execute("SELECT id, priority FROM jobs WHERE id = ANY(%s::uuid[])", ([logged, timed],))) \
        == {logged: 9, timed: 9}
    assert (where(conn, logged), where(conn, timed)) == (["job_log"], ["job_timers"])
    gone = scalar(conn, "INSERT INTO jobs (queue, actor) VALUES (%s, 'a') RETURNING id", (QUEUE,))
    assert conn.execute("DELETE FROM jobs WHERE id = %s", (gone,)).rowcount == 1
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE id = %s AND status IN ('pending', 'running')", (gone,)) == 0

