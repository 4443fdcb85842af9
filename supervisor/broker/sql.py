"""Every SQL statement on ``jobs``, ``job_concurrency``, ``job_events``,
``job_progress`` and ``queue_pauses``.

All statements take parameters; none is built from input. Live statuses are
'pending', 'retryable' and 'running'.
"""

import functools

# Columns a consumer needs to rebuild a Dramatiq message and fence its lease.
# args, kwargs and options travel as one JSON text: one json.loads per row on
# the client instead of three jsonb decodes (the claim's largest client cost).
_CLAIMED = """j.id::text, j.queue, j.actor, jsonb_build_array(j.args, j.kwargs, j.options)::text,
    j.attempts, j.max_attempts, j.concurrency_key, j.lease_losses,
    coalesce(j.message_timestamp, (extract(epoch FROM j.created_at) * 1000)::bigint), j.payload"""

INSERT = """
INSERT INTO jobs (id, queue, actor, args, kwargs, options, priority, run_at,
                  max_attempts, dedupe_key, concurrency_key, message_timestamp, payload)
VALUES (%(id)s, %(queue)s, %(actor)s, %(args)s, %(kwargs)s, %(options)s, %(priority)s,
        now() + %(delay_ms)s * interval '1 millisecond', %(max_attempts)s,
        %(dedupe_key)s, %(concurrency_key)s, %(message_timestamp)s, %(payload)s)
ON CONFLICT DO NOTHING
RETURNING id
"""

# The bulk path (bulk.py). Its rows carry these columns in this order; run_at,
# now() + the batch's delay, is the same for every row of a batch.
BULK_COLUMNS = """id, queue, actor, args, kwargs, options, payload, priority, max_attempts, dedupe_key,
    concurrency_key, message_timestamp"""

# A small batch, or one the COPY could not take: one statement, arrays in
# (one per column, in BULK_COLUMNS order, after the delay), ids of new rows out.
INSERT_MANY = f"""
INSERT INTO jobs ({BULK_COLUMNS}, run_at)
SELECT m.*, now() + %s * interval '1 millisecond'
  FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::jsonb[], %s::jsonb[], %s::jsonb[], %s::bytea[],
              %s::int[], %s::int[], %s::text[], %s::text[], %s::bigint[]) AS m
ON CONFLICT DO NOTHING
RETURNING id
"""

# A large batch streams its rows in (text format), inside a savepoint: a unique
# violation rolls it back and the batch goes through INSERT_MANY instead. The
# statement-level NOTIFY trigger fires for COPY as for INSERT. run_at is left to
# its default, now(), unless the batch is delayed: then every row carries RUN_AT,
# read once in the same transaction (so it is the same now()).
COPY_JOBS = f"COPY jobs ({BULK_COLUMNS}) FROM STDIN"
COPY_JOBS_AT = f"COPY jobs ({BULK_COLUMNS}, run_at) FROM STDIN"
RUN_AT = "SELECT now() + %s * interval '1 millisecond'"

LIVE_BY_DEDUPE_KEYS = """
SELECT dedupe_key, id FROM jobs
 WHERE dedupe_key = ANY(%(keys)s) AND status IN ('pending', 'retryable', 'running')
"""

_ABOVE_ANY_PRIORITY = 2**31  # jobs.priority is an integer

