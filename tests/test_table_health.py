"""The jobs table stays small and fast: the upkeep's vacuum trigger, the prune's
batches and cadence, and the table settings of 025_jobs_bloat.sql. Real PostgreSQL."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from supervisor import db, error_groups
from supervisor.broker import PostgresBroker, reads
from supervisor.broker import sql as jobs_sql
from supervisor.broker.consuming.completer import Finish, finish_params
from supervisor.broker.consuming.gates import first_turn
from supervisor.broker.consuming.leases import reap_params
from supervisor.broker.reads import actor_reads
from supervisor.config import Retention
from supervisor.http.dashboard import recorder
from supervisor.registry import Registration
from supervisor.worker.upkeep import Upkeep, UpkeepSettings
from tests.conftest import scalar, wait_for

CLAIM = {"queue": "health", "n": 5, "owner": "t", "lease_s": 30.0, "relaxed": False, "floor_levels": None, "floor_at": None, **first_turn(64), "actors": [], "actor_max_attempts": [],
         "actor_max_losses": [], "default_max_attempts": 1, "default_max_losses": 1}
STATS = "SELECT n_dead_tup, vacuum_count FROM pg_stat_user_tables WHERE relid = 'job_queue'::regclass"
pytestmark = pytest.mark.broker(lease_seconds=30, poll_interval=0.2, pool_size=4)


@pytest.fixture
def other(database_url: str) -> Iterator[psycopg.Connection]:
    """A second session: another process of the fleet."""
    with psycopg.connect(database_url, autocommit=True) as c:
        yield c


def make_dead(conn: psycopg.Connection, n: int) -> int:
    """Leave n dead tuples in jobs and wait until the statistics show them; returns vacuum_count."""
    conn.execute("INSERT INTO job_queue (actor) SELECT 'x' FROM generate_series(1, %s)", (n,))
    conn.execute("DELETE FROM job_queue")
    conn.execute("SELECT pg_stat_force_next_flush()")  # published when this session goes idle
    wait_for(lambda: conn.execute(STATS).fetchone()[0] >= n, message=f"{n} dead tuples in the statistics")
    return conn.execute(STATS).fetchone()[1]


def upkeep(broker: PostgresBroker, registry: ConnectionPool | None = None, **settings: Any) -> Upkeep:
    """A worker's upkeep on ``broker`` (its registry row written on ``registry``, default the
    broker's pool), not started: a test calls its tasks, or starts it with ``running``."""
    registration = Registration(registry or broker.pool, broker.owner, role="t", queues=["tests"])
    return Upkeep(broker, registration, settings=UpkeepSettings(**settings), state=lambda: "running")


@contextlib.contextmanager
def running(thread: Upkeep) -> Iterator[Upkeep]:
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()
        thread.join(10)
    assert not thread.is_alive()


def vacuum(broker: PostgresBroker, *, dead_rows: int, min_seconds: float = 0.0) -> int | None:
    """The upkeep's vacuum check (and vacuum), as every few seconds in a worker."""
    return upkeep(broker, vacuum_dead_rows=dead_rows, vacuum_min_seconds=min_seconds).vacuum()


def test_vacuum_runs_once_dead_tuples_pass_the_threshold(conn, broker):
    before = make_dead(conn, 500)
    # Statistics of earlier tests on this database may still arrive: a threshold far
    # above what is there, not one dead tuple above what this test made.
    assert vacuum(broker, dead_rows=100_000) is None
    assert conn.execute(STATS).fetchone()[1] == before  # below the threshold: nothing ran

    assert vacuum(broker, dead_rows=500) >= 500
    assert conn.execute(STATS).fetchone() == (0, before + 1)


def test_vacuum_not_again_soon_after_the_last(conn, broker):
    before = make_dead(conn, 300)
    assert vacuum(broker, dead_rows=100) is not None
    make_dead(conn, 300)
    # a vacuum ended moments ago: within min_seconds nobody runs another
    assert vacuum(broker, dead_rows=100, min_seconds=3600) is None
    assert conn.execute(STATS).fetchone()[1] == before + 1


