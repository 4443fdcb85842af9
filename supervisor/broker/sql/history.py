"""Finished jobs: how a row leaves job_queue for job_history, and how history is kept
(days created ahead, whole days dropped). See sql/runtime/035_job_history.sql."""

# job_queue's and job_history's columns, in their (shared) order.
JOB_COLUMNS = (
    "id", "queue", "actor", "args", "kwargs", "options", "status", "priority", "run_at", "attempts",
    "max_attempts", "lease_owner", "claimed_at", "heartbeat_at", "lease_expires_at", "dedupe_key",
    "concurrency_key", "last_error", "result", "progress", "created_at", "started_at", "finished_at",
    "lease_losses", "max_lease_losses", "message_timestamp", "payload", "flow_key", "flow",
)


def archive(source: str, **overrides: str) -> str:
    """``INSERT INTO job_history`` of the rows of CTE ``source`` (rows of job_queue as a
    DELETE ... RETURNING gave them, plus any extra columns), with the columns named in
    ``overrides`` set to those expressions; ``status`` and ``finished_at`` must be among
    them (a finished row has both). Only our own constant text goes in, never input."""
    missing = {"status", "finished_at"} - overrides.keys()
    if missing or not overrides.keys() <= set(JOB_COLUMNS):
        raise ValueError(f"archive() needs status and finished_at, and only job columns: {sorted(overrides)}")
    values = ", ".join(overrides.get(c, f"{source}.{c}") for c in JOB_COLUMNS)
    return f"INSERT INTO job_history ({', '.join(JOB_COLUMNS)}) SELECT {values} FROM {source}"


# The upkeep keeps this many days of partitions ready ahead of today, for each status.
DAYS_AHEAD = 2

# Attaching a day locks the status's default partition for a moment: lock_timeout as below.
ADD_DAY = """
SELECT set_config('lock_timeout', '200ms', true), job_history_add_day(%(status)s, current_date + %(days)s::int)
"""

# Whole days of one status that ended before the cutoff go (rows: the planner's count).
# lock_timeout: a day a long reader holds is dropped at the next round, and nothing
# queues behind the drop's lock meanwhile. Local to this transaction (pooled connections).
DROP_DAYS = """
SELECT set_config('lock_timeout', '200ms', true),
       job_history_drop_before(%(status)s, now() - %(older_than_s)s * interval '1 second')
"""

# Rows older than the retention that no whole day covers: those of a status's default
# partition (they finished on a day that had no partition yet), and, for a retention
# shorter than a day, those of the day in progress. A bounded batch per call, with the
# events and progress reports of the jobs it removes.
PRUNE_ROWS = """
WITH old AS (
    SELECT id FROM job_history
     WHERE status = %(status)s AND finished_at < now() - %(older_than_s)s * interval '1 second'
       AND (%(older_than_s)s < 86400 OR tableoid = to_regclass('job_history_' || %(status)s || '_default'))
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED  -- pruners of several processes take different rows, never wait
), gone AS (
    DELETE FROM job_history h USING old
     WHERE h.status = %(status)s AND h.id = old.id
       AND h.finished_at < now() - %(older_than_s)s * interval '1 second'
    RETURNING h.id
), ev AS (
    DELETE FROM job_events e USING gone WHERE e.job_id = gone.id
), pr AS (
    DELETE FROM job_progress p USING gone WHERE p.job_id = gone.id
)
SELECT id FROM gone
"""
