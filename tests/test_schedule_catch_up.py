"""Missed schedules: what a schedule's catch_up does with the fires no scheduler ran.

"The supervisor was down" is a last fire recorded long ago in scheduler_locks (as a
scheduler records it), and a scheduler whose clock reads a later time; no sleeps.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from supervisor import cron
from supervisor.config import ScheduleConfig
from supervisor.worker import scheduler_sql as sql
from supervisor.worker.scheduler import Scheduler, missed_fires
from tests.conftest import scalar, wait_for

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
HOURLY = ScheduleConfig(name="report", cron="0 * * * *", actor="hold", queue="tests", args=("report", 0.2))


def last_fired(conn, schedule: ScheduleConfig, when: datetime) -> None:
    """The state a scheduler leaves after firing ``when`` (its lease released)."""
    conn.execute(sql.ACQUIRE, {"name": schedule.name, "holder": "long-gone", "ttl_s": 0, "fire_at": when})


def clock_at(when: datetime) -> Callable[[], datetime]:
    """A clock that reads ``when`` now and runs on in real time."""
    offset = when - datetime.now(UTC)
    return lambda: datetime.now(UTC) + offset


@pytest.fixture
def started(broker) -> Iterator[Callable[..., list[Scheduler]]]:
    """Scheduler threads on named hosts, all started at once, stopped after the test."""
    running: list[Scheduler] = []

    def start(schedule: ScheduleConfig, now: datetime, hosts: int = 1) -> list[Scheduler]:
        schedulers = [Scheduler(broker, [schedule], holder=f"host-{i}", clock=clock_at(now), sync_seconds=0.2)
                      for i in range(hosts)]
        running.extend(schedulers)
        for s in schedulers:
            s.start()
        return schedulers

    yield start
    for s in running:
        s.stop()


def past_it(hosts: list[Scheduler], fire_at: datetime) -> None:
    """Wait until every host is done with ``fire_at``: each waits for the next fire time."""
    wait_for(lambda: all((h.due["report"] or fire_at) > fire_at for h in hosts), 10,
             message=f"every host past {fire_at}")


def runs(conn) -> list[tuple[datetime, str, str]]:
    return conn.execute("SELECT scheduled_for, holder, status FROM job_runs ORDER BY scheduled_for").fetchall()


def jobs(conn) -> list[tuple]:
    """Each job's fire time, dedupe and concurrency keys, in the order they are claimed."""
    return conn.execute(
        "SELECT (options->>'scheduled_for')::timestamptz, dedupe_key, concurrency_key FROM jobs"
        " ORDER BY priority DESC, run_at, id").fetchall()


def test_none_the_default_skips_what_was_missed(conn, started):
    """Today's behaviour, unchanged: a scheduler starting after three hours down waits
    for the next fire time, records nothing for the missed ones, then fires as usual."""
    assert HOURLY.catch_up == "none"
    last_fired(conn, HOURLY, T0 - 3 * HOUR)
    (host,) = started(HOURLY, T0 - timedelta(seconds=1))
    wait_for(lambda: host.fired, 10, message="the next fire")
    assert host.fired == [("report", T0, "fired")]
    assert [r[0] for r in runs(conn)] == [T0]
    assert jobs(conn) == [(T0, "schedule:report", None)]


def test_last_runs_the_latest_missed_fire_once_across_two_hosts(conn, started):
    last = replace(HOURLY, catch_up="last")
    last_fired(conn, last, T0 - 6 * HOUR)
    hosts = started(last, T0 + timedelta(minutes=20), hosts=2)
    past_it(hosts, T0)
    # The host that starts later finds it fired already, or loses the lease.
    assert sorted(f for h in hosts for f in h.fired) in ([("report", T0, "fired")],
                                                         [("report", T0, "fired"), ("report", T0, "not-ours")])
    (run,) = runs(conn)
    assert run[0] == T0 and run[2] == "running"
    assert jobs(conn) == [(T0, "schedule:report", None)]  # a fire as any other: skipped while one is live
    assert scalar(conn, "SELECT fire_at FROM scheduler_locks") == T0


def test_all_runs_each_missed_fire_once_oldest_first_across_two_hosts(conn, started):
    every = replace(HOURLY, catch_up="all")
    last_fired(conn, every, T0 - 5 * HOUR)
    hosts = started(every, T0 + timedelta(minutes=10), hosts=2)
    past_it(hosts, T0)
    wanted = [T0 - n * HOUR for n in (4, 3, 2, 1, 0)]
    (winner,) = [h for h in hosts if h.fired and h.fired[-1][2] == "fired"]
    (loser,) = [h for h in hosts if h is not winner]
    assert winner.fired == [("report", t, "fired") for t in wanted]
    assert loser.fired in ([], [("report", T0, "not-ours")])
    assert runs(conn) == [(t, winner.holder, "running") for t in wanted]
    # Claimed oldest first, one at a time; only the fire itself is skipped while a fire's job is live.
    assert jobs(conn) == [(t, "schedule:report" if t == T0 else None, "schedule:report") for t in wanted]
    assert scalar(conn, "SELECT count(*) FROM job_runs WHERE job_id IS NOT NULL") == 5


