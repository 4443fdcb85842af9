"""The reads of the Errors and Actors pages (and of their API routes, `supervisor
errors` and /metrics' start waits): failed attempts grouped, and figures per actor.

Each is bounded by its time window through an index: failed attempts by
``job_events_errors`` / ``job_events_error_groups`` (032), finished rows by
``job_history_finished`` on the window's days, running rows by ``jobs_running`` (through
``jobs_live``). A window holding more than ``%(cap)s`` rows is read newest first up to
the cap, and the caller says its figures cover only those (tests/test_table_health.py
and tests/test_dashboard_reads_bounded.py check the plans).
"""

from . import CAP_START, ERROR_LINE, WAIT_S

# One group: an equality on the three columns both error indexes lead with.
_GROUP = """e.error_type IS NOT NULL AND e.actor = {g}.actor AND e.error_type = {g}.error_type
       AND e.error_where = {g}.error_where"""

_IN_WINDOW = "at > now() - %(window_s)s * interval '1 second'"

# Failed attempts per group and time bucket, newest first up to the cap: what the
# counts, the first and last sightings in the window and the sparklines are made of.
# to_status: 'failed' (no attempt left), 'retryable' (an exception, tried again),
# 'pending' (a lost lease, tried again).
ERROR_BUCKETS = f"""
SELECT actor, error_type, error_where,
       date_bin(%(step_s)s * interval '1 second', at, timestamptz 'epoch') AS t,
       count(*) AS attempts,
       count(*) FILTER (WHERE to_status = 'failed') AS failed,
       min(at) AS first_at, max(at) AS last_at
  FROM (SELECT actor, error_type, error_where, to_status, at
          FROM job_events
         WHERE error_type IS NOT NULL AND {_IN_WINDOW}
           AND (%(actor)s::text IS NULL OR actor = %(actor)s)
         ORDER BY at DESC
         LIMIT %(cap)s) AS e
 GROUP BY 1, 2, 3, 4
"""

# Per group (arrays of the groups' keys, in order): its first sighting among the events
# kept (it may predate the window: a new error shows as new), and a sample: the newest
# attempt in the window whose traceback is still its job's last_error (no later
# exception overwrote it; of the newest 20, else none). A lost lease has no traceback
# of its own: its event's reason stands for it. The newest 20 need only what the
# group's own index holds (job_events_error_groups: an index-only scan), and the job is
# read once, for the one picked: with the job joined beside them, the planner costed the
# pick's LIMIT 1 as a tiny fraction of the join's rows and read the group's newest
# attempts from job_events_at, filtered: every attempt of the window for a rare group.
GROUP_DETAILS = f"""
SELECT g.i, f.first_seen, s.job_id, s.reason, s.traceback, s.last_error AS message
  FROM unnest(%(actors)s::text[], %(types)s::text[], %(wheres)s::text[])
       WITH ORDINALITY AS g(actor, error_type, error_where, i)
 CROSS JOIN LATERAL (SELECT min(e.at) AS first_seen FROM job_events e WHERE {_GROUP.format(g="g")}) AS f
  LEFT JOIN LATERAL (
    SELECT one.job_id, one.reason, one.last_error AS traceback, {ERROR_LINE.format(width=300)}
      FROM (SELECT pick.job_id, x.reason, CASE WHEN x.to_status <> 'pending' THEN j.last_error END AS last_error
              FROM (SELECT c.job_id, c.at
                      FROM (SELECT e.job_id, e.at FROM job_events e
                             WHERE {_GROUP.format(g="g")} AND e.{_IN_WINDOW}
                             ORDER BY e.at DESC LIMIT 20) AS c
                     WHERE NOT EXISTS (SELECT 1 FROM job_events l
                                        WHERE l.job_id = c.job_id AND l.at > c.at AND l.error_type IS NOT NULL
                                          AND l.to_status IN ('retryable', 'failed'))
                       -- the job is still kept: by each store's id index (through the jobs view the
                       -- planner read every job to make a hashed set of them)
                       AND (EXISTS (SELECT 1 FROM job_queue k WHERE k.id = c.job_id)
                            OR EXISTS (SELECT 1 FROM job_history k WHERE k.id = c.job_id)
                            OR EXISTS (SELECT 1 FROM job_log k WHERE k.id = c.job_id)
                            OR EXISTS (SELECT 1 FROM job_timers k WHERE k.id = c.job_id))
                     ORDER BY c.at DESC LIMIT 1) AS pick
             CROSS JOIN LATERAL (SELECT x.reason, x.to_status FROM job_events x
                                  WHERE x.job_id = pick.job_id AND x.at = pick.at AND x.error_type IS NOT NULL
                                  LIMIT 1) AS x
             -- its last_error, from the part of the jobs that holds it, by id (each part's id
             -- index): joined to the whole jobs view, the planner read every done row of the
             -- log for each group, the id a filter on each, not a condition of its index
             -- (a log job's retry waits in job_timers with its error)
             CROSS JOIN LATERAL (SELECT coalesce(
                 (SELECT k.last_error FROM jobs_queue_history k WHERE k.id = pick.job_id LIMIT 1),
                 (SELECT k.last_error FROM jobs_log_finished k WHERE k.id = pick.job_id LIMIT 1),
                 (SELECT k.last_error FROM job_timers k WHERE k.id = pick.job_id))
                 AS last_error) AS j) AS one) AS s ON true
 ORDER BY g.i
"""

