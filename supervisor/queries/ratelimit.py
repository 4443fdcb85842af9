"""Every SQL statement on ``rate_limiter_state``."""

# One statement: refill, check block/quota/tokens, take, and report (see 004_rate_limits.sql).
TAKE = """
SELECT granted, wait_seconds, reason, tokens_left, used_today
  FROM rate_limit_take(%(key)s, %(cost)s, %(burst)s, %(rate)s, %(quota)s)
"""

# A 429 from upstream: nobody takes from this key until the block ends, and the
# bucket restarts empty so the first requests after it do not arrive as a burst.
BLOCK = """
INSERT INTO rate_limiter_state AS s (key, tokens, burst, rate_per_second, updated_at, blocked_until)
VALUES (%(key)s, 0, 1, 1, clock_timestamp(), clock_timestamp() + %(seconds)s * interval '1 second')
ON CONFLICT (key) DO UPDATE
   SET blocked_until = greatest(coalesce(s.blocked_until, '-infinity'), EXCLUDED.blocked_until),
       tokens = 0,
       updated_at = greatest(s.updated_at, EXCLUDED.updated_at)
RETURNING blocked_until
"""

STATE = """
SELECT key, tokens, burst, rate_per_second, updated_at, daily_quota, quota_day, quota_used,
       blocked_until, granted_total, denied_total
  FROM rate_limiter_state WHERE key = %(key)s
"""
