"""The job log's storage (migration 039, supervisor/broker/sql/joblog.py) on the real
server: claims follow producers' transactions (a late commit is claimed, never skipped; a
rollback never), priority levels, the done row as the one fence for every outcome,
releases, cancels, pauses and retention by dropping days."""

from __future__ import annotations

import json
import random
import threading
import uuid
from collections.abc import Sequence
from datetime import date, timedelta
from typing import Any

import psycopg
import pytest

from supervisor import admin
from supervisor.broker.consuming.completer import Finish, log_finish_params
from supervisor.broker.logstore import LogRow, release_params
from supervisor.broker.sql import joblog, timers
from tests.conftest import plan_buffers, scalar

QUEUE = "log"
OWNER = "log-host:1:aaaaaa"


def messages(n: int, *, priority: int = 0, queue: str = QUEUE) -> dict[str, list[Any]]:
    """LOG_INSERT's parameters for n no-op messages."""
    ids = [str(uuid.uuid4()) for _ in range(n)]
    return {"id": ids, "queue": [queue] * n, "actor": ["noop"] * n, "args": [json.dumps([i]) for i in range(n)],
            "kwargs": ["{}"] * n, "options": ["{}"] * n, "payload": [None] * n, "priority": [priority] * n,
            "max_attempts": [None] * n, "max_lease_losses": [None] * n, "message_timestamp": [None] * n}


def enqueue(conn: psycopg.Connection, n: int, **kw: Any) -> list[str]:
    params = messages(n, **kw)
    conn.execute(joblog.LOG_INSERT, params)
    return params["id"]


def claim(conn: psycopg.Connection, n: int, *, owner: str = OWNER, lease_s: float = 30.0,
          queue: str = QUEUE) -> list[Any]:
    params = {"queue": queue, "n": n, "owner": owner, "lease_s": lease_s, "relaxed": False}
    return conn.execute(joblog.LOG_CLAIM, params).fetchall()


def finish(conn: psycopg.Connection, rows: Sequence[Any], kind: str = "succeeded", *, owner: str = OWNER,
           ended: Sequence[int] = (), delay_ms: int | None = None, error: str | None = None) -> int:
    """LOG_FINISH for claimed ``rows`` (batch, seq, day, id, ..., attempt at 7); how many it wrote."""
    outcomes = [Finish(str(r[3]), r[7], kind, error=error, delay_ms=delay_ms) for r in rows]
    where = [LogRow(r[1], r[2], r[0], r[4], r[5], r[14]) for r in rows]
    return conn.execute(joblog.LOG_FINISH, log_finish_params(owner, outcomes, where, ended)).fetchone()[0]


def release(conn: psycopg.Connection, owners: Sequence[str] = (), max_losses: int = 3) -> list[Any]:
    params = release_params("test", why="test", margin_s=None if owners else 0.0, owners=owners)
    return [(r[0], r[1] == "failed") for r in conn.execute(joblog.LOG_RELEASE, {**params, "max_losses": max_losses})]


def cancel(conn: psycopg.Connection, job: str) -> list[Any]:
    return conn.execute(joblog.LOG_CANCEL, {"id": job, "who": "test", "reason": "by test"}).fetchall()


def test_claims_take_each_committed_row_once_in_order(conn: psycopg.Connection) -> None:
    ids = enqueue(conn, 10)
    first = claim(conn, 4)
    second = claim(conn, 100)
    assert [str(r[3]) for r in first + second] == ids
    assert claim(conn, 10) == []
    assert [json.loads(r[6])[0] for r in first] == [[0], [1], [2], [3]]
    assert {r[7] for r in first + second} == {1}  # attempt
    assert len({r[0] for r in first}) == 1 and first[0][0] != second[0][0]  # a lease row a batch
    assert finish(conn, first, ended=[first[0][0]]) == 4
    assert scalar(conn, "SELECT count(*) FROM job_lease") == 1
    assert scalar(conn, "SELECT count(*) FROM job_done WHERE status = 'succeeded'") == 4


def test_higher_priority_first_then_each_level_in_order(conn: psycopg.Connection) -> None:
    low = enqueue(conn, 3, priority=0)
    high = enqueue(conn, 2, priority=5)
    rows = claim(conn, 4)
    assert [str(r[3]) for r in rows] == high + low[:2]
    more = enqueue(conn, 1, priority=5)
    assert [str(r[3]) for r in claim(conn, 10)] == more + low[2:]


