"""What happens to a running row: ack, failure, retry, requeue, heartbeat, lease loss,
cancel, and the retry of a failed row. Each is fenced by lease owner and attempt."""

# Acks arrive in batches (group commit). Each is fenced by owner and attempt number,
# so a late ack after a reclaim, or the ack that follows a retry, changes nothing.
# A job's latest unwritten progress report rides along (progress NULL: none).
ACK_MANY = """
UPDATE jobs j
   SET status = 'succeeded', finished_at = now(), lease_expires_at = NULL,
       progress = coalesce(a.progress, j.progress)
  FROM unnest(%(ids)s::uuid[], %(attempts)s::int[], %(progress)s::jsonb[]) AS a(id, attempts, progress)
 WHERE j.id = a.id AND j.attempts = a.attempts
   AND j.status = 'running' AND j.lease_owner = %(owner)s
"""

NACK = """
WITH done AS (
    UPDATE jobs
       SET status = 'failed', finished_at = now(), lease_expires_at = NULL, last_error = %(error)s
     WHERE id = %(id)s AND attempts = %(attempts)s AND status = 'running' AND lease_owner = %(owner)s
 RETURNING id
)
INSERT INTO job_events (job_id, who, from_status, to_status, reason)
SELECT id, %(owner)s, 'running', 'failed', %(reason)s FROM done
"""

# The Retries middleware re-enqueues the message it is processing: same row, new
# options, status 'retryable' until run_at. The wake-up names the queue when the
# retry is due now (consumers claim at once) and '@' || queue when it is due later
# (each process serving the queue moves its timer to it; see timer.py).
RETRY = """
WITH done AS (
    UPDATE jobs
       SET status = 'retryable', options = %(options)s, payload = %(payload)s, last_error = %(error)s,
           run_at = now() + %(delay_ms)s * interval '1 millisecond', lease_expires_at = NULL
     WHERE id = %(id)s AND attempts = %(attempts)s AND status = 'running' AND lease_owner = %(owner)s
 RETURNING id, queue, run_at <= now() AS due
), ev AS (
    INSERT INTO job_events (job_id, who, from_status, to_status, reason)
    SELECT id, %(owner)s, 'running', 'retryable', %(reason)s FROM done
)
SELECT pg_notify('actor_supervisor_jobs', CASE WHEN due THEN queue ELSE '@' || queue END) FROM done
"""

# Prefetched but never started (drain, or given back for want of a thread, see
# consumer.py): back to pending in its place in line (run_at kept), and the claim is
# not counted as an attempt because nothing ran.
REQUEUE = """
WITH done AS (
    UPDATE jobs j
       SET status = 'pending', attempts = j.attempts - 1, lease_owner = NULL,
           lease_expires_at = NULL
      FROM unnest(%(ids)s::uuid[], %(attempts)s::int[]) AS a(id, attempts)
     WHERE j.id = a.id AND j.attempts = a.attempts
       AND j.status = 'running' AND j.lease_owner = %(owner)s
 RETURNING j.id, j.queue
), ev AS (
    INSERT INTO job_events (job_id, who, from_status, to_status, reason)
    SELECT id, %(owner)s, 'running', 'pending', %(reason)s FROM done
)
SELECT count(*)
  FROM done CROSS JOIN LATERAL (SELECT pg_notify('actor_supervisor_jobs', done.queue)) AS wake
"""

# Renews only the rows the process knows it holds: a row whose claim committed
# but never reached the process (connection lost mid-claim) is left to expire
# and be reaped, instead of being kept alive for ever by a healthy heartbeat.
# The ids renewed come back: a held row missing from them was reclaimed or
# cancelled, and its process interrupts the job (self-fencing).
HEARTBEAT = """
UPDATE jobs
   SET heartbeat_at = now(), lease_expires_at = now() + %(lease_s)s * interval '1 second'
 WHERE id = ANY(%(ids)s::uuid[]) AND lease_owner = %(owner)s AND status = 'running'
RETURNING id::text
"""

# Lease lost (process or host died, froze, or stopped beating): the row goes back
# to pending, whatever its exception budget (max_retries counts exceptions only,
# as in Dramatiq). Each loss is counted; at max_lease_losses the job is a poison
# pill (it keeps killing or stalling its process) and ends failed. The event
# names the prior owner. Used with either an owner (supervisor saw the process
# die) or the expiry clock (a whole host died).
_LOSS_BUDGET = """coalesce(max_lease_losses, %(default_max_losses)s) AS budget,
           lease_losses + 1 >= coalesce(max_lease_losses, %(default_max_losses)s) AS poison"""

