"""Every SQL statement on ``scheduler_locks`` and ``job_runs``."""

# Acquired when a row comes back: the lease was free (expired or released) and
# nobody has fired this schedule for this cron time or a later one.
ACQUIRE = """
INSERT INTO scheduler_locks AS l (job_name, lock_holder, locked_at, expires_at, fire_at)
VALUES (%(name)s, %(holder)s, now(), now() + %(ttl_s)s * interval '1 second', %(fire_at)s)
ON CONFLICT (job_name) DO UPDATE
   SET lock_holder = EXCLUDED.lock_holder, locked_at = now(), expires_at = EXCLUDED.expires_at,
       fire_at = EXCLUDED.fire_at
 WHERE l.expires_at < now() AND (l.fire_at IS NULL OR l.fire_at < EXCLUDED.fire_at)
RETURNING job_name
"""

# Expire the lease now but keep fire_at (see 005_scheduler.sql).
RELEASE = """
UPDATE scheduler_locks SET expires_at = now()
 WHERE job_name = %(name)s AND lock_holder = %(holder)s AND fire_at = %(fire_at)s
"""

# Where a catch-up counts missed fires from: the last fire time any host took, else when
# the schedule became known (KNOW). Read with FOR UPDATE in the ACQUIRE's transaction, so
# it is the fire time that ACQUIRE replaces.
SINCE = "SELECT coalesce(fire_at, locked_at) FROM scheduler_locks WHERE job_name = %(name)s"
SINCE_LOCKED = SINCE + " FOR UPDATE"

# A schedule that catches up is known from its first start, before its first fire: a row
# with no fire time whose locked_at is when it became known (and whose lease never held),
# so fires missed between then and its first fire are caught up too.
KNOW = """
INSERT INTO scheduler_locks (job_name, lock_holder, locked_at, expires_at, fire_at)
VALUES (%(name)s, %(holder)s, %(now)s, '-infinity', NULL)
ON CONFLICT (job_name) DO NOTHING
"""

# One run per fire time this lease covers (the fire and, with catch_up: all, the missed
# ones before it); a fire time recorded already comes back with no row.
START_RUNS = """
INSERT INTO job_runs (job_name, scheduled_for, holder)
SELECT %(name)s, f, %(holder)s FROM unnest(%(fires)s::timestamptz[]) AS f
ON CONFLICT (job_name, scheduled_for) DO NOTHING
RETURNING id, scheduled_for
"""

# A run outside cron (`run now` from the dashboard).
START_RUN = """
INSERT INTO job_runs (job_name, scheduled_for, holder)
VALUES (%(name)s, %(fire_at)s, %(holder)s)
ON CONFLICT (job_name, scheduled_for) DO NOTHING
RETURNING id
"""

SET_RUN_JOB = "UPDATE job_runs SET job_id = %(job_id)s WHERE id = %(id)s"

COMPLETE_RUN = """
UPDATE job_runs SET status = %(status)s, completed_at = now(), error_text = %(error)s
 WHERE id = %(id)s AND status = 'running'
"""

# What the run's job reported (RunResults); keyed by the message's schedule options,
# so it lands even if the job finishes before SET_RUN_JOB commits.
SET_ROWS_AFFECTED = """
UPDATE job_runs SET rows_affected = %(rows)s
 WHERE job_name = %(name)s AND scheduled_for = %(fire_at)s::timestamptz
"""

# A run reports its job's outcome once the job is finished.
SYNC_FINISHED = """
UPDATE job_runs r
   SET status = CASE WHEN j.status = 'succeeded' THEN 'succeeded' ELSE 'failed' END,
       completed_at = coalesce(j.finished_at, now()),
       error_text = CASE WHEN j.status = 'succeeded' THEN NULL
                         ELSE coalesce(right(j.last_error, 2000), 'job ' || j.status) END
  FROM (SELECT id, status, finished_at, last_error FROM job_history
        UNION ALL  -- the job log's (storage "log"), found by its id index
        SELECT d.id, d.status, d.finished_at, d.last_error
          FROM job_runs x JOIN job_log l ON l.id = x.job_id JOIN job_done d ON d.seq = l.seq AND d.day = l.day
         WHERE x.status = 'running' AND d.status IN ('succeeded', 'failed', 'cancelled')) j
 WHERE r.status = 'running' AND r.job_id = j.id
"""

# (a log job exists while it waits in job_timers, or has a log row whose attempt has no
# outcome or a final one: a job deleted through the jobs view leaves rows whose attempts
# ended 'retried' and nothing after them)
SYNC_LOST = """
UPDATE job_runs r
   SET status = 'crashed', completed_at = now(), error_text = 'its job ' || r.job_id || ' no longer exists'
 WHERE r.status = 'running' AND r.job_id IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM job_queue j WHERE j.id = r.job_id)  -- each store by its id index
   AND NOT EXISTS (SELECT 1 FROM job_history j WHERE j.id = r.job_id)
   AND NOT EXISTS (SELECT 1 FROM job_timers j WHERE j.id = r.job_id)
   AND NOT EXISTS (SELECT 1 FROM job_log j WHERE j.id = r.job_id
                      AND NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = j.seq AND d.day = j.day
                                         AND d.status IN ('retried', 'requeued', 'released')))
"""

# At start: runs whose scheduler died between recording the run and enqueueing
# its job (older than the lock lease) crashed.
RECOVER_CRASHED = """
UPDATE job_runs
   SET status = 'crashed', completed_at = now(),
       error_text = 'the scheduler stopped before the job was enqueued'
 WHERE status = 'running' AND job_id IS NULL AND started_at < now() - %(stale_s)s * interval '1 second'
"""

# Retention (the upkeep's prune): finished runs older than `retention.runs`, a batch at a time.
PRUNE_RUNS = """
DELETE FROM job_runs WHERE id IN (
    SELECT id FROM job_runs
     WHERE started_at < now() - %(older_than_s)s * interval '1 second' AND status <> 'running'
     ORDER BY started_at LIMIT %(limit)s)
"""

HISTORY = """
SELECT id, job_name, scheduled_for, holder, started_at, completed_at, status, job_id, error_text
  FROM job_runs WHERE job_name = %(name)s ORDER BY started_at DESC LIMIT %(limit)s
"""

LATEST_RUNS = """
SELECT DISTINCT ON (job_name) id, job_name, scheduled_for, holder, started_at, completed_at, status, job_id,
       error_text, rows_affected
  FROM job_runs ORDER BY job_name, started_at DESC
"""

LOCKS = "SELECT job_name, lock_holder, locked_at, expires_at, fire_at FROM scheduler_locks"

# The newest runs of every schedule, up to per_schedule each.
RECENT_RUNS = """
SELECT id, job_name, scheduled_for, holder, started_at, completed_at, status, job_id, error_text
  FROM (SELECT r.*, row_number() OVER (PARTITION BY job_name ORDER BY started_at DESC) AS n FROM job_runs r) AS x
 WHERE n <= %(per_schedule)s
 ORDER BY job_name, started_at DESC
"""
