"""Progress, results, queue pauses, retention and the job log line, through real
worker processes and the real database."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator

import dramatiq
import psycopg
import pytest
from dramatiq import group, pipeline
from dramatiq.message import Message
from dramatiq.results import ResultFailure, ResultMissing

import supervisor
from supervisor.broker import PostgresBroker
from supervisor.results import PostgresBackend
from supervisor.testsignals import Claimed
from tests.conftest import cli, scalar, wait_for
from tests.supervisor_helpers import JobStream, enqueue

pytestmark = pytest.mark.broker(pool_size=4)


@pytest.fixture
def producer(broker: PostgresBroker) -> Iterator[PostgresBroker]:
    """The test process as a producer: Dramatiq's global broker, restored afterwards."""
    previous = dramatiq.broker.global_broker
    dramatiq.set_broker(broker)
    yield broker
    dramatiq.broker.global_broker = previous


def ops(actor: str, *args, **options) -> Message:
    """A message for an actor of tests.ops_actors, which this process does not import
    (so its options, such as max_retries=0, are not known here: say max_attempts)."""
    return Message(queue_name="ops", actor_name=actor, args=args, kwargs={}, options={"max_attempts": 1, **options})


def ops_worker(workers, conn, **kwargs):
    w = workers(queues="ops", actors="tests.ops_actors", **kwargs)
    w.wait_ready(conn)
    return w


def status(conn, job_id: str) -> str:
    return scalar(conn, "SELECT status FROM jobs WHERE id = %s", (job_id,))


# --- progress ------------------------------------------------------------------------------------


def test_progress_is_visible_while_running_and_complete_at_the_ack(conn, producer, workers, database_url):
    ops_worker(workers, conn)
    msg = producer.enqueue(ops("ops_steps", 4, 2, 1.5))
    # Half way, the job sleeps: its report reaches the row while it still runs.
    wait_for(lambda: (scalar(conn, "SELECT (progress->>'percent')::float FROM jobs WHERE id = %s",
                             (msg.message_id,)) == 50), 10, message="progress 50% while running")
    assert status(conn, msg.message_id) == "running"
    wait_for(lambda: status(conn, msg.message_id) == "succeeded", 20, message="the job to succeed")
    # The ack commits with the latest report: no later write is needed to see 100%.
    progress = scalar(conn, "SELECT progress FROM jobs WHERE id = %s", (msg.message_id,))
    assert progress["percent"] == 100 and progress["message"] == "step 4 of 4"
    # Its history row follows with the process's next progress write (within 0.5 s).
    wait_for(lambda: _history(conn, msg.message_id)[-1:] == [(100, "step 4 of 4")], 5,
             message="the last report in the history")
    assert (50, "step 2 of 4") in _history(conn, msg.message_id)
    shown = cli("jobs", "show", msg.message_id, url=database_url)
    assert shown.returncode == 0, shown.stderr
    assert "progress:" in shown.stdout and "100%  step 4 of 4" in shown.stdout
    as_json = json.loads(cli("jobs", "show", msg.message_id, "--json", url=database_url).stdout)
    assert as_json["progress_history"][-1]["message"] == "step 4 of 4"


def test_progress_of_a_job_of_the_log_is_visible_while_running(conn, producer, workers, database_url):
    # The same through the log (the default storage, where a producer that knows the actor
    # sends a plain job): the running job's progress column is its latest report.
    dramatiq.actor(broker=producer, queue_name="ops", actor_name="ops_steps", max_retries=0)(lambda *a: None)
    ops_worker(workers, conn)
    # Half way it sleeps long enough for a CLI to start and read it on a loaded machine
    # (a full run's 1.5 s once let the job finish first).
    msg = producer.enqueue(ops("ops_steps", 4, 2, 6.0))
    assert scalar(conn, "SELECT count(*) FROM job_log WHERE id = %s", (msg.message_id,)) == 1
    wait_for(lambda: (scalar(conn, "SELECT (progress->>'percent')::float FROM jobs WHERE id = %s",
                             (msg.message_id,)) == 50), 10, message="progress 50% while running")
    assert status(conn, msg.message_id) == "running"
    shown = json.loads(cli("jobs", "show", msg.message_id, "--json", url=database_url).stdout)
    assert shown["status"] == "running" and shown["progress"]["message"] == "step 2 of 4"
    wait_for(lambda: status(conn, msg.message_id) == "succeeded", 20, message="the job to succeed")
    progress = scalar(conn, "SELECT progress FROM jobs WHERE id = %s", (msg.message_id,))
    assert progress["percent"] == 100 and progress["message"] == "step 4 of 4"