def test_all_is_bounded_by_its_limit_and_its_window(conn, broker):
    bounded = replace(HOURLY, catch_up="all", catch_up_limit=3)
    host = Scheduler(broker, [bounded], holder="h", clock=clock_at(T0 + timedelta(minutes=1)))
    last_fired(conn, bounded, T0 - 10 * 24 * HOUR)
    assert host.fire(bounded, T0) == "fired"
    assert [r[0] for r in runs(conn)] == [T0 - 3 * HOUR, T0 - 2 * HOUR, T0 - HOUR, T0]  # the latest 3, then T0
    windowed = replace(bounded, name="windowed", catch_up_limit=100, catch_up_window=2.5 * 3600)
    host = Scheduler(broker, [windowed], holder="h", clock=clock_at(T0 + timedelta(minutes=1)))
    last_fired(conn, windowed, T0 - 10 * 24 * HOUR)
    assert host.fire(windowed, T0) == "fired"
    assert scalar(conn, "SELECT array_agg(scheduled_for ORDER BY scheduled_for) FROM job_runs"
                        " WHERE job_name = 'windowed'") == [T0 - 2 * HOUR, T0 - HOUR, T0]


def test_last_skips_a_missed_fire_older_than_its_window(conn, started):
    daily = replace(HOURLY, cron="0 0 * * *", catch_up="last", catch_up_window=3600)
    midnight = T0.replace(hour=0)
    last_fired(conn, daily, midnight - 3 * 24 * HOUR)
    (host,) = started(daily, midnight + 6 * HOUR)
    wait_for(lambda: host.fired, 10, message="the missed fire")
    assert host.fired == [("report", midnight, "missed")]
    assert runs(conn) == [] and jobs(conn) == []


def test_a_new_schedule_catches_up_from_when_it_became_known(conn, started):
    """A schedule that never fired missed nothing before its first start; from then on,
    what the next outage misses is caught up, though it never fired in between."""
    every = replace(HOURLY, catch_up="all")
    known = T0 + timedelta(minutes=10)
    (first,) = started(every, known)
    past_it([first], T0)
    first.stop()
    assert first.due["report"] == T0 + HOUR and first.fired == [] and runs(conn) == []
    fire_at, locked_at = conn.execute("SELECT fire_at, locked_at FROM scheduler_locks").fetchone()
    assert fire_at is None and known <= locked_at < known + timedelta(seconds=5)  # known at its start
    # Down from T0 + 10 min to T0 + 3 h 10 min: the fires at 1, 2 and 3 h run.
    (second,) = started(every, T0 + 3 * HOUR + timedelta(minutes=10))
    wait_for(lambda: second.fired, 10, message="the catch-up")
    assert [(when, o) for (_, when, o) in second.fired] == [(T0 + n * HOUR, "fired") for n in (1, 2, 3)]


def test_caught_up_jobs_run_one_at_a_time_oldest_first(conn, broker, workers):
    """A real worker process runs the caught-up jobs in their fire times' order, never two at once."""
    every = replace(HOURLY, catch_up="all")
    last_fired(conn, every, T0 - 4 * HOUR)
    host = Scheduler(broker, [every], holder="h", clock=clock_at(T0 + timedelta(minutes=1)))
    assert host.fire(every, T0) == "fired"
    worker = workers(threads=4)
    worker.wait_ready(conn)
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM test_results") == 4, 30, message="every job done")
    spans = conn.execute("SELECT r.scheduled_for, t.started, t.finished FROM job_runs r"
                         " JOIN test_results t ON t.job_id = r.job_id ORDER BY t.started").fetchall()
    assert [s[0] for s in spans] == [T0 - n * HOUR for n in (3, 2, 1, 0)]
    for (_, _, end), (_, start, _) in zip(spans, spans[1:], strict=False):
        assert start >= end - timedelta(milliseconds=5)
    wait_for(lambda: host.sync() or scalar(conn, "SELECT count(*) FROM job_runs WHERE status = 'succeeded'") == 4,
             10, message="the runs to follow their jobs")


@pytest.mark.parametrize("limit, oldest, expected, left_out", [
    (100, None, [1, 2, 3, 4], False),
    (2, None, [3, 4], True),
    (100, 2, [2, 3, 4], True),
    (4, None, [1, 2, 3, 4], False),
])
def test_missed_fires_count_back_from_the_fire(limit, oldest, expected, left_out):
    """The fires after the last one (hour 0) and before this one (hour 5), latest first
    up to the limit, none before the window's start; oldest first."""
    hourly = cron.parse("0 * * * *")
    times, cut = missed_fires(hourly, T0, T0 + 5 * HOUR, limit, T0 + oldest * HOUR if oldest else None)
    assert times == [T0 + n * HOUR for n in expected] and cut == left_out


def test_one_fire_time_runs_once_whoever_catches_up(conn, broker):
    """Two hosts catching up the same outage at the same instant: each fire time once."""
    every = replace(HOURLY, catch_up="all")
    last_fired(conn, every, T0 - 24 * HOUR)
    hosts = [Scheduler(broker, [every], holder=f"host-{i}", clock=clock_at(T0)) for i in range(2)]
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def fire(host: Scheduler) -> None:
        barrier.wait(10)
        outcomes.append(host.fire(every, T0))

    threads = [threading.Thread(target=fire, args=(h,)) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(outcomes) == ["fired", "not-ours"]
    assert scalar(conn, "SELECT count(DISTINCT scheduled_for) FROM job_runs") == 24
    assert scalar(conn, "SELECT count(*) FROM job_runs") == 24 == scalar(conn, "SELECT count(*) FROM jobs")
    assert scalar(conn, "SELECT count(DISTINCT holder) FROM job_runs") == 1