def test_vacuum_one_process_at_a_time_never_waiting_never_blocking_a_claim(conn, other, database_url, broker):
    before = make_dead(conn, 300)
    # Were the vacuum to wait for the lock, this test would fail after 10 s instead of
    # hanging (the lock is released only once the test goes on).
    checks = ThreadPoolExecutor(1)
    with other.transaction():
        # another process is vacuuming jobs (this is the lock a vacuum holds): this one
        # does not run a second vacuum, nor wait for the first
        other.execute("LOCK TABLE job_queue IN SHARE UPDATE EXCLUSIVE MODE")
        assert checks.submit(vacuum, broker, dead_rows=100).result(timeout=10) is not None
        checks.shutdown()
        # ...and that lock never stands in a claim's way
        with psycopg.connect(database_url, autocommit=True, options="-c lock_timeout=5s") as claimer:
            claimer.execute("INSERT INTO job_queue (queue, actor) VALUES ('health', 'x')")
            assert len(claimer.execute(jobs_sql.CLAIM, CLAIM).fetchall()) == 1
    assert conn.execute(STATS).fetchone()[1] == before  # skipped: no second vacuum ran
    assert conn.execute(STATS).fetchone()[0] >= 300
    assert vacuum(broker, dead_rows=100) is not None  # free again: it runs
    assert conn.execute(STATS).fetchone()[1] == before + 1
    # no truncation (it would take ACCESS EXCLUSIVE and stall every claim), by the table's setting too
    options = scalar(conn, "SELECT reloptions FROM pg_class WHERE oid = 'job_queue'::regclass")
    assert {"vacuum_truncate=off", "vacuum_index_cleanup=on"} <= set(options)
    assert "TRUNCATE false" in jobs_sql.VACUUM_JOBS and "SKIP_LOCKED" in jobs_sql.VACUUM_JOBS


def test_upkeep_thread_vacuums_jobs_when_dead_tuples_pile_up(conn, broker):
    before = make_dead(conn, 400)
    with running(upkeep(broker, heartbeat_seconds=3600, vacuum_dead_rows=400, vacuum_check_seconds=0.05,
                        vacuum_min_seconds=0)):
        wait_for(lambda: conn.execute(STATS).fetchone()[1] > before, message="the upkeep's vacuum of jobs")
    assert conn.execute(STATS).fetchone()[0] == 0


def test_concurrent_prunes_take_different_rows_without_waiting(conn, other):
    # days with no partition of their own (only yesterday to two days ahead are made):
    # the default partition's rows, which retention removes row by row
    conn.execute("INSERT INTO jobs (actor, status, finished_at) SELECT 'x', 'succeeded', now() - (g + 1) * interval '1 day'"
                 " FROM generate_series(1, 10) AS g")
    params = {"status": "succeeded", "older_than_s": 3600}
    with other.transaction():
        first = other.execute(jobs_sql.PRUNE_ROWS, {**params, "limit": 4}).fetchall()
        # the first pruner's batch is locked (not committed): the second skips it, never waits
        conn.execute("SET lock_timeout = '5s'")
        second = conn.execute(jobs_sql.PRUNE_ROWS, {**params, "limit": 10}).fetchall()
    assert len(first) == 4 and len(second) == 6
    assert not {r[0] for r in first} & {r[0] for r in second}
    assert scalar(conn, "SELECT count(*) FROM jobs") == 0


def test_prune_cadence_follows_the_shortest_retention():
    assert UpkeepSettings().prune_every == 300.0  # the defaults keep rows a day or more
    assert UpkeepSettings(retention=Retention(succeeded=60)).prune_every == 15.0
    assert UpkeepSettings(retention=Retention(succeeded=1)).prune_every == 5.0  # never busier than this


def test_a_heartbeat_is_a_hot_update(conn):
    """Renewing a lease touches no index (no index covers the columns it sets), so it
    leaves no dead index entry behind: counted in the transaction's own statistics."""
    job = scalar(conn, "INSERT INTO job_queue (queue, actor, status, lease_owner, lease_expires_at, attempts, claimed_at)"
                       " VALUES ('tests', 'noop', 'running', 'n:1:t', now() + interval '5 s', 1, now()) RETURNING id")
    with conn.transaction():
        renewed = conn.execute(jobs_sql.HEARTBEAT, {"ids": [job], "owner": "n:1:t", "lease_s": 30}).fetchall()
        hot = scalar(conn, "SELECT pg_stat_get_xact_tuples_hot_updated('job_queue'::regclass)")
        updated = scalar(conn, "SELECT pg_stat_get_xact_tuples_updated('job_queue'::regclass)")
    assert [str(r[0]) for r in renewed] == [str(job)]
    assert (updated, hot) == (1, 1)