def test_every_progress_event_keeps_its_kind_up_to_the_bound(conn, producer, workers, database_url):
    from supervisor.broker.consuming.progress import MAX_REPORTS

    ops_worker(workers, conn)
    few, many = producer.enqueue(ops("ops_events", 6)), producer.enqueue(ops("ops_events", 500))
    for m in (few, many):
        wait_for(lambda m=m: status(conn, m.message_id) == "succeeded", 20)
    rows = wait_for(lambda: len(_events(conn, few.message_id)) == 6 and _events(conn, few.message_id), 5,
                    message="six history rows")
    assert rows == [(f"item {i}", "fetched" if i % 2 else "parsed") for i in range(1, 7)]
    # A tight loop of 500 keeps its first reports and its last, bounded per write interval.
    kept = wait_for(lambda: (e := _events(conn, many.message_id)) and e[-1] == ("item 500", "parsed") and e, 5,
                    message="the last report in the history")
    assert kept[:5] == [(f"item {i}", "fetched" if i % 2 else "parsed") for i in range(1, 6)]
    assert len(kept) <= 2 * MAX_REPORTS
    assert scalar(conn, "SELECT progress->>'event' FROM jobs WHERE id = %s", (few.message_id,)) == "parsed"
    shown = cli("jobs", "show", few.message_id, url=database_url)
    assert "[fetched] item 5" in shown.stdout and "[parsed] item 6" in shown.stdout


def _events(conn, job_id: str) -> list[tuple[str, str]]:
    return conn.execute("SELECT message, event FROM job_progress WHERE job_id = %s ORDER BY at, id",
                        (job_id,)).fetchall()


def _history(conn, job_id: str) -> list[tuple[float, str]]:
    return conn.execute("SELECT percent, message FROM job_progress WHERE job_id = %s ORDER BY at, id",
                        (job_id,)).fetchall()


def test_reports_are_kept_when_the_ack_write_fails(conn, producer):
    from supervisor.broker.consuming.progress import ProgressBuffer

    buffer = ProgressBuffer(producer.pool)
    job = scalar(conn, "INSERT INTO jobs (actor, status, attempts, claimed_at) VALUES ('x', 'running', 1, now())"
                 " RETURNING id::text")
    buffer.record(job, 1, 40, "almost")
    with (producer.pool.connection() as c, pytest.raises(psycopg.errors.UndefinedTable),
          buffer.for_ack(c, [job]) as progress):
        assert progress is not None and json.loads(progress[0])["message"] == "almost"
        c.execute("SELECT * FROM no_such_table")  # the ack fails
    assert scalar(conn, "SELECT count(*) FROM job_progress") == 0
    assert buffer.pending()
    with producer.pool.connection() as c:
        assert buffer.write(c) == 1
    assert scalar(conn, "SELECT progress->>'message' FROM jobs WHERE id = %s", (job,)) == "almost"
    assert scalar(conn, "SELECT count(*) FROM job_progress") == 1