# Claim up to n runnable rows of one queue in priority order, none while the queue
# is paused. Rows locked by another claimer are skipped, never waited on. A row with a concurrency key runs only if
# its key's slot in job_concurrency is free and this claim wins the INSERT.
# The UPDATE finds the locked rows by ctid (a TID scan), not by joining on id: whatever
# the planner believes of the table's size, it cannot turn the claim into a scan of the
# whole table (with reltuples = 0 it joined on id by walking the primary key: 0.3 ->
# 120 ms a claim at 20,000 rows; see JOBS_STATS_STALE). The ctid is that of the version
# this statement locked, which nobody else can change before it commits; a row updated
# and committed by another transaction between this statement's snapshot and its lock
# is locked but not visible to the UPDATE: it stays pending for the next claim.
CLAIM = f"""
WITH RECURSIVE levels AS (
    -- The queue's priority levels, highest first, one index descent each (a loose index
    -- scan, as NEXT_DUE). Each level's rows are then read from run_at's lower end: rows
    -- due later at a higher priority are never walked (one scan in (priority, run_at)
    -- order walked them all: 100,000 delayed rows made every claim 6x slower). The seed
    -- is one above any priority, so a single lookup serves every level: it plans faster,
    -- which a pooled connection (no prepared statements) pays on every claim.
    SELECT {_ABOVE_ANY_PRIORITY}::bigint AS p
    UNION ALL
    SELECT (SELECT max(priority) FROM jobs
             WHERE queue = %(queue)s AND status IN ('pending', 'retryable') AND priority < l.p)
      FROM levels l WHERE l.p IS NOT NULL
), cand AS (
    -- No ORDER BY here: levels come out highest first, each level's rows in (run_at, id)
    -- order, and a LATERAL runs as a nested loop that keeps that order. So LIMIT takes the
    -- first n rows in claim order and stops pulling: a level is read (and its rows locked)
    -- only while the claim still needs rows. A sort would lock up to n rows per level.
    SELECT x.* FROM levels l CROSS JOIN LATERAL (
    SELECT j.ctid AS tid, j.id, j.actor, j.concurrency_key, j.priority, j.run_at
      FROM jobs j
     WHERE j.queue = %(queue)s
       AND j.priority = l.p
       AND j.status IN ('pending', 'retryable')
       AND j.run_at <= now()
       AND NOT EXISTS (SELECT 1 FROM queue_pauses p WHERE p.queue = %(queue)s)
       AND (j.concurrency_key IS NULL
            OR NOT EXISTS (SELECT 1 FROM job_concurrency c WHERE c.key = j.concurrency_key))
       -- relaxed (an idle claim): this transaction's commit does not wait for its WAL flush,
       -- a third of the enqueue-to-start latency. A claim lost in a server crash only puts
       -- the row back to pending (a rerun, which the attempt fence handles). Claims under
       -- load stay synchronous: unflushed commits delay the hint bits that let later claims
       -- skip dead index entries. Set here, once (an InitPlan), for this transaction only:
       -- one round trip, and nothing outlives it on a pooled (PgBouncer) connection.
       AND (SELECT CASE WHEN %(relaxed)s THEN set_config('synchronous_commit', 'off', true)
                        ELSE 'on' END) IS NOT NULL
     ORDER BY j.run_at, j.id
     LIMIT %(n)s
       FOR UPDATE SKIP LOCKED) x
     WHERE l.p < {_ABOVE_ANY_PRIORITY}
     LIMIT %(n)s
), keyed AS (
    SELECT DISTINCT ON (concurrency_key) id, concurrency_key
      FROM cand WHERE concurrency_key IS NOT NULL
     ORDER BY concurrency_key, priority DESC, run_at, id
), slots AS (
    -- sorted so two claimers never take the same keys in opposite orders (no deadlock)
    INSERT INTO job_concurrency (key, job_id)
    SELECT concurrency_key, id FROM keyed ORDER BY concurrency_key
    ON CONFLICT DO NOTHING
    RETURNING job_id
), budget AS (
    -- the budgets of the actors this process knows, for rows that carry none
    SELECT * FROM unnest(%(actors)s::text[], %(actor_max_attempts)s::int[], %(actor_max_losses)s::int[])
        AS b(actor, max_attempts, max_lease_losses)
), claimed AS (
UPDATE jobs j
   SET status = 'running',
       attempts = j.attempts + 1,
       max_attempts = coalesce(j.max_attempts, jobs_option_int(j.options, 'max_attempts', 1, 1e6),
                               jobs_option_int(j.options, 'max_retries', 0, 1e6) + 1,
                               (SELECT b.max_attempts FROM budget b WHERE b.actor = j.actor),
                               %(default_max_attempts)s),
       max_lease_losses = coalesce(j.max_lease_losses, jobs_option_int(j.options, 'max_lease_losses', 1, 1e6),
                                   (SELECT b.max_lease_losses FROM budget b WHERE b.actor = j.actor),
                                   %(default_max_losses)s),
       lease_owner = %(owner)s,
       claimed_at = now(),
       heartbeat_at = now(),
       lease_expires_at = now() + %(lease_s)s * interval '1 second',
       started_at = coalesce(j.started_at, now())
 WHERE j.ctid = ANY(ARRAY(SELECT tid FROM cand
                           WHERE concurrency_key IS NULL OR id IN (SELECT job_id FROM slots)))
RETURNING j.*
)
-- a TID scan returns rows in ctid order: hand them out in claim order again
SELECT {_CLAIMED} FROM claimed j ORDER BY j.priority DESC, j.run_at, j.id
"""


