"""Migration 035 (job_queue + job_history) on a database an older release filled: every
row kept, in the table its status belongs to, and every live job then finishes exactly
once under a worker of this release."""

from __future__ import annotations

from supervisor.migrate import migrate
from tests.conftest import TEST_TABLES, scalar, wait_for

BEFORE = 34  # the last migration of the release before the split

# Rows as the old release left them: live ones of every kind (a running one leased to a
# worker of the old release that has stopped, with its concurrency slot held; a retry due
# in two seconds; dedupe and concurrency keys held) and finished ones of every status.
FILL = """
INSERT INTO jobs (id, queue, actor, args, status, run_at, attempts, lease_owner, claimed_at, heartbeat_at,
                  lease_expires_at, dedupe_key, concurrency_key, finished_at, started_at)
SELECT gen_random_uuid(), 'tests', 'record', jsonb_build_array(g), s.status,
       CASE WHEN s.status = 'retryable' THEN now() + interval '2 seconds' ELSE now() END,
       CASE WHEN s.status IN ('pending') THEN 0 ELSE 1 END,
       CASE WHEN s.status = 'running' THEN 'old-host:4242:gone' END,
       CASE WHEN s.status <> 'pending' THEN now() END,
       CASE WHEN s.status = 'running' THEN now() END,
       CASE WHEN s.status = 'running' THEN now() + interval '2 seconds' END,
       CASE WHEN g % 10 = 0 THEN 'dedupe-' || s.status || '-' || g END,
       CASE WHEN s.status = 'running' AND g = 1 THEN 'slot-a' END,
       CASE WHEN s.status IN ('succeeded', 'failed', 'cancelled') THEN now() - g * interval '1 hour' END,
       CASE WHEN s.status IN ('succeeded', 'failed') THEN now() - g * interval '1 hour' END
  FROM (VALUES ('pending'), ('retryable'), ('running'), ('succeeded'), ('failed'), ('cancelled')) AS s(status)
 CROSS JOIN generate_series(1, 20) AS g;
INSERT INTO job_concurrency (key, job_id) SELECT concurrency_key, id FROM jobs WHERE concurrency_key = 'slot-a';
"""


def test_an_old_database_migrates_in_place_and_every_job_finishes_once(fresh_database, workers):
    import psycopg

    url = fresh_database
    migrate(url, until=BEFORE)
    with psycopg.connect(url, autocommit=True) as conn:
        assert scalar(conn, "SELECT to_regclass('job_queue')") is None  # the old layout
        conn.execute(TEST_TABLES)
        conn.execute(FILL)
        before = dict(conn.execute("SELECT status, count(*) FROM jobs GROUP BY 1").fetchall())
        ids = {r[0]: r[1] for r in conn.execute("SELECT id, status FROM jobs")}
        live = {i for i, st in ids.items() if st in ("pending", "retryable", "running")}

        migrate(url)

        after = dict(conn.execute("SELECT status, count(*) FROM jobs GROUP BY 1").fetchall())
        assert after == before == {s: 20 for s in ("pending", "retryable", "running", "succeeded", "failed",
                                                   "cancelled")}
        # the waiting ones moved on into the log (058): job_queue keeps the running ones
        assert scalar(conn, "SELECT count(*) FROM job_queue") == 20
        assert scalar(conn, "SELECT count(*) FROM job_history") == 60
        assert scalar(conn, "SELECT count(*) FROM job_history WHERE finished_at IS NULL") == 0
        # a held dedupe key still refuses a second live job; a finished one's key is free
        held = scalar(conn, "SELECT dedupe_key FROM jobs WHERE dedupe_key IS NOT NULL"
                            " AND status IN ('pending', 'retryable', 'running') LIMIT 1")
        done = scalar(conn, "SELECT dedupe_key FROM job_history WHERE dedupe_key IS NOT NULL LIMIT 1")
        assert conn.execute("INSERT INTO job_queue (actor, queue, dedupe_key) VALUES ('record', 'held', %s)"
                            " ON CONFLICT DO NOTHING RETURNING id", (held,)).fetchone() is None
        assert conn.execute("INSERT INTO job_queue (actor, queue, dedupe_key) VALUES ('record', 'held', %s)"
                            " ON CONFLICT DO NOTHING RETURNING id", (done,)).fetchone() is not None
        conn.execute("DELETE FROM job_queue WHERE queue = 'held'")

        # A worker of this release: the stopped old worker's leases expire and are reaped,
        # the delayed retries come due, and every live job runs once.
        w = workers(url, threads=4, lease=2, heartbeat=0.5)
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs_live") == 0, 60,
                 message="every live job to finish", )
        assert w.proc.poll() is None, w.stderr()
        runs = dict(conn.execute("SELECT job_id, count(*) FROM test_results GROUP BY 1").fetchall())
        assert set(runs) == live and set(runs.values()) == {1}, runs
        assert dict(conn.execute("SELECT status, count(*) FROM jobs GROUP BY 1").fetchall()) == {
            "succeeded": 80, "failed": 20, "cancelled": 20}
        assert scalar(conn, "SELECT count(*) FROM job_concurrency WHERE job_id IS NOT NULL") == 0