def test_reports_are_kept_bounded_per_job_per_write(conn, producer):
    """Many reports between two writes leave at most MAX_REPORTS history rows per job
    (its first ones and its latest); an unchanged report is not written again; an
    acked job's report rides on the ack and its history row goes with the next
    write; attempts no longer held are forgotten."""
    from supervisor.broker.consuming.progress import MAX_REPORTS, ProgressBuffer

    held: set[tuple[str, int]] = set()
    buffer = ProgressBuffer(producer.pool, holds=held.__contains__)
    a, b, c_ = (scalar(conn, "INSERT INTO jobs (actor, status, attempts, claimed_at) VALUES ('x', 'running', 1, now())"
                 " RETURNING id::text")
                for _ in range(3))
    held.update({(a, 1), (b, 1), (c_, 1)})
    for i in range(1, 101):
        buffer.record(a, 1, i, f"a {i}")
        buffer.record(b, 1, 50, "b steady")  # the same report 100 times
    with producer.pool.connection() as c:
        assert buffer.write(c) == MAX_REPORTS + 1
        assert buffer.write(c) == 0 and not buffer.pending()  # nothing changed since
    kept = [(float(i), f"a {i}") for i in range(1, MAX_REPORTS)] + [(100, "a 100")]
    assert _history(conn, a) == kept and _history(conn, b) == [(50, "b steady")]
    assert scalar(conn, "SELECT progress->>'message' FROM jobs WHERE id = %s", (a,)) == "a 100"

    # c reports and is acked before any write: its value comes out of for_ack, a (already
    # written, unchanged) needs nothing; c's history row waits for the next write.
    buffer.record(c_, 1, 100, "c done")
    with producer.pool.connection() as c, buffer.for_ack(c, [a, c_]) as progress:
        assert progress is not None and progress[0] is None and json.loads(progress[1])["message"] == "c done"
        c.execute("UPDATE jobs SET status = 'succeeded', progress = %s::jsonb WHERE id = %s", (progress[1], c_))
    assert _history(conn, c_) == []
    held.discard((b, 1))  # b failed (no ack): its report is dropped at the next write
    with producer.pool.connection() as c:
        assert buffer.write(c) == 1
    assert _history(conn, c_) == [(100, "c done")] and len(_history(conn, a)) == MAX_REPORTS  # a: nothing new
    assert scalar(conn, "SELECT status || ' ' || (progress->>'message') FROM jobs WHERE id = %s",
                  (c_,)) == "succeeded c done"
    # a and c acked, b forgotten: nothing kept
    assert buffer._latest == {} and buffer._written == {} and buffer._unwritten == {}


def test_progress_outside_a_job_does_nothing(producer):
    import supervisor

    supervisor.progress(50, "not in a job")  # no current message: nothing to record, no error


# --- results -------------------------------------------------------------------------------------


def test_get_result_blocks_until_a_worker_stores_it(conn, producer, workers):
    ops_worker(workers, conn)
    msg = producer.enqueue(ops("ops_add", 2, 3, 1.0))  # the waiter is waiting well before the store
    assert msg.get_result(block=True, timeout=20_000) == 5
    returned = time.time()
    stored = scalar(conn, "SELECT extract(epoch FROM stored_at) FROM job_results")
    # Woken by the NOTIFY when the result committed: without it the waiter looks again only after 5 s.
    assert returned - float(stored) < 2.0
    assert scalar(conn, "SELECT result FROM jobs WHERE id = %s", (msg.message_id,)) == 5
    assert msg.get_result() == 5  # and without blocking, now that it is there


def test_failure_and_missing_results(conn, producer, workers):
    fail = producer.enqueue(ops("ops_fail"))
    with pytest.raises(ResultMissing):
        fail.get_result()
    ops_worker(workers, conn)
    with pytest.raises(ResultFailure, match="planned failure"):
        fail.get_result(block=True, timeout=20_000)
    # a job sent by name lives in the log (055): its result shows with its outcome, written
    # just after the result backend's (the failure rides on its done row)
    wait_for(lambda: status(conn, fail.message_id) == "failed", 10, message="the failure written")
    assert scalar(conn, "SELECT result->'exn'->>'type' FROM jobs WHERE id = %s", (fail.message_id,)) == "ValueError"


