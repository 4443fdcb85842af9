import multiprocessing
import time

import pytest

from supervisor import ratelimit
from tests.conftest import wait_for
from tests.pipeline_helpers import hammer


def test_refusal_says_how_long_to_wait(conn):
    limit = ratelimit.Limit(per_minute=60, burst=2)
    assert ratelimit.take(conn, "k", limit).granted
    assert ratelimit.take(conn, "k", limit).granted
    refused = ratelimit.take(conn, "k", limit)
    assert not refused.granted and refused.reason == "rate"
    assert 0.5 < refused.wait_seconds <= 1.0
    wait_for(lambda: ratelimit.take(conn, "k", limit).granted, timeout=3, interval=0.05)


def test_daily_quota_refuses_until_utc_midnight(conn):
    limit = ratelimit.Limit(per_minute=6000, burst=10, daily_quota=3)
    assert [ratelimit.take(conn, "q", limit).granted for _ in range(5)] == [True, True, True, False, False]
    refused = ratelimit.take(conn, "q", limit)
    assert refused.reason == "quota" and refused.used_today == 3
    now = time.gmtime()
    to_midnight = 86400 - (now.tm_hour * 3600 + now.tm_min * 60 + now.tm_sec)
    assert abs(refused.wait_seconds - to_midnight) < 5
    # Yesterday's count does not hold today back.
    conn.execute("UPDATE rate_limiter_state SET quota_day = quota_day - 1 WHERE key = 'q'")
    assert ratelimit.take(conn, "q", limit).granted


def test_retry_after_blocks_the_key(conn):
    limit = ratelimit.Limit(per_minute=6000, burst=5)
    assert ratelimit.take(conn, "s", limit).granted
    ratelimit.block(conn, "s", 0.6)
    refused = ratelimit.take(conn, "s", limit)
    assert not refused.granted and refused.reason == "blocked"
    assert 0.3 < refused.wait_seconds <= 0.6
    # A shorter Retry-After never shortens an existing block.
    ratelimit.block(conn, "s", 0.01)
    assert ratelimit.take(conn, "s", limit).reason == "blocked"
    wait_for(lambda: ratelimit.take(conn, "s", limit).granted, timeout=3, interval=0.05)


def test_acquire_sleeps_through_short_waits_and_returns_long_ones(conn, database_url):
    import psycopg

    limit = ratelimit.Limit(per_minute=120, burst=1)  # one token every 0.5 s

    def connect():
        return psycopg.connect(database_url, autocommit=True)

    assert ratelimit.acquire(connect, "a", limit, max_wait=0).granted
    started = time.monotonic()
    assert ratelimit.acquire(connect, "a", limit, max_wait=2).granted
    assert time.monotonic() - started >= 0.3
    refused = ratelimit.acquire(connect, "a", limit, max_wait=0.05)
    assert not refused.granted and refused.wait_seconds > 0.05


def test_bad_limits_are_rejected():
    with pytest.raises(ValueError, match="rate"):
        ratelimit.Limit(per_minute=0)
    with pytest.raises(ValueError, match="burst"):
        ratelimit.Limit(per_minute=1, burst=0)


def _run_batch(url, key, n, seconds, per_minute, burst, quota):
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    barrier = ctx.Barrier(n + 1)
    procs = [ctx.Process(target=hammer, args=(url, key, per_minute, burst, quota, seconds, barrier, out))
             for _ in range(n)]
    for p in procs:
        p.start()
    barrier.wait(60)
    until = time.time() + seconds
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    return [t for grants, _ in results for t in grants], sum(r for _, r in results), until


def test_eight_processes_never_exceed_the_rate_across_a_restart(conn, database_url):
    """A 60/min bucket (burst 5) hammered by 8 processes, all of which then stop
    and are replaced by 8 new ones: the fleet never gets more than burst + rate x
    elapsed, and the new processes get only what the bucket held, not a fresh burst."""
    per_minute, burst = 60, 5
    started = time.time()
    first, refused1, _ = _run_batch(database_url, "source:hammer", 8, 2.0, per_minute, burst, None)
    # What the bucket holds between the two generations, by the database's clock.
    held, read_at = conn.execute(
        "SELECT least(burst, tokens + rate_per_second * extract(epoch FROM clock_timestamp() - updated_at)),"
        " extract(epoch FROM clock_timestamp()) FROM rate_limiter_state WHERE key = 'source:hammer'").fetchone()
    second, refused2, _ = _run_batch(database_url, "source:hammer", 8, 2.0, per_minute, burst, None)
    ended = time.time()
    grants = len(first) + len(second)
    allowed = burst + per_minute / 60 * (ended - started)
    assert grants <= allowed, f"{grants} grants in {ended - started:.2f}s (allowed {allowed:.1f})"
    assert first and second and refused1 > 0 and refused2 > 0
    assert len(second) <= held + per_minute / 60 * (ended - float(read_at)) + 0.01
    assert ratelimit.state(conn, "source:hammer")["granted_total"] == grants


def test_daily_quota_survives_a_restart_of_all_callers(conn, database_url):
    first, _, _ = _run_batch(database_url, "source:quota", 8, 0.5, 6000, 5, 7)
    second, _, _ = _run_batch(database_url, "source:quota", 8, 0.5, 6000, 5, 7)
    assert len(first) == 7 and len(second) == 0
