"""Retention and the upkeep of the jobs table: prune, vacuum, analyze."""

# Retention: delete a bounded batch of old finished rows of one status per call
# (with their events and progress), so no statement holds locks for long. The batch
# is read oldest first through jobs_finished (its predicate is repeated so the planner
# may use it), never by a scan of the table; rows another process is pruning are
# skipped, so pruners never wait on each other.
PRUNE = """
WITH old AS (
    SELECT id FROM jobs
     WHERE status IN ('succeeded', 'failed', 'cancelled') AND status = %(status)s
       AND finished_at < now() - %(older_than_s)s * interval '1 second'
     ORDER BY finished_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM jobs j USING old WHERE j.id = old.id RETURNING j.id
), ev AS (
    DELETE FROM job_events e USING gone WHERE e.job_id = gone.id
), pr AS (
    DELETE FROM job_progress p USING gone WHERE p.job_id = gone.id
)
SELECT id FROM gone
"""

# Events and progress reports of jobs that are still kept, older than their own retention.
PRUNE_EVENTS = """
DELETE FROM job_events WHERE id IN (
    SELECT id FROM job_events WHERE at < now() - %(older_than_s)s * interval '1 second' ORDER BY at LIMIT %(limit)s)
"""

PRUNE_PROGRESS = """
DELETE FROM job_progress WHERE id IN (
    SELECT id FROM job_progress WHERE at < now() - %(older_than_s)s * interval '1 second' ORDER BY at LIMIT %(limit)s)
"""

# The upkeep's vacuum of jobs: due once enough dead tuples wait, no (auto)vacuum ran
# lately and none is running now. No advisory lock: a session lock taken and released
# by separate statements may land on two server connections behind PgBouncer and leak.
# The vacuum's own table lock (SKIP_LOCKED below) keeps it to one at a time.
JOBS_VACUUM_DUE = """
SELECT s.n_dead_tup
  FROM pg_stat_user_tables s
 WHERE s.relid = 'jobs'::regclass
   AND s.n_dead_tup >= %(dead_rows)s
   AND coalesce(greatest(s.last_vacuum, s.last_autovacuum), '-infinity') < now() - %(min_s)s * interval '1 second'
   AND NOT EXISTS (SELECT 1 FROM pg_stat_progress_vacuum v WHERE v.relid = s.relid)
"""

# The planner's row count of jobs (pg_class.reltuples, set by the last vacuum or analyze)
# far below the rows it holds now. A vacuum that ran while every row was dead or not yet
# committed (an empty queue, a bulk enqueue in flight) leaves reltuples = 0 over the pages
# that TRUNCATE false keeps; PostgreSQL then takes the table for empty however it grows and
# plans id lookups as scans of the whole table (measured at 20,000 rows: an ack batch
# 0.2 -> 7 ms). Autovacuum's analyze fixes it a minute later at best, or never where it is off.
JOBS_STATS_STALE = """
SELECT s.n_live_tup
  FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid
 WHERE c.oid = 'jobs'::regclass
   AND s.n_live_tup >= %(min_rows)s
   AND c.reltuples >= 0 AND c.reltuples < s.n_live_tup / 4
   AND NOT EXISTS (SELECT 1 FROM pg_stat_progress_analyze a WHERE a.relid = c.oid)
"""

# Samples the table (30,000 rows at the default statistics target); SKIP_LOCKED: never
# waits for a vacuum or another analyze, which take the same lock.
ANALYZE_JOBS = "ANALYZE (SKIP_LOCKED) jobs"

# SKIP_LOCKED: skipped while another vacuum (a worker's or autovacuum) holds the table,
# never waited on. No truncation:
# cutting empty pages off the end takes an ACCESS EXCLUSIVE lock, which would stall every
# claim. INDEX_CLEANUP ON: the claim index sheds its dead entries even when few heap
# pages have any (the default skips the indexes then). One process, no parallel workers.
VACUUM_JOBS = "VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON, TRUNCATE false, PARALLEL 0) jobs"