# The jobs of one group an action changes: those in ``statuses`` whose latest failed
# attempt (in the window) is of this group: a job that failed again otherwise since
# belongs to that other group.
GROUP_JOBS = f"""
SELECT e.job_id::text
  FROM (SELECT %(actor)s::text AS actor, %(error_type)s::text AS error_type, %(error_where)s::text AS error_where) AS g
  JOIN job_events e ON {_GROUP.format(g="g")} AND e.{_IN_WINDOW}
  JOIN jobs j ON j.id = e.job_id AND j.status = ANY(%(statuses)s::text[])
 WHERE NOT EXISTS (SELECT 1 FROM job_events l WHERE l.job_id = e.job_id AND l.at > e.at AND l.error_type IS NOT NULL)
 ORDER BY e.at
 LIMIT %(limit)s
"""

# --- per actor ---------------------------------------------------------------------------

# One sort per column for its three percentiles (one ordered-set aggregate each sorts again).
_PCT = "percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY {col}) AS {col}_pct"

# Jobs finished in the window (newest first up to the cap), per actor: how many, failed,
# the time they ran (sum: the time spent), run time and start wait p50 / p95 / p99 in
# seconds (arrays of three). A job's run time and wait are its last attempt's (028); a cancelled row has
# neither. ``oldest``: the earliest finish read (the window's start unless capped).
ACTORS = f"""
SELECT actor,
       count(*) FILTER (WHERE status IN ('succeeded', 'failed')) AS finished,
       count(*) FILTER (WHERE status = 'failed') AS failed,
       count(*) AS rows_read,
       coalesce(sum(run), 0)::float8 AS busy_s,
       {_PCT.format(col="run")}, {_PCT.format(col="wait")},
       min(finished_at) AS oldest
  FROM (SELECT actor, status, finished_at,
               CASE WHEN status IN ('succeeded', 'failed') THEN date_part('epoch', finished_at - started_at)
                    END AS run,
               CASE WHEN status IN ('succeeded', 'failed') THEN {WAIT_S} END AS wait
          FROM jobs_finished
         WHERE finished_at > {CAP_START}
         ORDER BY finished_at DESC
         LIMIT %(cap)s) AS f
 GROUP BY actor
"""

# Failed attempts per actor in the window (newest first up to the cap): retries are
# those tried again (after an exception or a lost lease).
ACTOR_RETRIES = f"""
SELECT actor, count(*) FILTER (WHERE to_status <> 'failed') AS retries, count(*) AS failed_attempts,
       min(at) AS oldest
  FROM (SELECT actor, to_status, at FROM job_events
         WHERE error_type IS NOT NULL AND {_IN_WINDOW}
         ORDER BY at DESC LIMIT %(cap)s) AS e
 GROUP BY actor
"""

# Running jobs per actor (the running rows only, by their index).
IN_FLIGHT = "SELECT actor, count(*) AS in_flight FROM jobs_live WHERE status = 'running' GROUP BY actor"