def test_a_transaction_that_commits_late_is_claimed_and_a_rollback_never(database_url: str,
                                                                          conn: psycopg.Connection) -> None:
    with psycopg.connect(database_url) as early, psycopg.connect(database_url) as doomed:
        early_ids = enqueue(early, 2)  # its seqs come first, its commit last
        enqueue(doomed, 2)
        late_ids = enqueue(conn, 2)
        assert [str(r[3]) for r in claim(conn, 10)] == late_ids
        early.commit()
        doomed.rollback()
    assert [str(r[3]) for r in claim(conn, 10)] == early_ids
    assert claim(conn, 10) == []


def test_an_open_transaction_does_not_make_claims_read_from_its_start(database_url: str,
                                                                      conn: psycopg.Connection) -> None:
    """A producer's transaction held open is a lookup of the windows after it, not a range
    from its xid: claims meanwhile read only what they take."""
    with psycopg.connect(database_url) as held:
        held_ids = enqueue(held, 1)
        for _ in range(30):
            enqueue(conn, 20)
            assert len(claim(conn, 20)) == 20
        buffers = _claim_buffers(conn)
        held.commit()
    assert 10 < buffers < 150, buffers  # a range from its xid would visit the 600 rows claimed since
    rest = [str(r[3]) for r in claim(conn, 100)]
    assert rest[:1] == held_ids and len(rest) == 21  # and the 20 the measured claim rolled back


def _claim_buffers(conn: psycopg.Connection) -> int:
    """Shared buffers one claim of 20 reads (its function's statements included), rolled back."""
    enqueue(conn, 20)
    params = {"queue": QUEUE, "n": 20, "owner": OWNER, "lease_s": 30.0, "relaxed": False}
    return plan_buffers(conn, joblog.LOG_CLAIM, params)


def test_concurrent_producers_and_claimers_take_every_committed_row_exactly_once(database_url: str,
                                                                                  conn: psycopg.Connection) -> None:
    committed: list[str] = []
    claimed: list[str] = []
    lock = threading.Lock()
    producing = threading.Event()
    producing.set()

    def produce(seed: int) -> None:
        rnd = random.Random(seed)
        with psycopg.connect(database_url) as c:
            for _ in range(40):
                ids = []
                for _ in range(rnd.randint(1, 3)):  # a transaction of 1-3 statements
                    ids += enqueue(c, rnd.randint(1, 5))
                if rnd.random() < 0.2:
                    c.rollback()
                else:
                    c.commit()
                    with lock:
                        committed.extend(ids)

    def drain(owner: str) -> None:
        with psycopg.connect(database_url, autocommit=True) as c:
            while True:
                rows = claim(c, 7, owner=owner)
                with lock:
                    claimed.extend(str(r[3]) for r in rows)
                if rows:
                    finish(c, rows, owner=owner, ended=[rows[0][0]])
                elif not producing.is_set():
                    return

    producers = [threading.Thread(target=produce, args=(i,)) for i in range(4)]
    claimers = [threading.Thread(target=drain, args=(f"c{i}",)) for i in range(3)]
    for t in producers + claimers:
        t.start()
    for t in producers:
        t.join()
    producing.clear()
    for t in claimers:
        t.join()
    rest = [str(r[3]) for r in claim(conn, 10_000)]
    assert sorted(claimed + rest) == sorted(committed)
    assert len(set(claimed + rest)) == len(claimed + rest)


def test_a_released_attempt_is_appended_again_and_its_late_ack_counts_nothing(conn: psycopg.Connection) -> None:
    enqueue(conn, 2)
    rows = claim(conn, 2, lease_s=-1)  # expired at once
    assert sorted(r[0] for r in release(conn)) == sorted(str(r[3]) for r in rows)
    assert finish(conn, rows) == 0  # the reaper's done rows came first
    again = claim(conn, 10, owner="other")
    assert sorted(str(r[3]) for r in again) == sorted(str(r[3]) for r in rows)
    assert {(r[7], r[9]) for r in again} == {(2, 1)}  # attempt 2, one lease loss
    assert finish(conn, again, owner="other", ended=[again[0][0]]) == 2
    assert scalar(conn, "SELECT count(*) FROM job_lease") == 0
    statuses = conn.execute("SELECT status, count(*) FROM job_done GROUP BY 1 ORDER BY 1").fetchall()
    assert statuses == [("released", 2), ("succeeded", 2)]


