"""Cron schedules under scheduler_locks, recorded in job_runs."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import dramatiq
import pytest

from supervisor import db
from supervisor.config import ScheduleConfig
from supervisor.worker.scheduler import Scheduler
from tests.conftest import scalar, wait_for

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
POLL = ScheduleConfig(name="poll", cron="* * * * *", actor="poll_due_watches", queue="scraping",
                      kwargs={"limit": 10}, lock_ttl_seconds=30)


def hosts(broker, n=2, **kwargs) -> list[Scheduler]:
    return [Scheduler(broker, [POLL], holder=f"host-{i}", **kwargs) for i in range(n)]


def test_two_hosts_firing_the_same_time_run_it_once(conn, pipeline_broker):
    a, b = hosts(pipeline_broker)
    barrier = threading.Barrier(2)
    outcomes = []

    def fire(s):
        barrier.wait(10)
        outcomes.append(s.fire(POLL, T0))

    threads = [threading.Thread(target=fire, args=(s,)) for s in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(outcomes) == ["fired", "not-ours"]
    job = conn.execute("SELECT id, queue, actor, kwargs, dedupe_key, options->>'scheduled_for' FROM jobs").fetchall()
    assert len(job) == 1 and job[0][1:] == ("scraping", "poll_due_watches", {"limit": 10}, "schedule:poll",
                                           T0.isoformat())
    run = conn.execute("SELECT job_name, scheduled_for, status, job_id FROM job_runs").fetchall()
    assert run == [("poll", T0, "running", job[0][0])]
    # A host whose clock runs late fires the same time after the lease was released: nothing happens.
    assert a.fire(POLL, T0) == "not-ours"
    assert scalar(conn, "SELECT count(*) FROM jobs") == 1
    assert conn.execute("SELECT fire_at, expires_at <= now() FROM scheduler_locks").fetchone() == (T0, True)


def test_a_live_previous_job_makes_the_next_fire_a_skip(conn, pipeline_broker):
    (a,) = hosts(pipeline_broker, 1)
    assert a.fire(POLL, T0) == "fired"
    assert a.fire(POLL, T0 + timedelta(minutes=1)) == "skipped"
    assert [r[0] for r in conn.execute("SELECT status FROM job_runs ORDER BY scheduled_for")] == ["running", "skipped"]
    assert "still pending or running" in scalar(conn, "SELECT error_text FROM job_runs WHERE status = 'skipped'")


def test_a_lease_held_by_a_crashed_host_expires(conn, pipeline_broker):
    from supervisor.worker import scheduler_sql as sql

    short = ScheduleConfig(name="short", cron="* * * * *", actor="noop", queue="default", lock_ttl_seconds=0.5)
    conn.execute(sql.ACQUIRE, {"name": "short", "holder": "dead-host", "ttl_s": 0.5, "fire_at": T0})
    (a,) = hosts(pipeline_broker, 1)
    assert a.fire(short, T0 + timedelta(minutes=1)) == "not-ours"
    wait_for(lambda: a.fire(short, T0 + timedelta(minutes=1)) == "fired", timeout=5, interval=0.1)


def test_runs_follow_their_jobs_and_crashes_are_found(conn, pipeline_broker):
    (a,) = hosts(pipeline_broker, 1)
    for n, name in enumerate(["ok", "bad", "lost"]):
        s = ScheduleConfig(name=name, cron="* * * * *", actor="noop", queue="default")
        assert a.fire(s, T0 + timedelta(minutes=n)) == "fired"
    conn.execute("UPDATE jobs SET status = 'succeeded', finished_at = now() WHERE dedupe_key = 'schedule:ok'")
    conn.execute("UPDATE jobs SET status = 'failed', finished_at = now(), last_error = 'boom'"
                 " WHERE dedupe_key = 'schedule:bad'")
    conn.execute("DELETE FROM jobs WHERE dedupe_key = 'schedule:lost'")
    # A run whose scheduler died before enqueueing.
    conn.execute("INSERT INTO job_runs (job_name, started_at) VALUES ('died', now() - interval '1 hour')")
    a.sync()
    assert a.recover() == 1
    assert dict(conn.execute("SELECT job_name, status FROM job_runs").fetchall()) == {
        "ok": "succeeded", "bad": "failed", "lost": "crashed", "died": "crashed"}
    assert scalar(conn, "SELECT error_text FROM job_runs WHERE job_name = 'bad'") == "boom"


def test_scheduler_threads_on_two_hosts_fire_each_minute_once(conn, pipeline_broker):
    """Both threads wake at the same cron time (their clocks read one second
    before a minute boundary when they start); one of them enqueues."""
    offset = (T0 - timedelta(seconds=1)) - datetime.now(UTC)
    schedulers = hosts(pipeline_broker, 2, clock=lambda: datetime.now(UTC) + offset, sync_seconds=0.2)
    for s in schedulers:
        s.start()
    try:
        wait_for(lambda: all(s.fired for s in schedulers), timeout=10, message="both schedulers to fire")
    finally:
        for s in schedulers:
            s.stop()
    outcomes = sorted(o for s in schedulers for (_, when, o) in s.fired if when == T0)
    assert outcomes == ["fired", "not-ours"]
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE actor = 'poll_due_watches'") == 1
    assert scalar(conn, "SELECT count(*) FROM job_runs WHERE scheduled_for = %s", (T0,)) == 1


def test_the_worker_process_runs_the_scheduler_only_with_schedules(database_url, conn, pipeline_broker):
    from supervisor.config import RoleConfig
    from supervisor.worker.process import WorkerProcess
    from supervisor.worker.settings import WorkerSettings

    previous = dramatiq.broker.global_broker
    try:
        for schedules, expected in (((), False), ((POLL,), True)):
            role = RoleConfig(name="worker", queues=("scraping",), actors=("actors.scraping",), threads=1,
                              shutdown_timeout=2)
            proc = WorkerProcess(WorkerSettings(role=role, schedules=schedules),
                                db.resolve(database_url, pooled=False))
            proc.start()
            try:
                assert (proc.scheduler is not None and proc.scheduler.is_alive()) == expected
            finally:
                proc.drain()
            assert proc.scheduler is None or not proc.scheduler.is_alive()
    finally:
        dramatiq.set_broker(previous)


@pytest.mark.parametrize("bad", ["* * *", "61 * * * *"])
def test_a_bad_cron_is_refused_up_front(pipeline_broker, bad):
    with pytest.raises(ValueError):
        Scheduler(pipeline_broker, [ScheduleConfig(name="x", cron=bad, actor="a")], holder="h")


def test_scheduled_jobs_record_rows_affected_on_their_run(conn, database_url, pipeline_broker):
    """A worker process records what each bundled scheduled actor reports."""
    from tests.pipeline_helpers import PipelineWorker, make_source, make_watch

    source_id = make_source(conn)
    for n in range(3):
        make_watch(conn, source_id, f"q{n}", enabled=n < 2)  # two due watches
    conn.execute("INSERT INTO listings (source_id, external_id, title, price_cents, product_key, last_seen_at)"
                 " SELECT %s, 'l' || n, 't', 100, 'k:' || n, now() FROM generate_series(1, 4) n", (source_id,))
    conn.execute("UPDATE listings SET unit_price_cents = price_cents")
    (a,) = hosts(pipeline_broker, 1)
    schedules = [ScheduleConfig(name="poll", cron="* * * * *", actor="poll_due_watches", queue="scraping"),
                 ScheduleConfig(name="baselines", cron="* * * * *", actor="refresh_baselines", queue="extraction"),
                 ScheduleConfig(name="forecasts", cron="* * * * *", actor="forecast_daily", queue="forecasting")]
    for s in schedules:
        assert a.fire(s, T0) == "fired"
    worker = PipelineWorker(database_url, queues=("scraping", "extraction", "forecasting"),
                            actors=("actors.scraping", "actors.extraction", "actors.forecasting"))
    try:
        worker.wait_ready(conn)
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM job_runs WHERE rows_affected IS NOT NULL") == 3, 30,
                 message="rows_affected on every run")
    finally:
        worker.kill()
    # 2 watches due; 4 baselines + 4 listings re-scored; 4 products to forecast.
    assert dict(conn.execute("SELECT job_name, rows_affected FROM job_runs").fetchall()) == {
        "poll": 2, "baselines": 8, "forecasts": 4}