def test_group_and_pipeline_results(conn, producer, workers):
    ops_worker(workers, conn, threads=4)
    g = group([ops("ops_add", i, i) for i in range(1, 6)]).run()
    assert list(g.get_results(block=True, timeout=20_000)) == [2, 4, 6, 8, 10]
    # The second step gets the first one's result as its last argument: add(10, 1 + 2).
    p = pipeline([ops("ops_add", 1, 2), ops("ops_add", 10)]).run()
    assert p.get_result(block=True, timeout=20_000) == 13
    assert list(p.get_results(block=True, timeout=20_000)) == [3, 13]


def test_results_expire(conn, producer, workers):
    ops_worker(workers, conn)
    msg = producer.enqueue(ops("ops_add", 1, 1, result_ttl=300))
    assert msg.get_result(block=True, timeout=20_000) == 2
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM job_results WHERE expires_at < now()") == 1, 5)
    with pytest.raises(ResultMissing):
        msg.get_result()


def test_backend_made_from_a_url(database_url, conn, producer, workers):
    backend = PostgresBackend(url=database_url)
    try:
        ops_worker(workers, conn)
        msg = producer.enqueue(ops("ops_add", 20, 22))
        assert msg.get_result(backend=backend, block=True, timeout=20_000) == 42
    finally:
        backend.close()


# --- pause and resume --------------------------------------------------------------------------


def claimed(conn, queue: str) -> int:
    return scalar(conn, "SELECT count(*) FROM jobs WHERE queue = %s AND attempts > 0", (queue,))


def on_tests(claim: Claimed) -> bool:
    return claim.queue == "tests"


def test_a_paused_queue_gets_no_claims_from_any_process(conn, workers, database_url):
    from supervisor import admin

    procs = [workers(queues="tests,other", threads=2) for _ in range(2)]
    for p in procs:
        p.wait_ready(conn)
    out = cli("queues", "pause", "tests", "--reason", "maintenance", url=database_url)
    assert out.returncode == 0 and "tests paused" in out.stdout, out.stderr
    # No waiting for the pause to spread: each claim reads queue_pauses in its own statement,
    # and the pause committed before these rows did, so a claim that sees them sees it too.
    enqueue(conn, 20, queue="tests")
    before = [len(p.signals.of(Claimed, on_tests)) for p in procs]
    enqueue(conn, 20, queue="other", sleep_s=0.05)
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE queue = 'other' AND status = 'succeeded'") == 20,
             30, message="the other queue to run")
    assert scalar(conn, "SELECT count(DISTINCT pid) FROM test_results") == 2  # both processes were claiming
    # Each process has claimed from the paused queue twice since its rows committed (woken by
    # their NOTIFY, then at its poll). The second claim began after the first had returned, so
    # after the commit: it saw the rows, and took none.
    for p, n in zip(procs, before, strict=True):
        p.signals.wait(Claimed, on_tests, count=n + 2)
    assert claimed(conn, "tests") == 0

    listing = json.loads(cli("queues", "--json", url=database_url).stdout)
    paused = {r["queue"]: r["paused"] for r in listing}
    assert paused["tests"] == "paused" and paused["other"] is None
    again = cli("queues", "pause", "tests", url=database_url)
    assert again.returncode == 0 and "already paused" in again.stdout

    # Resumed in-process, so the time measured is the workers' (a CLI process start is not).
    assert admin.resume_queue(conn, "tests")
    resumed_at = time.monotonic()
    wait_for(lambda: claimed(conn, "tests") > 0, 10, interval=0.01, message="claims after resume")
    assert time.monotonic() - resumed_at < 3.0  # the NOTIFY wakes them; the 1 s poll is the fallback
    out = cli("queues", "resume", "tests", "--json", url=database_url)
    assert json.loads(out.stdout) == {"queue": "tests", "paused": False, "changed": False}
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 40, 30)