def test_a_dead_owner_s_rows_are_released_and_lease_losses_fail_a_job_at_its_budget(conn: psycopg.Connection) -> None:
    (job,) = enqueue(conn, 1)
    for loss in range(1, 3):
        (row,) = claim(conn, 1, owner=f"dead{loss}")
        assert row[9] == loss - 1
        assert release(conn, owners=[f"dead{loss}"], max_losses=2) == [(job, loss == 2)]
    assert claim(conn, 1) == []
    assert scalar(conn, "SELECT status FROM job_done ORDER BY finished_at DESC, seq DESC LIMIT 1") == "failed"
    # the view counts every loss, the last one too (it is on no log row; the archive:
    # test_retention_drops_days_and_keeps_what_has_not_ended)
    assert conn.execute("SELECT status, attempts, lease_losses FROM jobs WHERE id = %s", (job,)).fetchone() == (
        "failed", 2, 2)
    # an operator's retry carries the count on, with room for one loss more
    assert admin.retry_job(conn, job)
    assert conn.execute("SELECT status, attempts, lease_losses, max_lease_losses FROM jobs WHERE id = %s",
                        (job,)).fetchone() == ("pending", 2, 2, 3)
    assert scalar(conn, "SELECT count(*) FROM job_queue") == 0  # back in the log, not the mutable table
    (row,) = claim(conn, 1)
    assert (str(row[3]), row[7], row[9], row[10]) == (job, 3, 2, 3)  # attempt 3, 2 losses of a budget of 3


def test_a_retry_goes_to_job_timers_and_a_requeue_back_to_the_log_uncounted(conn: psycopg.Connection) -> None:
    a, b = enqueue(conn, 2)
    ra, rb = claim(conn, 2)
    finish(conn, [ra], "retry", delay_ms=3_600_000, error="boom")
    finish(conn, [rb], "requeue", ended=[rb[0]])
    row = conn.execute("SELECT id::text, status, attempts, last_error, run_at > now() FROM job_timers").fetchone()
    assert row == (a, "retryable", 1, "boom", True)
    assert scalar(conn, "SELECT count(*) FROM job_queue") == 0
    assert conn.execute("SELECT status, attempts, last_error FROM jobs WHERE id = %s", (a,)).fetchall() == [
        ("retryable", 1, "boom")]
    (again,) = claim(conn, 10)
    assert (str(again[3]), again[7]) == (b, 1)  # the same attempt number: it never ran


def test_a_limited_job_waits_in_job_timers_pending_its_attempt_not_counted(conn: psycopg.Connection) -> None:
    # RateLimited with no limit key on the row: put back for its delay, in job_timers (never
    # job_queue, whose claims step over dead versions under a pinned horizon), and claimed
    # again from the log once due with the same attempt number.
    (job,) = enqueue(conn, 1)
    (row,) = claim(conn, 1)
    finish(conn, [row], "limited", delay_ms=0, error="slow down", ended=[row[0]])
    assert scalar(conn, "SELECT count(*) FROM job_queue") == 0
    assert conn.execute("SELECT id::text, status, attempts FROM job_timers").fetchone() == (job, "pending", 0)
    assert conn.execute("SELECT status, attempts FROM jobs WHERE id = %s", (job,)).fetchall() == [("pending", 0)]
    due = {"queue": QUEUE, "n": 1, "owner": OWNER, "lease_s": 30.0, "relaxed": False, "tfloor": None, "tlimit": 1000}
    promoted = [r for r in conn.execute(timers.LOG_CLAIM_DUE, due).fetchall() if r[3] is not None]
    (again,) = promoted or claim(conn, 1)  # the promoting claim may not see the rows it moved
    assert (str(again[3]), again[7]) == (job, 1)  # the attempt it never ran, not counted


def test_cancel_passes_over_a_pending_job_and_fences_a_running_one(conn: psycopg.Connection) -> None:
    pending, running = enqueue(conn, 2)
    (row,) = claim(conn, 1)
    assert str(row[3]) == pending
    for job in (pending, running):
        assert cancel(conn, job) == [(uuid.UUID(job),)]
    assert claim(conn, 10) == []
    assert finish(conn, [row]) == 0
    assert scalar(conn, "SELECT count(*) FROM job_done WHERE status = 'cancelled'") == 2