def empty_in_the_planner(conn: psycopg.Connection, other: psycopg.Connection, n: int) -> None:
    """The state a vacuum leaves when it runs while a bulk enqueue is still open: n rows
    in jobs, reltuples 0 over the pages that TRUNCATE false keeps (the planner's 'empty')."""
    with other.transaction():
        other.execute("INSERT INTO job_queue (queue, actor, args, priority) SELECT 'health', 'x', '[]', g %% 3"
                      " FROM generate_series(1, %s) AS g", (n,))
        conn.execute("VACUUM job_queue")
    assert conn.execute("SELECT relpages > 0, reltuples FROM pg_class WHERE relname = 'job_queue'").fetchone() == (True, 0)
    other.execute("SELECT pg_stat_force_next_flush()")  # its inserts reach n_live_tup when it goes idle


def test_claim_stays_a_tid_lookup_when_the_planner_thinks_jobs_is_empty(conn, other):
    empty_in_the_planner(conn, other, 5000)
    plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + jobs_sql.CLAIM, CLAIM))
    # Joining on id, this plan walked the whole primary key once per claim (120 ms at 20,000 rows).
    assert "Tid Scan on job_queue" in plan, plan
    claimed = conn.execute(jobs_sql.CLAIM, {**CLAIM, "n": 7}).fetchall()
    priorities = conn.execute("SELECT priority FROM jobs WHERE id = ANY(%s::uuid[]) ORDER BY priority DESC",
                              ([r[0] for r in claimed],)).fetchall()
    assert len(claimed) == 7 and {p for (p,) in priorities} == {2}  # the highest priority first
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'running'") == 7


def test_upkeep_analyzes_jobs_when_the_planner_counts_too_few_rows(conn, other, broker):
    empty_in_the_planner(conn, other, 5000)
    with running(upkeep(broker, heartbeat_seconds=3600, vacuum_check_seconds=0.05)):
        wait_for(lambda: scalar(conn, "SELECT reltuples FROM pg_class WHERE relname = 'job_queue'") >= 5000 / 4,
                 message="the upkeep's analyze of jobs")
    assert scalar(conn, "SELECT analyze_count FROM pg_stat_user_tables WHERE relid = 'job_queue'::regclass") >= 1


def test_a_relaxed_claim_skips_the_flush_wait_of_its_own_transaction_only(conn):
    conn.execute("INSERT INTO job_queue (queue, actor, args) SELECT 'health', 'x', '[]' FROM generate_series(1, 2)")
    with conn.transaction():
        assert len(conn.execute(jobs_sql.CLAIM, {**CLAIM, "n": 1, "relaxed": True}).fetchall()) == 1
        assert scalar(conn, "SHOW synchronous_commit") == "off"
    assert scalar(conn, "SHOW synchronous_commit") == "on"  # nothing outlives the transaction
    with conn.transaction():
        assert len(conn.execute(jobs_sql.CLAIM, {**CLAIM, "n": 1}).fetchall()) == 1
        assert scalar(conn, "SHOW synchronous_commit") == "on"


def _plan(conn: psycopg.Connection, statement: str, params: dict) -> str:
    """The statement's plan with sequential scans priced out (a small test table
    would otherwise be read whole whatever indexes it has)."""
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL enable_seqscan = off")
        return "\n".join(r[0] for r in conn.execute("EXPLAIN " + statement, params))


def _indexes_used(conn: psycopg.Connection, statement: str, params: dict) -> set[str]:
    return set(re.findall(r" using (\w+)", _plan(conn, statement, params)))


def test_reaper_and_release_read_running_rows_by_index_ack_and_heartbeat_by_id(conn):
    # No index on running rows made every reap and every release read the whole table
    # (0.4 s at 2 M finished rows). jobs_running serves them; the ack and the heartbeat
    # must still find their rows by id, never by reading every running row of the owner.
    ids = [scalar(conn, "INSERT INTO job_queue (actor, status, lease_owner, attempts, claimed_at, lease_expires_at)"
                        " VALUES ('x', 'running', 'h:1:a', 1, now(), now()) RETURNING id::text") for _ in range(3)]
    conn.execute("ANALYZE job_queue")
    budget = {"who": "t", "why": "test", "default_max_losses": 3}
    reap = _indexes_used(conn, jobs_sql.REAP_EXPIRED, reap_params("t", margin_s=1.0, limit=10))
    release = _indexes_used(conn, jobs_sql.RELEASE_OWNER, {**budget, "owner": "h:1:a"})
    ack = _indexes_used(conn, jobs_sql.FINISH, finish_params("h:1:a", [Finish(i, 1, "succeeded") for i in ids]))
    beat = _indexes_used(conn, jobs_sql.HEARTBEAT, {"ids": db.array_text(ids), "owner": "h:1:a", "lease_s": 30.0})
    assert "jobs_running" in reap and "jobs_running" in release, (reap, release)
    # (which index they do use is the planner's choice on a table this small)
    assert "jobs_running" not in ack, ack
    assert "jobs_running" not in beat, beat
    # and what the reaper reads through it is right: the expired rows, released
    released = conn.execute(jobs_sql.REAP_EXPIRED, reap_params("t", margin_s=0.0, limit=10)).fetchall()
    assert sorted(str(r[0]) for r in released) == sorted(ids)


