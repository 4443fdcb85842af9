"""Retention and the upkeep of the live jobs table (job_queue): prune, vacuum, analyze."""

# Retention of finished jobs is history.DROP_DAYS (whole days) and history.PRUNE_ROWS.

# Events and progress reports of jobs that are still kept, older than their own retention.
PRUNE_EVENTS = """
DELETE FROM job_events WHERE id IN (
    SELECT id FROM job_events WHERE at < now() - %(older_than_s)s * interval '1 second' ORDER BY at LIMIT %(limit)s)
"""

PRUNE_PROGRESS = """
DELETE FROM job_progress WHERE id IN (
    SELECT id FROM job_progress WHERE at < now() - %(older_than_s)s * interval '1 second' ORDER BY at LIMIT %(limit)s)
"""

# Concurrency slots freed longer ago than this many seconds: their kept rows go (a key no
# longer used leaves nothing; migration 046). A scan of job_concurrency, a row per slot.
PRUNE_SLOTS = """
DELETE FROM job_concurrency WHERE job_id IS NULL AND freed_at < now() - %(older_than_s)s * interval '1 second'
"""

# The upkeep's vacuum of jobs: due once enough dead tuples wait, no (auto)vacuum ran
# lately and none is running now. No advisory lock: a session lock taken and released
# by separate statements may land on two server connections behind PgBouncer and leak.
# The vacuum's own table lock (SKIP_LOCKED below) keeps it to one at a time.
JOBS_VACUUM_DUE = """
SELECT s.n_dead_tup
  FROM pg_stat_user_tables s
 WHERE s.relid = 'job_queue'::regclass
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
 WHERE c.oid = 'job_queue'::regclass
   AND s.n_live_tup >= %(min_rows)s
   AND c.reltuples >= 0 AND c.reltuples < s.n_live_tup / 4
   AND NOT EXISTS (SELECT 1 FROM pg_stat_progress_analyze a WHERE a.relid = c.oid)
"""

# Samples the table (30,000 rows at the default statistics target); SKIP_LOCKED: never
# waits for a vacuum or another analyze, which take the same lock.
ANALYZE_JOBS = "ANALYZE (SKIP_LOCKED) job_queue"

# SKIP_LOCKED: skipped while another vacuum (a worker's or autovacuum) holds the table,
# never waited on. No truncation:
# cutting empty pages off the end takes an ACCESS EXCLUSIVE lock, which would stall every
# claim. INDEX_CLEANUP ON: the claim index sheds its dead entries even when few heap
# pages have any (the default skips the indexes then). One process, no parallel workers.
VACUUM_JOBS = "VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON, TRUNCATE false, PARALLEL 0) job_queue"
