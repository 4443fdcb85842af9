"""Paced prefetch (broker/pace.py): rows beyond the threads only while jobs are short.
The pure rule with a real Capacity, then two worker processes and long jobs."""

from __future__ import annotations

import pytest

from supervisor import defaults
from supervisor.broker.capacity import Capacity
from supervisor.broker.pace import Pace
from tests.conftest import scalar, wait_for
from tests.supervisor_helpers import enqueue, wait_all_succeeded


def run(pace: Pace, seconds: float, jobs: int = 200) -> int:
    for _ in range(jobs):
        pace.finished(seconds)
    return pace.capacity.limit


def test_starts_at_the_thread_count():
    capacity = Capacity(limit=1 << 30)
    Pace(capacity, threads=8, most=32)
    assert capacity.limit == 8


@pytest.mark.parametrize(("seconds", "limit"), [
    (0.0001, 32),   # no-op jobs: the most the process may hold
    (0.004, 24),    # two rows behind each thread wait 8 ms
    (0.008, 16),    # one row behind each thread waits 8 ms
    (0.05, 8),      # long jobs: nothing waits for a thread
])
def test_rows_beyond_the_threads_wait_under_the_bound(seconds, limit):
    assert defaults.PREFETCH_WAIT_SECONDS == 0.01  # the figures below assume it
    assert run(Pace(Capacity(limit=1), threads=8, most=32), seconds) == limit


def test_follows_the_jobs_down_and_up_again():
    pace = Pace(Capacity(limit=1), threads=4, most=16)
    assert run(pace, 0.0001) == 16
    assert run(pace, 0.2) == 4  # long jobs now: no more hoarding
    assert run(pace, 0.0001) == 16


def test_long_jobs_are_not_hoarded_by_one_process(conn, workers):
    """Two paced processes of 2 threads, 4 jobs of 1 s: each runs 2 at once, so the
    4 run together; a process that took all 4 would make 2 of them wait a second."""
    procs = [workers(threads=2) for _ in range(2)]
    for p in procs:
        p.wait_ready(conn)
    enqueue(conn, 4, sleep_s=1.0)
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'running'") == 4, 10)
    held = dict(conn.execute("SELECT lease_owner, count(*) FROM jobs WHERE status = 'running' GROUP BY 1").fetchall())
    assert sorted(held.values()) == [2, 2], held
    wait_all_succeeded(conn, 4, timeout=20)
    assert scalar(conn, "SELECT count(DISTINCT pid) FROM test_results") == 2


def test_a_long_job_still_running_slows_the_claims_before_it_ends():
    pace = Pace(Capacity(limit=1), threads=4, most=16)
    assert run(pace, 0.0001) == 16
    for elapsed in (0.05, 0.1, 0.15, 0.2, 0.25):  # the fence's checks while one job runs on
        pace.running(elapsed)
    assert pace.capacity.limit == 4
