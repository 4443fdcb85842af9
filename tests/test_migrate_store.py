"""The last release's database (migrations up to 051: job_queue beside the log) filled with
jobs in every state in both stores, migrated to this release in place: nothing lost, the
waiting jobs of job_queue moved into the log (058), every live job then finishes exactly once
under a worker of this release, and the dedupe keys the old rows hold still refuse a second
live job (issue 38: the store's migrations)."""

from __future__ import annotations

import psycopg

from supervisor.migrate import migrate
from tests.conftest import TEST_TABLES, scalar, wait_for
from tests.test_migrate_history import FILL_038

BEFORE = 51  # the last migration of the release before the one store's first steps

# job_queue as 051 left it: test_migrate_history's rows of every kind (a running one leased
# to a worker that has stopped, its concurrency slot held; a retry due in two seconds; dedupe
# keys held; finished ones), and rows waiting for a concurrency key, one running under it.
FILL_QUEUE = FILL_038 + """
INSERT INTO job_queue (id, queue, actor, args, status, run_at, attempts, lease_owner, claimed_at, heartbeat_at,
                       lease_expires_at, concurrency_key, flow_key, flow)
SELECT gen_random_uuid(), 'tests', 'record', jsonb_build_array(100 + g), CASE WHEN g = 1 THEN 'running' ELSE 'waiting' END,
       now(), CASE WHEN g = 1 THEN 1 ELSE 0 END,
       CASE WHEN g = 1 THEN 'old-host:4242:gone' END, CASE WHEN g = 1 THEN now() END,
       CASE WHEN g = 1 THEN now() END, CASE WHEN g = 1 THEN now() + interval '2 seconds' END,
       'acct', 'acct', '{"c":1}'
  FROM generate_series(1, 10) AS g;
INSERT INTO job_concurrency (key, job_id) SELECT 'acct', id FROM job_queue WHERE flow_key = 'acct' AND status = 'running';
"""
# The log as 051 left it: 30 rows appended, 10 of them claimed by a process that stopped
# (their batch leased for 2 s more), 5 claimed and ended (failed, cancelled); timers waiting
# (a delayed job due in 2 s, a retry due in 2 s).
FILL_LOG = """
INSERT INTO job_log (id, queue, actor, args) SELECT gen_random_uuid(), 'tests', 'record', jsonb_build_array(200 + g)
  FROM generate_series(1, 30) AS g;
"""
ENDED_LOG = """
INSERT INTO job_done (seq, day, id, queue, actor, created_at, status, attempt, finished_at, last_error)
SELECT c.seq, c.day, c.id, c.queue, c.actor, c.created_at, CASE WHEN c.seq % 2 = 0 THEN 'failed' ELSE 'cancelled' END,
       c.attempt, now(), 'before the migration'
  FROM job_log_claim('tests', 5, 'old-host:1:ended', 30) AS c;
DELETE FROM job_lease WHERE owner = 'old-host:1:ended';
"""
LEASED_LOG = "SELECT id FROM job_log_claim('tests', 10, 'old-host:4242:gone', 2)"
FILL_TIMERS = """
INSERT INTO job_timers (id, queue, actor, args, status, run_at, attempts, last_error)
SELECT gen_random_uuid(), 'tests', 'record', jsonb_build_array(300 + g), CASE WHEN g % 2 = 0 THEN 'retryable' ELSE 'pending' END,
       now() + interval '2 seconds', CASE WHEN g % 2 = 0 THEN 1 ELSE 0 END, CASE WHEN g % 2 = 0 THEN 'boom' END
  FROM generate_series(1, 6) AS g;
"""
LIVE = "SELECT id FROM jobs WHERE status IN ('pending', 'retryable', 'running', 'waiting')"


def test_the_last_release_s_database_migrates_and_every_job_finishes_once(fresh_database, workers):
    url = fresh_database
    migrate(url, until=BEFORE)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(TEST_TABLES)
        conn.execute(FILL_QUEUE)
        conn.execute(FILL_LOG)
        conn.execute(ENDED_LOG)
        assert len(conn.execute(LEASED_LOG).fetchall()) == 10
        conn.execute(FILL_TIMERS)
        before = dict(conn.execute("SELECT status, count(*) FROM jobs GROUP BY 1").fetchall())
        live = {r[0] for r in conn.execute(LIVE)}
        held = [r[0] for r in conn.execute("SELECT dedupe_key FROM job_queue WHERE dedupe_key IS NOT NULL")]
        assert len(live) == 60 + 10 + 25 + 6 and len(held) == 6

        migrate(url)

        # job_queue's waiting jobs moved into the log (058): pending there until a claim
        # gates them; only the running ones stay in job_queue
        after = dict(conn.execute("SELECT status, count(*) FROM jobs GROUP BY 1").fetchall())
        moved = {**before, "pending": before["pending"] + before["waiting"]}
        del moved["waiting"]
        assert after == moved, after
        assert {r[0] for r in conn.execute(LIVE)} == live
        assert conn.execute("SELECT DISTINCT status FROM job_queue").fetchall() == [("running",)]
        # a key an old live row holds refuses a second live job, from a producer of this release
        from supervisor.broker import PostgresBroker

        producer = PostgresBroker(url, pool_size=1)
        try:
            import dramatiq

            @dramatiq.actor(broker=producer, queue_name="tests", actor_name="record")
            def record(n: int = 0) -> None:  # the worker's is tests.sample_actors.record
                pass

            for key in held[:3]:
                sent = producer.enqueue(record.message_with_options(args=(999,), dedupe_key=key))
                assert sent.message_id in {str(i) for i in live}, key
            assert scalar(conn, "SELECT count(*) FROM test_results") == 0

            # A worker of this release: the stopped processes' leases expire and are
            # released, the delayed rows come due, the waiting key's rows run one by one,
            # and every live job runs once.
            w = workers(url, threads=4, lease=2, heartbeat=0.5)
            wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs_live") == 0, 90,
                     message="every live job to finish")
            assert w.proc.poll() is None, w.stderr()
            runs = dict(conn.execute("SELECT job_id, count(*) FROM test_results GROUP BY 1").fetchall())
            assert set(runs) == live and set(runs.values()) == {1}, runs
            assert scalar(conn, "SELECT count(*) FROM job_concurrency WHERE job_id IS NOT NULL") == 0
            # the keys are free once their jobs ended: the same key sends a new job now
            again = producer.enqueue(record.message_with_options(args=(1000,), dedupe_key=held[0]))
            assert again.message_id not in {str(i) for i in live}
            wait_for(lambda: scalar(conn, "SELECT count(*) FROM test_results WHERE job_id = %s",
                                    (again.message_id,)) == 1, 30, message="the new job of a freed key to run")
        finally:
            producer.close()
        ended = dict(conn.execute("SELECT status, count(*) FROM jobs GROUP BY 1").fetchall())
        assert ended == {"succeeded": before["succeeded"] + len(live) + 1, "failed": before["failed"],
                         "cancelled": before["cancelled"]}, ended