def test_retention_drops_whole_days_and_keeps_the_rest(conn, database_url):
    """A day of finished jobs past its retention goes as a table (DROP), not as DELETEs;
    the days within it stay; the upkeep makes the days ahead."""
    from supervisor import db
    from supervisor.broker import PostgresBroker
    from supervisor.config import Retention
    from supervisor.registry import Registration
    from supervisor.worker.upkeep import Upkeep, UpkeepSettings

    old = scalar(conn, "SELECT job_history_add_day('succeeded', current_date - 10)")
    assert old is True
    conn.execute("INSERT INTO jobs (actor, status, finished_at) SELECT 'x', 'succeeded', current_date - 10 + g * interval '1 minute'"
                 " FROM generate_series(1, 300) g")
    conn.execute("INSERT INTO jobs (actor, status, finished_at) SELECT 'x', 'succeeded', now() - interval '1 minute'"
                 " FROM generate_series(1, 5)")
    conn.execute("ANALYZE job_history")
    day = f"job_history_succeeded_d{scalar(conn, 'SELECT to_char(current_date - 10, %s)', ('YYYYMMDD',))}"
    assert scalar(conn, "SELECT count(*) FROM " + day) == 300  # noqa: S608 (our own name)
    broker = PostgresBroker(database_url, pool_size=2)
    side = db.make_pool(database_url, max_size=1, name="test")
    try:
        registration = Registration(side, broker.owner, role="t", queues=["tests"])
        upkeep = Upkeep(broker, registration, settings=UpkeepSettings(retention=Retention(succeeded=7 * 86400)),
                        state=lambda: "running")
        assert upkeep.prune()["succeeded"] == 300  # the planner's count of the dropped day
    finally:
        side.close()
        broker.close()
    assert scalar(conn, "SELECT to_regclass(%s)", (day,)) is None
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 5
    ahead = f"job_history_failed_d{scalar(conn, 'SELECT to_char(current_date + 2, %s)', ('YYYYMMDD',))}"
    assert scalar(conn, "SELECT to_regclass(%s) IS NOT NULL", (ahead,))


# Rows as the release before the job log (migration 038) left them: live ones of every kind
# in job_queue (a running one leased to a stopped worker, its concurrency slot held; a
# retry due in two seconds; a waiting one with a dedupe key), finished ones in history.
FILL_038 = """
INSERT INTO job_queue (id, queue, actor, args, status, run_at, attempts, lease_owner, claimed_at, heartbeat_at,
                       lease_expires_at, dedupe_key, concurrency_key)
SELECT gen_random_uuid(), 'tests', 'record', jsonb_build_array(g), s.status,
       CASE WHEN s.status = 'retryable' THEN now() + interval '2 seconds' ELSE now() END,
       CASE WHEN s.status = 'pending' THEN 0 ELSE 1 END,
       CASE WHEN s.status = 'running' THEN 'old-host:4242:gone' END,
       CASE WHEN s.status <> 'pending' THEN now() END,
       CASE WHEN s.status = 'running' THEN now() END,
       CASE WHEN s.status = 'running' THEN now() + interval '2 seconds' END,
       CASE WHEN g % 10 = 0 THEN 'dedupe-' || s.status || '-' || g END,
       CASE WHEN s.status = 'running' AND g = 1 THEN 'slot-a' END
  FROM (VALUES ('pending'), ('retryable'), ('running')) AS s(status)
 CROSS JOIN generate_series(1, 20) AS g;
INSERT INTO job_concurrency (key, job_id) SELECT concurrency_key, id FROM job_queue WHERE concurrency_key IS NOT NULL;
INSERT INTO job_history (id, queue, actor, status, finished_at)
SELECT gen_random_uuid(), 'tests', 'record', s.status, now() - g * interval '1 hour'
  FROM (VALUES ('succeeded'), ('failed'), ('cancelled')) AS s(status) CROSS JOIN generate_series(1, 20) AS g;
"""