def test_a_paused_queue_gets_no_claims(conn: psycopg.Connection) -> None:
    enqueue(conn, 1)
    conn.execute("INSERT INTO queue_pauses (queue) VALUES (%s)", [QUEUE])
    assert claim(conn, 1) == []
    conn.execute("DELETE FROM queue_pauses")
    assert len(claim(conn, 1)) == 1


def test_retention_drops_days_and_keeps_what_has_not_ended(conn: psycopg.Connection) -> None:
    old = "2000-01-01"
    conn.execute("SELECT job_log_add_day(%s::date)", [old])
    done, failed, waiting = (str(uuid.uuid4()) for _ in range(3))
    poisoned = str(uuid.uuid4())
    conn.execute("INSERT INTO job_log (seq, day, id, queue, actor, lease_losses) VALUES (1, %(d)s, %(a)s, 'log', 'noop', 0),"
                 " (2, %(d)s, %(b)s, 'log', 'noop', 0), (3, %(d)s, %(c)s, 'log', 'noop', 0),"
                 " (4, %(d)s, %(p)s, 'log', 'noop', 2)",
                 {"d": old, "a": done, "b": failed, "c": waiting, "p": poisoned})
    conn.execute("INSERT INTO job_done (seq, day, id, queue, actor, created_at, status, attempt, lease_losses, last_error)"
                 " VALUES (1, %(d)s, %(a)s, 'log', 'noop', now(), 'succeeded', 1, NULL, NULL),"
                 " (2, %(d)s, %(b)s, 'log', 'noop', now(), 'failed', 1, NULL, 'boom'),"
                 " (4, %(d)s, %(p)s, 'log', 'noop', now(), 'failed', 3, 3, 'poison pill')",  # as LOG_RELEASE writes it
                 {"d": old, "a": done, "b": failed, "p": poisoned})
    conn.execute("SELECT job_log_drop_before(%s::date)", ["2000-01-02"])
    assert scalar(conn, "SELECT to_regclass('job_log_d20000101')") is None
    assert scalar(conn, "SELECT to_regclass('job_done_d20000101')") is None
    assert conn.execute("SELECT id::text, day = job_log_today() FROM job_log").fetchall() == [(waiting, True)]
    assert sorted(conn.execute("SELECT id::text, status, last_error, lease_losses FROM job_history").fetchall()) == sorted(
        [(failed, "failed", "boom", 0), (poisoned, "failed", "poison pill", 3)])


def test_a_day_a_lease_names_is_kept(conn: psycopg.Connection) -> None:
    old = "2000-01-01"
    conn.execute("SELECT job_log_add_day(%s::date)", [old])
    conn.execute("INSERT INTO job_log (day, id, queue, actor) VALUES (%s, gen_random_uuid(), 'log', 'noop')", [old])
    (row,) = claim(conn, 1)
    conn.execute("SELECT job_log_drop_before(%s::date)", ["2000-01-02"])
    assert scalar(conn, "SELECT to_regclass('job_log_d20000101')") is not None
    finish(conn, [row], ended=[row[0]])
    conn.execute("SELECT job_log_drop_before(%s::date)", ["2000-01-02"])
    assert scalar(conn, "SELECT to_regclass('job_log_d20000101')") is None


@pytest.mark.parametrize("n", [0, -1])
def test_a_claim_of_nothing_takes_nothing(conn: psycopg.Connection, n: int) -> None:
    enqueue(conn, 1)
    assert claim(conn, n) == []


def test_the_upkeep_makes_days_ahead_and_drops_the_days_past_retention(conn: psycopg.Connection) -> None:
    """LOG_ADD_DAY and LOG_DROP_DAYS as the upkeep runs them (worker/upkeep.py)."""
    today: date = scalar(conn, "SELECT job_log_today()")  # the UTC date (041)
    conn.execute(joblog.LOG_ADD_DAY, {"days": 3})
    assert scalar(conn, "SELECT to_regclass(%s)", [f"job_log_d{(today + timedelta(days=3)):%Y%m%d}"])
    yesterday = today - timedelta(days=1)
    conn.execute("INSERT INTO job_log (day, id, queue, actor) VALUES (%s, gen_random_uuid(), 'log', 'noop')",
                 [yesterday])
    conn.execute(joblog.LOG_DROP_DAYS, {"older_than_s": 0})  # yesterday is past a retention of 0
    assert scalar(conn, "SELECT to_regclass(%s)", [f"job_log_d{yesterday:%Y%m%d}"]) is None
    assert scalar(conn, "SELECT day FROM job_log") == today  # its waiting job moved on