_RELEASE_BODY = """
, upd AS (
    UPDATE jobs j
       SET status = CASE WHEN lost.poison THEN 'failed' ELSE 'pending' END,
           lease_losses = j.lease_losses + 1,
           finished_at = CASE WHEN lost.poison THEN now() END,
           last_error = CASE WHEN lost.poison
                             THEN format('poison pill: lease lost %%s times while running (the job killed'
                                         ' or stalled its process; last owner %%s, %%s); budget'
                                         ' max_lease_losses=%%s used up, giving up',
                                         j.lease_losses + 1, lost.owner, %(why)s::text, lost.budget)
                             ELSE j.last_error END,
           lease_owner = NULL, lease_expires_at = NULL, run_at = now()
      FROM lost
     WHERE j.id = lost.id
 RETURNING j.id, j.queue, j.status, j.lease_losses, lost.budget, lost.owner
), ev AS (
    INSERT INTO job_events (job_id, who, from_status, to_status, reason)
    SELECT id, %(who)s::text, 'running', status,
           format('%%s; prior owner %%s; lease loss %%s of %%s', %(why)s, owner, lease_losses, budget)
      FROM upd
)
SELECT upd.id, upd.status, upd.owner
  FROM upd CROSS JOIN LATERAL (SELECT pg_notify('actor_supervisor_jobs', upd.queue)) AS wake
"""

RELEASE_OWNER = (
    """
WITH lost AS (
    SELECT id, lease_owner AS owner, """ + _LOSS_BUDGET + """ FROM jobs
     WHERE lease_owner = %(owner)s AND status = 'running'
       AND claimed_at IS NOT NULL  -- true of every running row; it lets jobs_running serve (027)
       FOR UPDATE SKIP LOCKED
)"""
    + _RELEASE_BODY
)

REAP_EXPIRED = (
    """
WITH lost AS (
    SELECT id, lease_owner AS owner, """ + _LOSS_BUDGET + """ FROM jobs
     WHERE status = 'running' AND lease_expires_at < now() - %(margin_s)s * interval '1 second'
       AND claimed_at IS NOT NULL  -- true of every running row; it lets jobs_running serve (027)
     ORDER BY lease_expires_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)"""
    + _RELEASE_BODY
)

# A running job is cancelled too: the row leaves 'running' at once (which frees its
# concurrency slot) and a trigger NOTIFYs its process, which interrupts the job.
CANCEL = """
WITH old AS (
    SELECT id, status FROM jobs
     WHERE id = %(id)s AND status IN ('pending', 'retryable', 'running')
       FOR UPDATE
), done AS (
    UPDATE jobs j SET status = 'cancelled', finished_at = now(), lease_expires_at = NULL
      FROM old
     WHERE j.id = old.id
 RETURNING j.id, old.status AS from_status
)
INSERT INTO job_events (job_id, who, from_status, to_status, reason)
SELECT id, %(who)s, from_status, 'cancelled', %(reason)s FROM done
RETURNING job_id
"""

# A row that cannot become a message fails alone, at once, fenced like a nack.
FAIL_UNREADABLE = """
WITH done AS (
    UPDATE jobs j
       SET status = 'failed', finished_at = now(), lease_expires_at = NULL, last_error = a.error
      FROM unnest(%(ids)s::uuid[], %(attempts)s::int[], %(errors)s::text[]) AS a(id, attempts, error)
     WHERE j.id = a.id AND j.attempts = a.attempts AND j.status = 'running' AND j.lease_owner = %(owner)s
 RETURNING j.id, a.error
)
INSERT INTO job_events (job_id, who, from_status, to_status, reason)
SELECT id, %(owner)s, 'running', 'failed', error FROM done
"""

RETRY_FAILED = """
WITH done AS (
    UPDATE jobs SET status = 'pending', run_at = now(), finished_at = NULL,
                    max_attempts = greatest(max_attempts, attempts - lease_losses + 1),
                    max_lease_losses = greatest(max_lease_losses, lease_losses + 1)
     WHERE id = %(id)s AND status IN ('failed', 'cancelled')
 RETURNING id, queue
), ev AS (
    INSERT INTO job_events (job_id, who, from_status, to_status, reason)
    SELECT id, %(who)s, NULL, 'pending', 'retried by operator' FROM done
)
SELECT id FROM done CROSS JOIN LATERAL (SELECT pg_notify('actor_supervisor_jobs', done.queue)) AS wake
"""
