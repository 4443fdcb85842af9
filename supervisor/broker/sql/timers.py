"""Every statement on ``job_timers`` (migration 051): the delayed plain jobs and the delayed
retries of log jobs, each waiting for its run_at in one narrow row that is inserted once
and deleted once, by its promotion into ``job_log`` (the workers' claim, LOG_CLAIM_DUE), a
cancel, a flush or a write through the jobs view. A job waits in at most one of job_timers
and the log: the promotion moves it in one statement. (LOG_FINISH writes a retry's row:
joblog.py, with the outcome it continues.)
"""

from .history import archive
from .joblog import LOG_COLUMNS

# A producer's delayed plain jobs (the rows the log would take, logstore.log_row), due at
# the server's now() + delay_ms: one array per column. A message whose id a live job has
# (job_id_live: job_queue, the timers, the log's unfinished rows) is not written again; the
# primary key absorbs a repeat inside the batch's own statement.
_TIMER_INSERT = f"""
INSERT INTO job_timers ({LOG_COLUMNS}, run_at)
SELECT m.*, now() + %(delay_ms)s * interval '1 millisecond'
  FROM unnest(%(id)s::uuid[], %(queue)s::text[], %(actor)s::text[], %(args)s::jsonb[], %(kwargs)s::jsonb[],
              %(options)s::jsonb[], %(payload)s::bytea[], %(priority)s::int[], %(max_attempts)s::int[],
              %(max_lease_losses)s::int[], %(message_timestamp)s::bigint[])
    AS m({LOG_COLUMNS})
 WHERE NOT job_id_live(m.id)
"""
TIMER_INSERT = _TIMER_INSERT + "ON CONFLICT (id) DO NOTHING\n"
# Written again on a fresh connection (sending.py): the first write may have committed and
# its job been promoted (and even run) since, so a row of the log with the id means it went in.
TIMER_INSERT_AGAIN = _TIMER_INSERT + """
   AND NOT EXISTS (SELECT 1 FROM job_log l WHERE l.id = m.id)
ON CONFLICT (id) DO NOTHING
"""

# The workers' claim of the log (joblog.LOG_CLAIM's rows, then promoted and upto): the
# queue's due timers read from ``tfloor`` (NULL: all of them) moved into job_log, at most
# ``tlimit`` of them, then job_log_claim, in one statement (job_log_claim_due, 051). upto:
# how far the due index was read (the next floor, less the slack). A row with batch NULL:
# the claim took no row (it carries promoted and upto alone).
LOG_CLAIM_DUE = """
SELECT batch, seq, day::text, id::text, queue, actor, body, attempt, max_attempts, lease_losses, max_lease_losses,
       message_timestamp, payload, priority, created_at::text, promoted, upto
  FROM job_log_claim_due(%(queue)s, %(n)s, %(owner)s, %(lease_s)s, %(relaxed)s, %(tfloor)s, %(tlimit)s)
"""
PROMOTED_COLUMN = 15
UPTO_COLUMN = 16

# A job the due timer must wake for: each served queue's earliest future run_at, an arm of
# sql.NEXT_DUE (which takes the soonest of it and job_queue's). run_at > now() bounds the
# index read: the dead entries of the rows promoted lie behind it.
NEXT_DUE_TIMERS = """
        UNION ALL
        SELECT q.queue, t.run_at
          FROM unnest(%(queues)s::text[]) AS q(queue)
         CROSS JOIN LATERAL (
            SELECT t.run_at FROM job_timers t
             WHERE t.queue = q.queue AND t.run_at > now()
             ORDER BY t.run_at
             LIMIT 1) t"""

# An operator cancels a waiting timer: it goes into job_history 'cancelled' (as sql.CANCEL
# archives a pending job_queue row), with its event. A timer the promoter holds is skipped
# by it (SKIP LOCKED), so one of the two moves it; a job promoted first is LOG_CANCEL's.
TIMER_CANCEL = f"""
WITH done AS (
    DELETE FROM job_timers WHERE id = %(id)s::uuid
 RETURNING *
), kept AS (
    {archive("done", status="'cancelled'", finished_at="now()", lease_owner="NULL", claimed_at="NULL",
             heartbeat_at="NULL", lease_expires_at="NULL", dedupe_key="NULL", concurrency_key="NULL",
             result="NULL", progress="NULL", started_at="NULL", flow_key="NULL", flow="NULL")}
)
INSERT INTO job_events (job_id, who, from_status, to_status, reason)
SELECT id, %(who)s, status, 'cancelled', %(reason)s FROM done
RETURNING job_id
"""

# Broker.flush: the queue's waiting timers go, as sql.FLUSH_QUEUE drops job_queue's.
TIMER_FLUSH = "DELETE FROM job_timers WHERE queue = %(queue)s"