def test_cursor_rows_no_claim_reads_are_pruned_and_each_level_keeps_its_newest(conn: psycopg.Connection) -> None:
    for _ in range(3):
        enqueue(conn, 2)
        enqueue(conn, 1, priority=5)
        claim(conn, 10)
    conn.execute("UPDATE job_cursor SET made_at = made_at - interval '2 minutes'")
    newest = conn.execute("SELECT DISTINCT ON (priority) priority, at FROM job_cursor ORDER BY priority, at DESC").fetchall()
    # 3 claims of 2 levels, and the first enqueue's cursor of each level: all but the newest two go
    assert conn.execute(joblog.LOG_PRUNE_CURSORS, {"limit": 100}).rowcount == 6
    assert conn.execute("SELECT priority, at FROM job_cursor ORDER BY priority").fetchall() == newest
    enqueue(conn, 1)
    assert len(claim(conn, 10)) == 1  # the kept rows are where the claims go on


def test_the_jobs_view_shows_each_log_job_once_by_its_state(conn: psycopg.Connection) -> None:
    """Pending (past no cursor), running (leased), finished (a final done row); an attempt
    that went on as another row is shown as that row."""
    done_id, failed_id, running_id, released_id, pending_id = enqueue(conn, 5)
    rows = claim(conn, 4, lease_s=-1)  # all but the last, under a lease that expired at once
    by_id = {str(r[3]): r for r in rows}
    finish(conn, [by_id[done_id]])
    finish(conn, [by_id[failed_id]], "failed", error="boom")
    conn.execute("UPDATE job_lease SET seqs = array_remove(seqs, %s)", [by_id[released_id][1]])  # keep one leased
    conn.execute("INSERT INTO job_lease (owner, expires_at, seqs, days) VALUES ('x', now() - interval '1 hour', %s, %s)",
                 [[by_id[released_id][1]], [by_id[released_id][2]]])
    conn.execute("UPDATE job_lease SET expires_at = now() + interval '1 hour' WHERE owner = %s", [OWNER])
    assert [r[0] for r in release(conn)] == [released_id]
    seen = dict(conn.execute("SELECT id::text, status FROM jobs").fetchall())
    assert seen == {done_id: "succeeded", failed_id: "failed", running_id: "running", released_id: "pending",
                    pending_id: "pending"}
    assert scalar(conn, "SELECT count(*) FROM jobs") == 5
    assert dict(conn.execute("SELECT status, count(*) FROM jobs_live GROUP BY 1").fetchall()) == {"running": 1,
                                                                                                   "pending": 2}
    assert scalar(conn, "SELECT args FROM jobs WHERE id = %s", [failed_id]) == [1]


def test_a_claim_of_a_new_window_reads_from_the_window_not_from_the_level_s_first_row(
        conn: psycopg.Connection) -> None:
    """Streaming under a held horizon: every claim drains its window, the next one starts a
    new window. 4,000 rows claimed before: a claim reads the rows it takes (and a few index
    pages), never the level's earlier rows."""
    with psycopg.connect(conn.info.dsn) as pin, psycopg.connect(conn.info.dsn, autocommit=True) as producer:
        pin.execute("SELECT txid_current()")  # held: it is in every window's running transactions
        for i in range(200):
            enqueue(producer, 20)
            taken = len(claim(conn, 100))
            assert taken == 20, f"claim {i} took {taken} of the 20 rows committed just before it"
        buffers = _claim_buffers(conn)
        pin.rollback()
    assert buffers < 150, buffers  # 37-57 here; from the level's first row: 4,000 entries and their rows


def test_the_upkeep_s_statements_on_the_narrow_tables_run(conn: psycopg.Connection) -> None:
    """LOG_VACUUM_DUE and VACUUM_LOG as the upkeep's vacuum check runs them (the dead
    tuples it reads are the statistics collector's: counted here, not awaited)."""
    assert conn.execute(joblog.LOG_VACUUM_DUE, {"dead_rows": 10**9, "min_s": 0}).fetchall() == []
    conn.execute(joblog.VACUUM_LOG)
    assert scalar(conn, "SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = 'job_lease'") is not None