def test_reads_of_live_or_failed_rows_never_read_the_succeeded_ones(conn):
    # /metrics (v_queue_capacity) at every scrape, the dashboard's recorder every 10 s,
    # the queue listings and join(): each read the whole table (0.36 s at 2 M finished
    # rows) while no index covered the running rows. Through jobs_live they read the
    # claim and running indexes only.
    conn.execute("INSERT INTO job_queue (queue, actor, status, lease_owner, claimed_at)"
                 " VALUES ('q', 'x', 'running', 'h:1:a', now()), ('q', 'x', 'pending', NULL, NULL)")
    conn.execute("ANALYZE job_queue")
    for name, statement, params in (("LIVE_BY_QUEUE", reads.LIVE_BY_QUEUE, {}), ("CAPACITY", reads.CAPACITY, {}),
                                    ("SAMPLE_QUEUES", recorder.SAMPLE_QUEUES, {"step_s": 10}),
                                    ("START_LATENCY", reads.START_LATENCY, {"window_s": 60, "cap": 100}),
                                    ("LIVE_IN_QUEUE", jobs_sql.LIVE_IN_QUEUE, {"queue": "q"}),
                                    # failed rows, kept for days beside the succeeded ones
                                    ("FAILED_BY_QUEUE", reads.FAILED_BY_QUEUE, {}),
                                    ("FAILED_SINCE", jobs_sql.FAILED_SINCE, {"queue": "q", "since": "-infinity"}),
                                    ("DEAD_LETTERS", jobs_sql.DEAD_LETTERS, {"queues": ["q"], "since": "-infinity"})):
        plan = _plan(conn, statement, params)
        assert not re.search(r"Seq Scan on job_(queue|history_succeeded)", plan), f"{name} reads all of jobs:\n{plan}"
        if name.startswith(("FAILED", "DEAD")):  # the failed days only, never a succeeded one
            assert "job_history_failed" in plan and "job_history_succeeded" not in plan, f"{name}:\n{plan}"
    assert conn.execute("SELECT ready, running FROM v_queue_capacity WHERE queue = 'q'").fetchone() == (1, 1)


