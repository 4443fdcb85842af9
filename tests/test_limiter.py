"""supervisor.rate_limits.PostgresBackend: Dramatiq's rate-limiter backend contract on a
real PostgreSQL, a barrier woken by NOTIFY, and ConcurrentRateLimiter across worker
processes (issue 41)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from dramatiq.rate_limits import Barrier, WindowRateLimiter

from supervisor.broker.limiter import RECHECK_SECONDS
from supervisor.rate_limits import PostgresBackend
from tests.conftest import scalar, wait_for


@pytest.fixture
def backend(conn, database_url) -> Iterator[PostgresBackend]:
    b = PostgresBackend(url=database_url)
    yield b
    b.close()


def expire(conn, key: str) -> None:
    """The key's TTL over, as time would make it (no sleep)."""
    conn.execute("UPDATE limiter_keys SET expires_at = now() - interval '1 ms' WHERE key = %s", (key,))


def test_add_sets_only_an_absent_or_expired_key(conn, backend):
    assert backend.add("k", 3, 60_000)
    assert not backend.add("k", 5, 60_000)
    assert scalar(conn, "SELECT value FROM limiter_keys WHERE key = 'k'") == 3
    expire(conn, "k")
    assert backend.add("k", 5, 60_000)
    assert scalar(conn, "SELECT value FROM limiter_keys WHERE key = 'k'") == 5


def test_incr_and_decr_stay_within_their_bounds(conn, backend):
    assert backend.incr("c", 1, 2, 60_000) and backend.incr("c", 1, 2, 60_000)
    assert not backend.incr("c", 1, 2, 60_000)
    assert backend.decr("c", 1, 0, 60_000) and backend.decr("c", 1, 0, 60_000)
    assert not backend.decr("c", 1, 0, 60_000)  # would go below 0
    assert not backend.decr("absent", 1, 0, 60_000)  # an absent key is 0
    assert not backend.incr("big", 5, 2, 60_000)  # more than the maximum at once
    assert scalar(conn, "SELECT count(*) FROM limiter_keys WHERE key IN ('absent', 'big')") == 0
    # an existing value below 0 may take a step larger than the maximum
    assert backend.decr("neg", 4, -10, 60_000) and backend.incr("neg", 5, 2, 60_000)
    assert scalar(conn, "SELECT value FROM limiter_keys WHERE key = 'neg'") == 1
    # an expired key counts from 0 again
    assert backend.incr("c", 2, 2, 60_000)
    expire(conn, "c")
    assert backend.incr("c", 2, 2, 60_000)


def test_incr_and_sum_bounds_the_window(conn, backend):
    keys = ["w@1", "w@2", "w@3"]
    assert backend.incr_and_sum("w@1", lambda: keys, 1, 3, 60_000)
    assert backend.incr_and_sum("w@2", lambda: keys, 2, 3, 60_000)
    assert not backend.incr_and_sum("w@3", lambda: keys, 1, 3, 60_000)  # the window holds 3
    expire(conn, "w@2")  # a bucket that left the window's TTL counts no more
    assert backend.incr_and_sum("w@3", lambda: keys, 2, 3, 60_000)
    assert not backend.incr_and_sum("w@3", lambda: keys, 1, 3, 60_000)


def test_window_limiter_across_threads_never_exceeds_its_limit(conn, backend):
    limiter = WindowRateLimiter(backend, "window", limit=5, window=60)
    taken = []

    def work() -> None:
        for _ in range(10):
            with limiter.acquire(raise_on_failure=False) as ok:
                if ok:
                    taken.append(1)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(taken) == 5


def test_a_blocked_barrier_wakes_on_the_notify_not_a_recheck(conn, backend, database_url):
    barrier = Barrier(backend, "b1", ttl=60_000)
    assert barrier.create(parties=2)
    woke: list[float] = []
    waiting = threading.Thread(target=lambda: woke.append(barrier.wait(timeout=30_000) and time.monotonic()))
    waiting.start()
    # the waiter has LISTENed and looked (finding no event): its connection waits for a notify
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT 1 FROM limiter_keys%%'"
                            " AND state = 'idle' AND datname = current_database()") >= 1, 10,
             message="the waiter to look")
    other = PostgresBackend(url=database_url)  # another party, as another process would be
    try:
        cleared_at = time.monotonic()
        assert Barrier(other, "b1", ttl=60_000).wait(block=False)
    finally:
        other.close()
    waiting.join(10)
    assert woke and woke[0] - cleared_at < RECHECK_SECONDS / 10, woke
    # an event published earlier is still seen by a later wait (as with Redis)
    assert barrier.wait(timeout=1000)


def test_a_wait_times_out_without_an_event(conn, backend):
    started = time.monotonic()
    assert not backend.wait("nothing", 300)
    assert 0.25 < time.monotonic() - started < 3


def test_the_upkeeps_prune_deletes_expired_rows_only(conn, backend, broker):
    from supervisor.registry import Registration
    from supervisor.worker.upkeep import Upkeep, UpkeepSettings

    backend.add("old", 1, 60_000)
    backend.add("live", 1, 60_000)
    expire(conn, "old")
    conn.execute("INSERT INTO group_arrivals (barrier, member, expires_at) VALUES ('g', 'm', now() - interval '1 s'),"
                 " ('g', 'n', now() + interval '1 h')")
    conn.execute("INSERT INTO pipeline_fanins (id, size, expires_at) VALUES (gen_random_uuid(), 2, now() - interval '1 s')")
    registration = Registration(broker.pool, broker.owner, role="t", queues=["tests"])
    counts = Upkeep(broker, registration, settings=UpkeepSettings(), state=lambda: "running").prune()
    assert (counts["limiter keys"], counts["group arrivals"], counts["pipeline fan-ins"]) == (1, 1, 1)
    assert [r[0] for r in conn.execute("SELECT key FROM limiter_keys")] == ["live"]
    assert [r[0] for r in conn.execute("SELECT member FROM group_arrivals")] == ["n"]


def test_concurrent_limiter_holds_across_two_worker_processes(conn, workers):
    """ConcurrentRateLimiter(PostgresBackend(), key, limit=2) in actors run by 2 processes x 4
    threads: each job records when it entered and left; never 3 inside at once."""
    procs = [workers(actors="tests.workflow_actors", threads=4) for _ in range(2)]
    for w in procs:
        w.wait_ready(conn, timeout=90)
    conn.execute("INSERT INTO jobs (queue, actor, args) SELECT 'tests', 'slotted', jsonb_build_array(g)"
                 " FROM generate_series(1, 60) g")
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 60, 120,
             interval=0.1, message="60 slotted jobs")
    overlap = scalar(conn, """
        SELECT max((SELECT count(*) FROM test_results b
                     WHERE b.tag = 'slot' AND b.started <= a.started AND b.finished > a.started))
          FROM test_results a WHERE a.tag = 'slot'""")
    assert scalar(conn, "SELECT count(DISTINCT pid) FROM test_results WHERE tag = 'slot'") == 2
    assert scalar(conn, "SELECT count(*) FROM test_results WHERE tag = 'slot' AND finished IS NOT NULL") == 60
    assert overlap == 2  # both slots were used, a third never
    assert scalar(conn, "SELECT value FROM limiter_keys WHERE key = 'workflow-test-slots'") == 0