def test_a_database_before_the_job_log_migrates_and_a_log_worker_finishes_every_job_once(fresh_database, workers):
    """Migration 039 adds the log beside job_queue, and 058 moves job_queue's waiting jobs into
    it. A worker of this release finishes the old live jobs (each once) and the plain jobs
    sent after from the log (each once)."""
    import psycopg

    from supervisor.broker import PostgresBroker

    url = fresh_database
    migrate(url, until=38)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(TEST_TABLES)
        conn.execute(FILL_038)
        old = {str(r[0]) for r in conn.execute("SELECT id FROM job_queue")}
        migrate(url)
        assert scalar(conn, "SELECT count(*) FROM jobs WHERE status IN ('pending', 'retryable', 'running')") == 60
        assert scalar(conn, "SELECT count(*) FROM jobs") == 120

        producer = PostgresBroker(url, pool_size=1)
        try:
            producer.declare_queue("tests")
            import dramatiq

            @dramatiq.actor(broker=producer, queue_name="tests", actor_name="record")
            def record(n: int) -> None:  # the worker's is tests.sample_actors.record
                pass

            new = {m.message_id for m in producer.enqueue_many([record.message(1000 + i) for i in range(40)])}
        finally:
            producer.close()
        assert scalar(conn, "SELECT count(*) FROM job_log") == 40 + 20  # and job_queue's pending ones (058)

        w = workers(url, threads=4, lease=2, heartbeat=0.5)
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs_live") == 0, 60, message="every live job to finish")
        assert w.proc.poll() is None, w.stderr()
        runs = dict(conn.execute("SELECT job_id::text, count(*) FROM test_results GROUP BY 1").fetchall())
        assert set(runs) == old | new and set(runs.values()) == {1}, runs
        # the 40 sent, and job_queue's 20 pending and 20 retryable moved into the log (058)
        assert scalar(conn, "SELECT count(*) FROM job_done WHERE status = 'succeeded'") == 80
        assert scalar(conn, "SELECT count(*) FROM job_concurrency WHERE job_id IS NOT NULL") == 0


def test_a_log_at_040_migrates_to_utc_days_and_every_job_is_claimed_and_finished_once(fresh_database):
    """Migration 041 (a row's day a UTC date, windows bounded by their snapshots' times) on
    a log that 040 left: rows waiting, a cursor part way (no times on it), a batch leased.
    Every row is then claimed once, the leased batch's acks land, and rows appended after
    are claimed in windows that know their times."""
    import psycopg

    from tests.test_job_log import claim, enqueue, finish

    url = fresh_database
    migrate(url, until=40)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO job_log (id, queue, actor) SELECT gen_random_uuid(), 'log', 'noop'"
                     " FROM generate_series(1, 30)")  # as 040's producers wrote them
        leased = claim(conn, 10)
        migrate(url)
        assert scalar(conn, "SELECT count(*) FROM job_cursor WHERE lo_at IS NULL AND hi_at IS NULL") >= 1
        assert finish(conn, leased, ended=[leased[0][0]]) == 10
        rest = claim(conn, 15)
        later = []
        for _ in range(3):  # from the second on, each claim a window of its own, with its times
            later += enqueue(conn, 5)
            rest += claim(conn, 100)
        assert claim(conn, 100) == []
        assert scalar(conn, "SELECT count(*) FROM job_cursor WHERE lo_at IS NOT NULL") >= 1
        claimed = [str(r[3]) for r in leased + rest]
        assert len(claimed) == len(set(claimed)) == 45
        assert set(later) <= set(claimed)
        assert finish(conn, rest) == 35
        assert scalar(conn, "SELECT count(*) FROM job_done WHERE status = 'succeeded'") == 45