def test_the_errors_and_actors_reads_are_bounded_by_their_windows_indexes(conn):
    # The Errors and Actors pages (and their API routes, `supervisor errors`, /metrics'
    # start waits) read failed attempts and finished jobs of a recent window: each read
    # must walk that window in an index, never all of jobs (millions of finished rows)
    # or all of job_events.
    conn.execute("INSERT INTO jobs (queue, actor, status, lease_owner, claimed_at, started_at, finished_at)"
                 " SELECT 'q', 'a' || (g % 3), CASE WHEN g % 9 = 0 THEN 'running' WHEN g % 5 = 0 THEN 'failed'"
                 " ELSE 'succeeded' END, 'h:1:a', now(), now() - interval '2 s',"
                 " CASE WHEN g % 9 <> 0 THEN now() - g * interval '1 minute' END FROM generate_series(1, 300) g")
    conn.execute("INSERT INTO job_events (job_id, at, who, from_status, to_status, actor, error_type, error_where)"
                 " SELECT id, finished_at, 'w', 'running', 'failed', actor, 'ValueError', 'app.py:f' FROM jobs"
                 " WHERE status = 'failed'")
    conn.execute("INSERT INTO job_events (job_id, at, who, from_status, to_status)"
                 " SELECT id, now(), 'w', 'pending', 'cancelled' FROM jobs")
    conn.execute("ANALYZE job_queue")
    conn.execute("ANALYZE job_history")
    conn.execute("ANALYZE job_events")
    window = {"window_s": 3600, "cap": 100_000}
    group = {"actor": "a0", "error_type": "ValueError", "error_where": "app.py:f"}
    for name, statement, params, index in (
            ("ERROR_BUCKETS", actor_reads.ERROR_BUCKETS, {**window, "step_s": 150, "actor": None}, "job_events_errors"),
            ("GROUP_DETAILS", actor_reads.GROUP_DETAILS, {**window, "actors": ["a0"], "types": ["ValueError"],
                                                         "wheres": ["app.py:f"]}, "job_events_error_groups"),
            ("GROUP_JOBS", actor_reads.GROUP_JOBS, {**window, **group, "statuses": ["failed"], "limit": 10},
             "job_events_error_groups"),
            ("ACTORS", actor_reads.ACTORS, window, "finished_at_idx"),
            ("ACTOR_RETRIES", actor_reads.ACTOR_RETRIES, window, "job_events_errors"),
            ("IN_FLIGHT", actor_reads.IN_FLIGHT, {}, "jobs_running")):
        plan = _plan(conn, statement, params)
        assert not re.search(r"Seq Scan on (job_queue|job_history|job_events)\b", plan), f"{name} reads a whole table:\n{plan}"
        assert index in plan, f"{name}:\n{plan}"
        if "job_events_errors" in plan or name == "ACTORS":  # the window bounds the index scan
            assert re.search(r"Index Cond: \((finished_)?at > ", plan), f"{name}:\n{plan}"
    assert error_groups.error_groups(conn, window_s=3600)["attempts"] == scalar(
        conn, "SELECT count(*) FROM jobs WHERE status = 'failed' AND finished_at > now() - interval '1 hour'")


def test_a_running_row_is_a_claimed_row(conn):
    # jobs_running and jobs_live rely on it: only the claim makes a row running, and it
    # sets claimed_at. A row made running by hand without it is refused, not missed.
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("INSERT INTO job_queue (actor, status) VALUES ('x', 'running')")



def _claim_index_pages(conn: psycopg.Connection, n: int) -> tuple[int, list[int]]:
    """(pages the claim's reads of jobs_claim touched, priorities it claimed), rolled back."""
    with conn.transaction(force_rollback=True):
        plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + jobs_sql.claim(n), CLAIM).fetchone()[0]
        priorities = [r[0] for r in conn.execute("SELECT priority FROM jobs WHERE status = 'running'"
                                                 " ORDER BY priority DESC")]

    def pages(node: dict) -> int:
        own = node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)
        here = own if node.get("Index Name") == "jobs_claim" else 0
        return here + sum(pages(child) for child in node.get("Plans", []))

    return pages(plan[0]["Plan"]), priorities


def test_a_claim_never_walks_rows_due_later_at_a_higher_priority(conn):
    # jobs_claim is ordered (queue, priority DESC, run_at, id). One scan in that order
    # walked every delayed row of a higher priority before the first due row of a lower
    # one: 100,000 of them made every claim 7x slower. The claim now reads each priority
    # level from its own run_at lower bound.
    conn.execute("INSERT INTO job_queue (queue, actor, priority) SELECT 'health', 'x', 0 FROM generate_series(1, 10)")
    conn.execute("INSERT INTO job_queue (queue, actor, priority) SELECT 'health', 'x', 5 FROM generate_series(1, 3)")
    conn.execute("VACUUM ANALYZE job_queue")
    baseline, priorities = _claim_index_pages(conn, 5)
    assert priorities == [5, 5, 5, 0, 0]
    conn.execute("INSERT INTO job_queue (queue, actor, priority, run_at) SELECT 'health', 'x', 10, now() + interval '1 day'"
                 " FROM generate_series(1, 30000)")
    conn.execute("VACUUM ANALYZE job_queue")
    with_delayed, priorities = _claim_index_pages(conn, 5)
    assert priorities == [5, 5, 5, 0, 0]
    # The delayed rows' entries fill most of the index; the claim descends past them, a
    # few pages per priority level, where the one ordered scan read every page of them.
    index_pages = scalar(conn, "SELECT relpages FROM pg_class WHERE relname = 'jobs_claim'")
    assert with_delayed - baseline < 20 < index_pages / 4, (baseline, with_delayed, index_pages)



