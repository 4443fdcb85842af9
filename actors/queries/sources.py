"""Every SQL statement on ``sources`` (including its circuit-breaker columns)."""

INSERT = """
INSERT INTO sources (name, search_url, format, rate_limit_per_minute, burst, daily_quota)
VALUES (%(name)s, %(search_url)s, %(format)s, %(rate_limit_per_minute)s, %(burst)s, %(daily_quota)s)
RETURNING id
"""

BREAKER_STATE = """
SELECT failure_streak, paused_until, now() FROM sources WHERE id = %(id)s
"""

# Half-open: the first caller after the pause moves paused_until on by the probe
# window; it alone tries the source, the others wait for its verdict.
TAKE_PROBE = """
UPDATE sources SET paused_until = now() + %(probe_s)s * interval '1 second'
 WHERE id = %(id)s AND paused_until IS NOT DISTINCT FROM %(seen)s
RETURNING paused_until
"""

RECORD_SUCCESS = """
UPDATE sources SET failure_streak = 0, paused_until = NULL, last_success_at = now()
 WHERE id = %(id)s
"""

# The streak counts consecutive failures; reaching the threshold (or failing a
# probe, since the streak is still over it) pauses the source for the cooldown.
RECORD_FAILURE = """
UPDATE sources
   SET failure_streak = failure_streak + 1,
       last_failure_at = now(),
       last_error = %(error)s,
       paused_until = CASE WHEN failure_streak + 1 >= %(threshold)s
                           THEN now() + %(cooldown_s)s * interval '1 second'
                           ELSE paused_until END
 WHERE id = %(id)s
RETURNING failure_streak, paused_until
"""

# --- the catalog (CLI and config sync) -------------------------------------------

SOURCE_COLUMNS = """
s.id, s.name, s.search_url, s.format, s.enabled, s.rate_limit_per_minute AS rate_per_minute, s.burst,
s.daily_quota, s.failure_streak, s.paused_until, s.last_success_at, s.last_failure_at, s.last_error,
s.created_at, (SELECT count(*) FROM watches w WHERE w.source_id = s.id) AS watches
"""

LIST = f"SELECT {SOURCE_COLUMNS} FROM sources s ORDER BY s.name"

BY_NAME = f"SELECT {SOURCE_COLUMNS} FROM sources s WHERE s.name = %(name)s"

NAMES = "SELECT name FROM sources ORDER BY name"

# Declared in the config: create, or update in place (health columns untouched).
UPSERT = """
INSERT INTO sources AS s (name, search_url, format, rate_limit_per_minute, burst, daily_quota, enabled)
VALUES (%(name)s, %(search_url)s, %(format)s, %(rate_limit_per_minute)s, %(burst)s, %(daily_quota)s,
        %(enabled)s)
ON CONFLICT (name) DO UPDATE
   SET search_url = EXCLUDED.search_url, format = EXCLUDED.format,
       rate_limit_per_minute = EXCLUDED.rate_limit_per_minute, burst = EXCLUDED.burst,
       daily_quota = EXCLUDED.daily_quota, enabled = EXCLUDED.enabled
 WHERE (s.search_url, s.format, s.rate_limit_per_minute, s.burst, s.daily_quota, s.enabled)
       IS DISTINCT FROM (EXCLUDED.search_url, EXCLUDED.format, EXCLUDED.rate_limit_per_minute, EXCLUDED.burst,
                         EXCLUDED.daily_quota, EXCLUDED.enabled)
RETURNING id, (xmax = 0) AS inserted
"""

SET_ENABLED = "UPDATE sources SET enabled = %(enabled)s WHERE name = %(name)s RETURNING id"

DELETE = "DELETE FROM sources WHERE name = %(name)s RETURNING id"

DELETE_UNDECLARED = "DELETE FROM sources WHERE NOT (name = ANY(%(names)s)) RETURNING name"

# The dashboard's breaker table: every source's streak and pause.
BREAKERS = """
SELECT name, enabled, failure_streak, paused_until, paused_until > now() AS paused_now,
       last_success_at, last_failure_at, left(last_error, 160) AS last_error
  FROM sources ORDER BY name
"""
