"""Token buckets and daily quotas held in PostgreSQL.

Every process on every host takes from the same row, so the limit holds for the
fleet, and a restarted worker finds the bucket as it was left (no fresh burst,
no fresh daily quota). A caller that is refused learns how long to wait; a 429
from upstream blocks the key for its Retry-After.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import psycopg

# --- SQL on rate_limiter_state: a caller's takes and blocks ----------------------
# (The runtime's claim takes from the same rows, and RateLimited blocks them, in their own
# statements: broker/sql/flow.py. One table of buckets, whoever takes.)
# One statement: refill, check block/quota/tokens, take, and report (see 004_rate_limits.sql).
_TAKE = """
SELECT granted, wait_seconds, reason, tokens_left, used_today
  FROM rate_limit_take(%(key)s, %(cost)s, %(burst)s, %(rate)s, %(quota)s)
"""

# A 429 from upstream: nobody takes from this key until the block ends, and the
# bucket restarts empty so the first requests after it do not arrive as a burst.
_BLOCK = """
INSERT INTO rate_limiter_state AS s (key, tokens, burst, rate_per_second, updated_at, blocked_until)
VALUES (%(key)s, 0, 1, 1, clock_timestamp(), clock_timestamp() + %(seconds)s * interval '1 second')
ON CONFLICT (key) DO UPDATE
   SET blocked_until = greatest(coalesce(s.blocked_until, '-infinity'), EXCLUDED.blocked_until),
       tokens = 0,
       updated_at = greatest(s.updated_at, EXCLUDED.updated_at)
RETURNING blocked_until
"""

# An operator's override of a key's limits (migration 037; supervisor/limits.py checks it):
# the claim reads it through the bucket's join (broker/sql/flow.py ``_gate``). A key with no
# bucket yet gets one holding no tokens (NULL: full, whatever burst applies).
SET_OVERRIDE = """
WITH old AS (SELECT override FROM rate_limiter_state WHERE key = %(key)s)
INSERT INTO rate_limiter_state AS s (key, tokens, burst, rate_per_second, updated_at, daily_quota,
                                     override, override_by, override_at)
VALUES (%(key)s, NULL, coalesce((%(override)s::jsonb->>'b')::float8, 1),
        coalesce((%(override)s::jsonb->>'r')::float8, 1), now(), (%(override)s::jsonb->>'q')::int,
        %(override)s, %(by)s, now())
ON CONFLICT (key) DO UPDATE
   SET override = EXCLUDED.override, override_by = EXCLUDED.override_by, override_at = EXCLUDED.override_at
RETURNING key, override, override_by, override_at, (SELECT override FROM old) AS previous
"""

# Back to the limits the jobs carry; the bucket stays (its tokens, quota and block).
CLEAR_OVERRIDE = """
UPDATE rate_limiter_state s SET override = NULL, override_by = %(by)s, override_at = now()
  FROM (SELECT key, override FROM rate_limiter_state WHERE key = %(key)s FOR UPDATE) old
 WHERE s.key = old.key AND old.override IS NOT NULL
RETURNING s.key, old.override
"""

_STATE = """
SELECT key, tokens, burst, rate_per_second, updated_at, daily_quota, quota_day, quota_used,
       blocked_until, granted_total, denied_total
  FROM rate_limiter_state WHERE key = %(key)s
"""


@dataclass(frozen=True)
class Limit:
    """A bucket refilled at ``per_minute`` up to ``burst`` tokens, plus an
    optional cap on tokens per UTC day."""

    per_minute: float
    burst: int = 1
    daily_quota: int | None = None

    def __post_init__(self) -> None:
        if self.per_minute <= 0:
            raise ValueError(f"rate must be positive, got {self.per_minute}/min")
        if self.burst < 1:
            raise ValueError(f"burst must be at least 1, got {self.burst}")
        if self.daily_quota is not None and self.daily_quota < 0:
            raise ValueError(f"daily quota must not be negative, got {self.daily_quota}")


@dataclass(frozen=True)
class Decision:
    granted: bool
    wait_seconds: float  # 0 when granted; else how long until a take can succeed
    reason: str  # ok | rate | quota | blocked
    tokens_left: float
    used_today: int


def take(conn: psycopg.Connection, key: str, limit: Limit, cost: int = 1) -> Decision:
    """Take ``cost`` tokens if the bucket, the quota and any block allow it."""
    if cost < 1 or cost > limit.burst:
        raise ValueError(f"cost {cost} must be between 1 and the burst ({limit.burst})")
    row = conn.execute(
        _TAKE,
        {"key": key, "cost": cost, "burst": float(limit.burst), "rate": limit.per_minute / 60.0,
         "quota": limit.daily_quota},
    ).fetchone()
    assert row is not None  # the function always returns one row
    return Decision(bool(row[0]), float(row[1]), row[2], float(row[3]), int(row[4]))


def acquire(
    connect: Callable[[], AbstractContextManager[psycopg.Connection]],
    key: str,
    limit: Limit,
    *,
    max_wait: float,
    cost: int = 1,
    sleep: Callable[[float], None] = time.sleep,
) -> Decision:
    """Take, sleeping through refusals that end within ``max_wait`` seconds.

    Returns the granted decision, or the refusal whose wait is too long (the
    caller should defer its work by ``wait_seconds``). ``connect`` is a context
    manager factory (e.g. ``pool.connection``) so no connection is held while
    sleeping.
    """
    deadline = time.monotonic() + max_wait
    while True:
        with connect() as conn:
            decision = take(conn, key, limit, cost)
        if decision.granted:
            return decision
        remaining = deadline - time.monotonic()
        if decision.wait_seconds > remaining:
            return decision
        sleep(decision.wait_seconds)


def block(conn: psycopg.Connection, key: str, seconds: float) -> None:
    """Refuse every take for ``key`` for ``seconds`` (upstream said 429 Retry-After)."""
    conn.execute(_BLOCK, {"key": key, "seconds": max(0.0, float(seconds))})


def state(conn: psycopg.Connection, key: str) -> dict[str, Any] | None:
    cur = conn.execute(_STATE, {"key": key})
    row = cur.fetchone()
    if row is None:
        return None
    return dict(zip([c.name for c in cur.description or ()], row, strict=True))


# Every bucket, with its tokens as of now (refilled since its last take, capped at burst).
_STATES = """
SELECT key, least(burst, tokens + rate_per_second * greatest(0, extract(epoch FROM now() - updated_at)))::float8
           AS tokens_now,
       burst, rate_per_second, daily_quota, quota_used, blocked_until, granted_total, denied_total
  FROM rate_limiter_state ORDER BY key
"""


def states(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """Every bucket as of now, for metrics and the API."""
    cur = conn.execute(_STATES)
    names = [c.name for c in cur.description or ()]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
