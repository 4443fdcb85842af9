"""Shared helpers for the pipeline tests (rate limiter, breaker, actors, scheduler)."""

from __future__ import annotations

import time


def hammer(url: str, key: str, per_minute: float, burst: int, quota: int | None, seconds: float,
           barrier, out) -> None:
    """Take from one limiter key as fast as allowed for ``seconds`` after every
    caller is ready; report the wall time of every grant. Runs in a spawned process."""
    import psycopg

    from supervisor import ratelimit

    limit = ratelimit.Limit(per_minute=per_minute, burst=burst, daily_quota=quota)
    grants: list[float] = []
    refusals = 0
    with psycopg.connect(url, autocommit=True) as conn:
        barrier.wait(60)
        until = time.time() + seconds
        while (now := time.time()) < until:
            decision = ratelimit.take(conn, key, limit)
            if decision.granted:
                grants.append(time.time())
            else:
                refusals += 1
                time.sleep(max(0.0, min(decision.wait_seconds, until - now)))
    out.put((grants, refusals))