def test_a_claim_reads_past_many_priority_levels_in_order(conn):
    # A descent per level costs more than stepping over a row, so the claim reads only the
    # first 16 levels one by one and the rest in one ordered scan. 40 levels, each with a
    # row due in a day; due rows at 30 (read by level), 20 and 10 (read by the scan).
    conn.execute("INSERT INTO job_queue (queue, actor, priority, run_at) SELECT 'health', 'x', g, now() + interval '1 day'"
                 " FROM generate_series(1, 40) AS g")
    conn.execute("INSERT INTO job_queue (queue, actor, priority) SELECT 'health', 'x', p FROM unnest(%s::int[]) AS p",
                 ([30, 30, 20, 20, 10, 10],))
    conn.execute("ANALYZE job_queue")
    for n in (5, 4, 8):  # a power of two (its own statement) and not
        with conn.transaction(force_rollback=True):
            claimed = conn.execute(jobs_sql.claim(n), {**CLAIM, "n": n}).fetchall()
            got = [r[0] for r in conn.execute("SELECT priority FROM jobs WHERE status = 'running'"
                                              " ORDER BY priority DESC")]
        assert len(claimed) == min(n, 6) and got == [30, 30, 20, 20, 10, 10][:n], (n, got)
    # the claim hands its rows out in claim order
    with conn.transaction(force_rollback=True):
        order = [r[0] for r in conn.execute(jobs_sql.claim(8), {**CLAIM, "n": 8})]
        by_id = dict(conn.execute("SELECT id::text, priority FROM jobs WHERE status = 'running'").fetchall())
    assert [by_id[i] for i in order] == [30, 30, 20, 20, 10, 10]


def test_a_claim_size_keeps_one_generic_plan(conn):
    # A claim of a power-of-two size has the size written into the statement, so the
    # server keeps a generic plan for it instead of planning every claim (LIMIT $n is
    # priced at a tenth of the table, which made every plan a custom one). psycopg
    # prepares at the 5th run. Other sizes share the parameterised statement: a cached
    # plan holds server memory per size and connection (bench/README.md).
    conn.execute("INSERT INTO job_queue (queue, actor, priority, run_at) SELECT 'health', 'x', g %% 3,"
                 " now() + CASE WHEN g %% 2 = 0 THEN interval '1 day' ELSE interval '0' END"
                 " FROM generate_series(1, 200) AS g", ())
    conn.execute("ANALYZE job_queue")
    claimed = []
    for _ in range(12):
        claimed += [r[0] for r in conn.execute(jobs_sql.claim(4), {**CLAIM, "n": 4}).fetchall()]
    # (psycopg sends the text with $1.. for the parameters: find it by its limit)
    generic = conn.execute("SELECT generic_plans FROM pg_prepared_statements"
                           " WHERE statement LIKE '%levels%' AND statement ~ 'LIMIT 4\\M'").fetchall()
    assert len(generic) == 1 and generic[0][0] > 0, generic
    # and the generic plan claims what a fresh plan would: due rows only, highest priority first
    got = conn.execute("SELECT priority, run_at <= now() FROM jobs WHERE id = ANY(%s::uuid[])",
                       ([str(i) for i in claimed],)).fetchall()
    assert len(got) == 48 and all(due for _, due in got)
    assert [p for p, _ in got].count(2) == 33  # all 33 due rows at priority 2, then priority 1
    assert jobs_sql.claim(3) == jobs_sql.CLAIM and "LIMIT 4" not in jobs_sql.CLAIM
    with pytest.raises(ValueError, match="positive number of rows"):
        jobs_sql.claim(0)


@pytest.mark.broker(pool_size=2)
def test_a_prune_takes_no_connection_of_the_brokers_pool(conn, database_url, broker):
    """A prune of a busy table is tens of batches back to back (seconds): on the broker's
    two connections, claims and acks queued behind it (issue 23, bench/README.md). With
    both of them in use, a prune still runs, on a connection of its own."""
    side = db.make_pool(database_url, max_size=1, name="test")
    held = []
    try:
        conn.execute("INSERT INTO jobs (actor, status, finished_at) SELECT 'x', 'succeeded', now() - interval '8 days'"
                     " FROM generate_series(1, 250)")
        held = [broker.pool.getconn(timeout=10) for _ in range(2)]  # a claim and an ack batch in flight
        assert upkeep(broker, side, prune_batch=100).prune()["succeeded"] == 250
    finally:
        for c in held:
            broker.pool.putconn(c)
        side.close()
    assert scalar(conn, "SELECT count(*) FROM jobs") == 0