def test_pause_survives_a_restart_and_running_jobs_finish(conn, workers, database_url):
    from supervisor import admin

    first = workers(queues="tests", threads=2)
    first.wait_ready(conn)
    enqueue(conn, 2, sleep_s=1.0)
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'running'") == 2, 10)
    assert admin.pause_queue(conn, "tests", "deploy")
    enqueue(conn, 3)
    # The two running jobs finish; nothing new is claimed.
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 2, 10)
    assert first.terminate() == 0
    second = workers(queues="tests", threads=2)
    second.wait_ready(conn)
    # Its first claim (at once on start, for a backlog) came after the pause and the rows.
    second.signals.wait(Claimed, on_tests)
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'pending'") == 3
    assert [p["reason"] for p in admin.paused_queues(conn)] == ["deploy"]
    assert admin.resume_queue(conn, "tests") and not admin.resume_queue(conn, "tests")
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 5, 10)


# --- retention -----------------------------------------------------------------------------------


SEED_OLD = """
INSERT INTO jobs (id, actor, status, finished_at)
SELECT gen_random_uuid(), 'x', s, now() - interval '8 days'
  FROM unnest(ARRAY['succeeded', 'failed', 'cancelled']) AS s, generate_series(1, %(n)s)
"""


def test_prune_removes_only_what_it_should_while_claims_go_on(conn, workers, database_url, producer):
    from supervisor.config import Retention
    from supervisor.registry import Registration
    from supervisor.worker.upkeep import Upkeep, UpkeepSettings

    conn.execute(SEED_OLD, {"n": 700})
    conn.execute("INSERT INTO job_events (job_id, at, who, from_status, to_status) SELECT id,"
                 " now() - interval '40 days', 'test', 'running', 'succeeded' FROM jobs WHERE status = 'failed'")
    conn.execute("INSERT INTO job_events (job_id, who, from_status, to_status) SELECT id, 'test', 'running', 'failed'"
                 " FROM jobs WHERE status = 'failed'")
    conn.execute("INSERT INTO job_progress (job_id, at, percent) SELECT id, now() - interval '8 days', 100"
                 " FROM jobs WHERE status = 'succeeded'")
    conn.execute("INSERT INTO job_runs (job_name, started_at, status) VALUES"
                 " ('old', now() - interval '31 days', 'succeeded'), ('new', now(), 'succeeded'),"
                 " ('stuck', now() - interval '31 days', 'running')")
    conn.execute("INSERT INTO job_results (key, value, expires_at, stored_at) VALUES"
                 " ('expired', '1', now() - interval '1 second', now()),"
                 " ('live', '2', now() + interval '1 hour', now()),"
                 " ('too-old', '3', now() + interval '9 days', now() - interval '2 days')")

    w = workers(threads=4)
    w.wait_ready(conn)
    stream = JobStream(database_url, per_second=200)
    stream.start()
    try:
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE actor = 'record' AND status = 'succeeded'")
                 > 20, 20)
        registration = Registration(producer.pool, producer.owner, role="t", queues=[])
        upkeep = Upkeep(producer, registration, state=lambda: "running",
                        settings=UpkeepSettings(retention=Retention(), prune_batch=100))
        counts = upkeep.prune()
    finally:
        sent = stream.stop()
    assert counts["succeeded"] == 700 and counts["cancelled"] == 700 and counts["failed"] == 0
    assert counts["events"] == 700 and counts["progress"] == 0  # progress went with its jobs
    assert counts["runs"] == 1 and counts["results"] == 2
    left = dict(conn.execute("SELECT status, count(*) FROM jobs WHERE actor = 'x' GROUP BY 1").fetchall())
    assert left == {"failed": 700}
    # The recent seeded ones stay. The stream's own jobs may add events while it runs (rows
    # given back unstarted when the worker's threads stall on a loaded machine): not counted.
    assert scalar(conn, "SELECT count(*) FROM job_events WHERE who = 'test'") == 700
    assert scalar(conn, "SELECT count(*) FROM job_events e WHERE who <> 'test'"
                        " AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = e.job_id AND j.actor = 'record')") == 0
    assert scalar(conn, "SELECT count(*) FROM job_progress") == 0
    assert sorted(r[0] for r in conn.execute("SELECT job_name FROM job_runs")) == ["new", "stuck"]
    assert [r[0] for r in conn.execute("SELECT key FROM job_results")] == ["live"]
    # Claims went on meanwhile, and every streamed job runs.
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE actor = 'record' AND status = 'succeeded'")
             == sent, 30, message="every streamed job to succeed")