@functools.lru_cache(maxsize=512)
def claim(n: int) -> str:
    """CLAIM for up to ``n`` rows, with ``n`` written into the text; the rest stays
    parameters. With ``LIMIT $n`` the server prices a generic plan at a tenth of the
    table, so it plans every claim afresh (0.3-0.7 ms, a third of the claim's server
    time). With the number in the text, each claim size keeps one generic plan once
    psycopg has prepared it (at its 5th run): the drain floor rises from 13,600 to 16,600
    rows/s at claims of 32 (bench/README.md). Only an int goes in, never input text."""
    if type(n) is not int or n < 1:
        raise ValueError(f"a claim takes a positive number of rows, not {n!r}")
    return CLAIM.replace("%(n)s", str(n))

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

# Seconds until the earliest future run_at of each of a process's queues (its
# wake-up timer). One index descent per priority level present in the queue
# (a loose index scan over jobs_claim), so a deep backlog costs nothing extra.
NEXT_DUE = """
WITH RECURSIVE levels AS (
    SELECT q.queue, (SELECT max(j.priority) FROM jobs j
                      WHERE j.queue = q.queue AND j.status IN ('pending', 'retryable')) AS priority
      FROM unnest(%(queues)s::text[]) AS q(queue)
    UNION ALL
    SELECT l.queue, (SELECT max(j.priority) FROM jobs j
                      WHERE j.queue = l.queue AND j.status IN ('pending', 'retryable') AND j.priority < l.priority)
      FROM levels l
     WHERE l.priority IS NOT NULL
)
SELECT l.queue, extract(epoch FROM min(d.run_at) - now())::float8
  FROM levels l
 CROSS JOIN LATERAL (
    SELECT j.run_at FROM jobs j
     WHERE j.queue = l.queue AND j.status IN ('pending', 'retryable') AND j.priority = l.priority
       AND j.run_at > now()
     ORDER BY j.run_at
     LIMIT 1) d
 GROUP BY l.queue
"""

# Prefetched but never started (drain): back to pending, and the claim is not
# counted as an attempt because nothing ran.
REQUEUE = """
WITH done AS (
    UPDATE jobs j
       SET status = 'pending', attempts = j.attempts - 1, lease_owner = NULL,
           lease_expires_at = NULL, run_at = now()
      FROM unnest(%(ids)s::uuid[], %(attempts)s::int[]) AS a(id, attempts)
     WHERE j.id = a.id AND j.attempts = a.attempts
       AND j.status = 'running' AND j.lease_owner = %(owner)s
 RETURNING j.id, j.queue
), ev AS (
    INSERT INTO job_events (job_id, who, from_status, to_status, reason)
    SELECT id, %(owner)s, 'running', 'pending', 'requeued unstarted on drain' FROM done
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

# Progress: each job's latest report since the process's last write, one history
# row each; jobs.progress too for running jobs (fenced by attempt and status, so a
# report of an attempt that lost its lease never overwrites the current one); an
# acked job's ack already set it (``running`` false: its history row only).
WRITE_PROGRESS = """
WITH r AS (
    SELECT id, attempts, to_timestamp(at) AS at, percent, message, running
      FROM unnest(%(ids)s::uuid[], %(attempts)s::int[], %(at)s::float8[], %(percents)s::real[],
                  %(messages)s::text[], %(running)s::bool[]) AS r(id, attempts, at, percent, message, running)
), ev AS (
    INSERT INTO job_progress (job_id, at, percent, message) SELECT id, at, percent, message FROM r
)
UPDATE jobs j SET progress = jsonb_build_object('percent', r.percent, 'message', r.message, 'at', r.at)
  FROM r WHERE r.running AND j.id = r.id AND j.attempts = r.attempts AND j.status = 'running'
"""

PROGRESS = "SELECT at, percent, message FROM job_progress WHERE job_id = %(id)s ORDER BY at, id"

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

# Broker.flush / Broker.join (Dramatiq's test and admin helpers).
FLUSH_QUEUE = "DELETE FROM jobs WHERE queue = %(queue)s AND status IN ('pending', 'retryable')"

LIVE_IN_QUEUE = """
SELECT count(*) FROM jobs_live WHERE queue = %(queue)s
"""

# The earliest failure since a join's cut-off (Broker.join with fail_fast).
FAILED_SINCE = """
SELECT id, actor, last_error FROM jobs
 WHERE queue = %(queue)s AND status = 'failed' AND finished_at >= %(since)s
 ORDER BY finished_at
 LIMIT 1
"""

NOW = "SELECT clock_timestamp()"

# Broker.dead_letters: the stub broker's view of failed jobs (since a cut-off).
DEAD_LETTERS = f"""
SELECT {_CLAIMED}
  FROM jobs j
 WHERE j.queue = ANY(%(queues)s) AND j.status = 'failed' AND j.finished_at >= %(since)s
 ORDER BY j.finished_at, j.id
"""
