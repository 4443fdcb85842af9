"""Progress reports, queue pauses, and the reads behind Dramatiq's join, flush and
dead letters."""

from .claiming import _CLAIMED

# Progress: every report since the process's last write, one history row each (with
# its event kind); jobs.progress from each job's latest (``latest``), for running jobs
# only (fenced by attempt and status, so a report of an attempt that lost its lease
# never overwrites the current one, and an acked job keeps what its ack set).
WRITE_PROGRESS = """
WITH r AS (
    SELECT id, attempts, to_timestamp(at) AS at, percent, message, event, latest
      FROM unnest(%(ids)s::uuid[], %(attempts)s::int[], %(at)s::float8[], %(percents)s::real[],
                  %(messages)s::text[], %(events)s::text[], %(latest)s::bool[])
           AS r(id, attempts, at, percent, message, event, latest)
), ev AS (
    INSERT INTO job_progress (job_id, at, percent, message, event) SELECT id, at, percent, message, event FROM r
), locked AS (
    -- in id order, as every statement that updates several job rows (see sql/outcomes.py)
    SELECT j.id, r.percent, r.message, r.at, r.event
      FROM job_queue j JOIN r ON j.id = r.id
     WHERE r.latest AND j.attempts = r.attempts AND j.status = 'running'
     ORDER BY j.id
       FOR NO KEY UPDATE OF j
)
UPDATE job_queue j SET progress = jsonb_build_object('percent', locked.percent, 'message', locked.message, 'at', locked.at)
                             || CASE WHEN locked.event IS NULL THEN '{}'::jsonb
                                     ELSE jsonb_build_object('event', locked.event) END
  FROM locked WHERE j.id = locked.id
"""

PROGRESS = "SELECT at, percent, message, event FROM job_progress WHERE job_id = %(id)s ORDER BY at, id"

# Queue pauses: every claim reads queue_pauses; resuming wakes the queue's consumers.
PAUSE_QUEUE = """
INSERT INTO queue_pauses (queue, paused_by, reason) VALUES (%(queue)s, %(who)s, %(reason)s)
ON CONFLICT (queue) DO NOTHING
RETURNING queue
"""

RESUME_QUEUE = """
WITH gone AS (DELETE FROM queue_pauses WHERE queue = %(queue)s RETURNING queue)
SELECT queue FROM gone CROSS JOIN LATERAL (SELECT pg_notify('actor_supervisor_jobs', gone.queue)) AS wake
"""

PAUSED_QUEUES = "SELECT queue, paused_at, paused_by, reason FROM queue_pauses ORDER BY queue"

# Broker.flush / Broker.join (Dramatiq's test and admin helpers). The rows go with no
# history, so no trigger sees them end: a pipeline group's member (pipe_fanin in its
# options) fails its fan-in here, and a workflow's step ends cancelled (its policy applies),
# as every other end does through migrations 048's and 049's triggers; other rows pay only
# those tests of their own options. Each call reads ``gone`` whole first: every row deleted.
FLUSH_QUEUE = """
WITH gone AS (
    DELETE FROM job_queue j
     USING (SELECT id FROM job_queue WHERE queue = %(queue)s AND status IN ('pending', 'retryable', 'waiting')
             ORDER BY id FOR UPDATE) AS f  -- in id order (see sql/outcomes.py)
     WHERE j.id = f.id
    RETURNING j.id, j.actor, j.options
)
SELECT (SELECT count(*) FROM gone
         CROSS JOIN LATERAL (SELECT pipeline_member_ended(gone.options->'pipe_fanin', gone.id, gone.actor,
                                                          'cancelled: its queue was flushed')
                              WHERE gone.options ? 'pipe_fanin') AS ended),
       (SELECT workflow_steps_gone(array_agg(gone.id), 'cancelled: its queue was flushed')::text
          FROM gone WHERE gone.options ? 'workflow')
"""

LIVE_IN_QUEUE = """
SELECT count(*) FROM jobs_live WHERE queue = %(queue)s
"""

# The earliest failure since a join's cut-off (Broker.join with fail_fast).
FAILED_SINCE = """
SELECT id, actor, last_error FROM job_history
 WHERE queue = %(queue)s AND status = 'failed' AND finished_at >= %(since)s
 ORDER BY finished_at
 LIMIT 1
"""

NOW = "SELECT clock_timestamp()"

# Broker.dead_letters: the stub broker's view of failed jobs (since a cut-off).
DEAD_LETTERS = f"""
SELECT {_CLAIMED}, j.finished_at
  FROM job_history j
 WHERE j.queue = ANY(%(queues)s) AND j.status = 'failed' AND j.finished_at >= %(since)s
 ORDER BY j.finished_at, j.id
"""