def test_the_failed_per_queue_estimate_counts_the_log_s_days(conn: psycopg.Connection) -> None:
    """Past the exact count, the dashboard estimates failed jobs per queue from statistics:
    the log's days hold every outcome, so their share of 'failed' multiplies in."""
    from supervisor.broker import reads

    conn.execute("INSERT INTO job_done (seq, day, id, queue, actor, created_at, status, attempt)"
                 " SELECT g, current_date, gen_random_uuid(), CASE WHEN g % 3 = 0 THEN 'b' ELSE 'a' END, 'x', now(),"
                 "        CASE WHEN g % 2 = 0 THEN 'failed' ELSE 'succeeded' END, 1"
                 "   FROM generate_series(1, 6000) AS g")
    conn.execute("ANALYZE job_done")
    counted = dict(conn.execute(reads.FAILED_BY_QUEUE).fetchall())
    estimated = dict(conn.execute(reads.FAILED_BY_QUEUE_ESTIMATE).fetchall())
    assert counted == {"a": 2000, "b": 1000}
    assert estimated.keys() == counted.keys()
    assert all(abs(estimated[q] - counted[q]) <= counted[q] * 0.15 for q in counted), estimated


@pytest.mark.parametrize("zone", ["Pacific/Kiritimati", "Pacific/Pago_Pago"])
def test_a_row_s_day_is_the_utc_date_of_its_insert_in_any_session_zone(conn: psycopg.Connection, zone: str) -> None:
    """041: a row's day is the UTC date of its insert, whatever the producer's time zone
    (UTC+14 and UTC-11 here: a day apart from UTC, either way, for most of a day)."""
    conn.execute("SELECT set_config('TimeZone', %s, false)", [zone])
    enqueue(conn, 1)
    assert conn.execute("SELECT day = (clock_timestamp() AT TIME ZONE 'UTC')::date, day = job_log_today()"
                        " FROM job_log").fetchone() == (True, True)


def test_a_bounded_window_still_takes_the_rows_a_transaction_it_saw_running_wrote_on_an_older_day(
        database_url: str, conn: psycopg.Connection) -> None:
    """A claim reads a window's later transactions only in the days between its snapshots
    (041), and a transaction its lo snapshot saw running in every day: its rows may be older
    than lo (one open since the day before, here a row of three days ago). With a week of
    days kept, every row is claimed once."""
    for back in range(2, 9):
        conn.execute("SELECT job_log_add_day(job_log_today() - %s)", [back])
    with psycopg.connect(database_url) as held:
        held.execute("INSERT INTO job_log (day, id, queue, actor) VALUES (job_log_today() - 3, %s, %s, 'noop')",
                     [old := str(uuid.uuid4()), QUEUE])
        taken = []
        for _ in range(5):  # windows move on, each with its times: lo_at is known from the second
            ids = enqueue(conn, 3)
            got = [str(r[3]) for r in claim(conn, 10)]
            assert got == ids
            taken += got
        assert scalar(conn, "SELECT count(*) FROM job_cursor WHERE lo_at IS NOT NULL") > 0
        held.commit()
    later = enqueue(conn, 2)
    rest = [str(r[3]) for r in claim(conn, 10)]
    assert sorted(rest) == sorted([old, *later]) and claim(conn, 10) == []
    assert len(set(taken + rest)) == 18


def test_an_earlier_attempt_s_outcome_finds_no_row_of_the_next_attempt() -> None:
    # A process may hold a job's next row (its retry appended again and claimed again) before
    # an earlier attempt's outcome is written: that outcome must not land on the next
    # attempt's row (tests/test_dropin's ten retries saw attempt 1's ack end attempt 2).
    from supervisor.broker.logstore import Batches

    batches = Batches()
    batches.hold([("job", LogRow(2, "2026-12-08", 7, "q", "a", "2026-12-08 00:00:00+00", attempt=2))])
    assert batches.row("job", 1) is None and batches.row("job", 2) is not None
    assert batches.split(["job", "job"], [1, 2]) == ([1], [batches.row("job")])
