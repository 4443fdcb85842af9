"""Schedules in a time zone, through both DST changes of a year, on the real scheduler
and PostgreSQL. The schedulers are driven by ``Scheduler.tick`` with the times of a
clock the test moves (minute by minute, a few seconds late, as a running thread sees
them): no sleeps, no threads.

US DST in 2026: forward on Sunday March 8 at 02:00 EST, back on Sunday November 1 at
02:00 EDT. New York is UTC-5 in winter (EST) and UTC-4 in summer (EDT).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from supervisor.config import ScheduleConfig
from supervisor.worker import scheduler_sql as sql
from supervisor.worker.scheduler import Scheduler

NY = "America/New_York"
REPORT = ScheduleConfig(name="report", cron="30 9 * * *", actor="hold", queue="tests", timezone=NY)
IN_GAP = ScheduleConfig(name="in-gap", cron="30 2 * * *", actor="hold", queue="tests", timezone=NY)
REPEATED = ScheduleConfig(name="repeated", cron="30 1 * * *", actor="hold", queue="tests", timezone=NY)


def at(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


class Clock:
    """The time the schedulers read: moved by the test only."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def drive(conn, hosts: list[Scheduler], clock: Clock, start: datetime, end: datetime) -> None:
    """Every host ticks at each minute from ``start`` to ``end``, 5 s past it; each fire's
    job then finishes (so the next fire is not skipped behind it)."""
    clock.now = start + timedelta(seconds=5)
    seen = 0
    while clock.now < end:
        for host in hosts:
            host.tick(clock.now)
        if sum(len(h.fired) for h in hosts) > seen:
            conn.execute("UPDATE jobs SET status = 'succeeded', finished_at = now() WHERE status = 'pending'")
            seen = sum(len(h.fired) for h in hosts)
        clock.now += timedelta(minutes=1)


def fired(hosts: list[Scheduler]) -> dict[str, list[datetime]]:
    out: dict[str, list[datetime]] = {}
    for host in hosts:
        for name, when, outcome in host.fired:
            assert outcome in ("fired", "not-ours"), (name, when, outcome)
            if outcome == "fired":
                out.setdefault(name, []).append(when)
    return {name: sorted(times) for name, times in out.items()}


def runs(conn) -> dict[str, list[datetime]]:
    out: dict[str, list[datetime]] = {}
    for name, when in conn.execute("SELECT job_name, scheduled_for FROM job_runs ORDER BY scheduled_for"):
        out.setdefault(name, []).append(when)
    return out


def two_hosts(broker, clock: Clock, *schedules: ScheduleConfig) -> list[Scheduler]:
    return [Scheduler(broker, schedules, holder=f"host-{i}", clock=clock, sync_seconds=3600) for i in range(2)]


def test_spring_forward_fires_each_time_once_across_two_hosts(conn, broker):
    """09:30 stays 09:30 in New York; 02:30, which does not exist on March 8, fires
    once at 03:00 EDT, right after the gap."""
    clock = Clock(at(2026, 3, 7, 5))
    hosts = two_hosts(broker, clock, REPORT, IN_GAP)
    drive(conn, hosts, clock, at(2026, 3, 7, 5), at(2026, 3, 9, 16))
    expected = {
        "report": [at(2026, 3, 7, 14, 30), at(2026, 3, 8, 13, 30), at(2026, 3, 9, 13, 30)],  # 09:30 EST, EDT, EDT
        "in-gap": [at(2026, 3, 7, 7, 30), at(2026, 3, 8, 7, 0), at(2026, 3, 9, 6, 30)],  # 02:30 EST, 03:00 EDT, 02:30 EDT
    }
    assert fired(hosts) == expected
    assert runs(conn) == expected  # one job_runs row per fire time across both hosts


def test_fall_back_fires_the_repeated_hour_once_the_first_time(conn, broker):
    clock = Clock(at(2026, 10, 31, 4))
    hosts = two_hosts(broker, clock, REPORT, REPEATED)
    drive(conn, hosts, clock, at(2026, 10, 31, 4), at(2026, 11, 2, 15))
    expected = {
        "report": [at(2026, 10, 31, 13, 30), at(2026, 11, 1, 14, 30), at(2026, 11, 2, 14, 30)],  # 09:30 EDT, EST, EST
        # 01:30 EDT on Nov 1 (05:30Z) fires; 01:30 EST an hour later (06:30Z) does not.
        "repeated": [at(2026, 10, 31, 5, 30), at(2026, 11, 1, 5, 30), at(2026, 11, 2, 6, 30)],
    }
    assert fired(hosts) == expected
    assert runs(conn) == expected


def test_catch_up_all_counts_missed_fires_in_zone_time(conn, broker):
    """Down from March 7 to March 10: the missed 09:30s on either side of the change
    each run once, at their New York times."""
    every = replace(REPORT, catch_up="all")
    conn.execute(sql.ACQUIRE, {"name": "report", "holder": "long-gone", "ttl_s": 0, "fire_at": at(2026, 3, 7, 14, 30)})
    clock = Clock(at(2026, 3, 10, 16))  # 12:00 EDT on the 10th
    (host,) = two_hosts(broker, clock, every)[:1]
    host.tick(clock.now)
    expected = [at(2026, 3, 8, 13, 30), at(2026, 3, 9, 13, 30), at(2026, 3, 10, 13, 30)]
    assert [(when, outcome) for _, when, outcome in host.fired] == [(t, "fired") for t in expected]
    assert runs(conn) == {"report": expected}
    assert host.due["report"] == at(2026, 3, 11, 13, 30)