def test_retention_is_read_from_the_config(tmp_path):
    from supervisor.config import parse

    cfg = parse("roles: {w: {queues: [q], actors: [m]}}\nretention: {succeeded: 2d, results: 1h}\n")
    assert cfg.retention.succeeded == 2 * 86400 and cfg.retention.results == 3600
    assert cfg.retention.failed == 30 * 86400  # the default
    with pytest.raises(Exception, match="retention.succeded"):
        parse("roles: {w: {queues: [q], actors: [m]}}\nretention: {succeded: 2d}\n")


# --- the job log line -----------------------------------------------------------------------------


def test_one_json_log_line_per_finished_job(conn, producer, workers):
    w = workers(argv=[sys.executable, "-m", "supervisor.cli", "worker", "--queues", "ops", "--actors",
                      "tests.ops_actors", "--threads", "2", "--role", "ops-role", "--no-migrate", "--json"])
    w.wait_ready(conn)
    ok = producer.enqueue(ops("ops_add", 1, 2))
    bad = producer.enqueue(ops("ops_fail"))
    for m in (ok, bad):
        wait_for(lambda m=m: status(conn, m.message_id) in ("succeeded", "failed"), 20)

    def job_lines() -> dict[str, dict]:
        out = {}
        for line in w.stderr().splitlines():
            if line.startswith("{") and '"logger": "supervisor.jobs"' in line:
                record = json.loads(line)
                out[record["job_id"]] = record
        return out

    lines = wait_for(lambda: len(job_lines()) == 2 and job_lines(), 10, message="two job lines")
    assert isinstance(lines, dict)
    good = lines[ok.message_id]
    assert (good["actor"], good["queue"], good["role"], good["pid"], good["outcome"]) == (
        "ops_add", "ops", "ops-role", w.pid, "succeeded")
    assert good["duration_ms"] >= 0
    assert lines[bad.message_id]["outcome"] == "failed" and "planned failure" in lines[bad.message_id]["error"]


def test_an_actor_adds_fields_to_its_job_log_line_in_json_and_text(conn, producer, workers):
    argv = [sys.executable, "-m", "supervisor.cli", "worker", "--queues", "ops", "--actors", "tests.ops_actors",
            "--threads", "1", "--no-migrate"]
    lines = {}
    for mode, extra in (("json", ["--json"]), ("text", [])):
        w = workers(argv=[*argv, *extra])
        w.wait_ready(conn)
        job = producer.enqueue(ops("ops_counted", 7))
        wait_for(lambda job=job: status(conn, job.message_id) == "succeeded", 20)
        lines[mode] = wait_for(lambda w=w, job=job: [line for line in w.stderr().splitlines()
                                                      if "supervisor.jobs" in line and job.message_id in line],
                               10, message=f"the {mode} job line")
        assert w.terminate() == 0
    record = json.loads(lines["json"][0])
    assert (record["rows"], record["date_from"], record["date_to"]) == (7, "2026-01-01", "2026-01-31")
    assert lines["text"][0].endswith(" succeeded rows=7 date_from=2026-01-01 date_to=2026-01-31")
    with pytest.raises(ValueError, match="job_id is reserved"):
        supervisor.log_fields(job_id="x")


