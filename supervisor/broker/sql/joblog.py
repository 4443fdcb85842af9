"""Every statement on the job log (migration 039): ``job_log``, ``job_done``, ``job_lease``
and ``job_cursor``. The log holds ready work; nothing here updates or deletes a job's row.

An attempt's outcome is one ``job_done`` row whose primary key (seq, day) is the fence:
"finish this attempt if it is still mine" is an insert that does nothing on conflict, so
whichever of an ack, a release by the reaper or a cancel comes first writes the outcome
and the others write nothing (they learn so from RETURNING). An outcome that goes on as
another attempt writes that attempt in the same statement, and only for the rows whose
done row went in: a retry with a delay becomes a ``job_queue`` row (retryable, at its
run_at), a requeue or a release is appended to the log again.
"""

# The log's columns a producer writes: the rest are defaults (seq, day, tx, created_at).
LOG_COLUMNS = ("id", "queue", "actor", "args", "kwargs", "options", "payload", "priority", "max_attempts",
               "message_timestamp")

# Enqueue: one row per message, inside the caller's transaction when it has one (the
# claim's windows follow transactions, so a producer's long transaction costs no claim
# anything and its rows are claimed once it commits). Parameters: one array per column.
LOG_INSERT = """
INSERT INTO job_log (id, queue, actor, args, kwargs, options, payload, priority, max_attempts, message_timestamp)
SELECT * FROM unnest(%(id)s::uuid[], %(queue)s::text[], %(actor)s::text[], %(args)s::jsonb[], %(kwargs)s::jsonb[],
                     %(options)s::jsonb[], %(payload)s::bytea[], %(priority)s::int[], %(max_attempts)s::int[],
                     %(message_timestamp)s::bigint[])
"""

# Up to n ready rows of a queue for an owner, as one leased batch (job_log_claim, 039).
# Columns: batch, seq, day, id, queue, actor, body (args, kwargs, options as one JSON
# array), attempt (this one), max_attempts, lease_losses, max_lease_losses,
# message_timestamp, payload, priority, created_at.
LOG_CLAIM = "SELECT * FROM job_log_claim(%(queue)s, %(n)s, %(owner)s, %(lease_s)s)"

# The one way an attempt of a log row ends: a batch of outcomes, any mix. Per row: seq,
# day, the job's id, status (succeeded, failed, cancelled, retried, requeued), the attempt, when it began
# running, its error and result, and for a retry its run_at. Leases whose every row has
# ended (the owner knows: ``ended``) go in the same statement. Returns the (seq, day) of
# the rows whose outcome this statement wrote; any other was ended before (released by
# the reaper, cancelled) and its outcome here counts for nothing.
LOG_FINISH = """
WITH f AS (
    SELECT * FROM unnest(%(seq)s::bigint[], %(day)s::date[], %(id)s::uuid[], %(status)s::text[], %(attempt)s::int[],
                         %(started_at)s::timestamptz[], %(error)s::text[], %(result)s::jsonb[],
                         %(run_at)s::timestamptz[])
        AS f(seq, day, id, status, attempt, started_at, error, result, run_at)
), done AS (
    INSERT INTO job_done (seq, day, id, status, attempt, owner, started_at, last_error, result)
    SELECT f.seq, f.day, f.id, f.status, f.attempt, %(owner)s, f.started_at, f.error, f.result FROM f
    ON CONFLICT (seq, day) DO NOTHING
    RETURNING seq, day, status
), retried AS (
    INSERT INTO job_queue (id, queue, actor, args, kwargs, options, payload, status, priority, run_at, attempts,
                           max_attempts, lease_losses, max_lease_losses, message_timestamp, created_at, last_error)
    SELECT l.id, l.queue, l.actor, l.args, l.kwargs, l.options, l.payload, 'retryable', l.priority,
           coalesce(f.run_at, now()), f.attempt, l.max_attempts, l.lease_losses, l.max_lease_losses,
           l.message_timestamp, l.created_at, f.error
      FROM done d JOIN f ON f.seq = d.seq AND f.day = d.day JOIN job_log l ON l.seq = d.seq AND l.day = d.day
     WHERE d.status = 'retried'
), requeued AS (
    -- given back unstarted: the attempt is not counted
    INSERT INTO job_log (id, queue, actor, args, kwargs, options, payload, priority, attempts, max_attempts,
                         lease_losses, max_lease_losses, message_timestamp, created_at)
    SELECT l.id, l.queue, l.actor, l.args, l.kwargs, l.options, l.payload, l.priority, f.attempt - 1,
           l.max_attempts, l.lease_losses, l.max_lease_losses, l.message_timestamp, l.created_at
      FROM done d JOIN f ON f.seq = d.seq AND f.day = d.day JOIN job_log l ON l.seq = d.seq AND l.day = d.day
     WHERE d.status = 'requeued'
), ended AS (
    DELETE FROM job_lease WHERE batch = ANY(%(ended)s::bigint[]) AND owner = %(owner)s
)
SELECT seq, day FROM done
"""

# The owner's beat: every lease it holds, one statement, whatever their number.
LOG_RENEW = """
UPDATE job_lease SET expires_at = now() + %(lease_s)s * interval '1 second' WHERE owner = %(owner)s
"""

# Release the leases that expired, or all of the given owners' (found dead: ``owners``,
# else an empty array): every row of theirs with no outcome yet is released (its done row
# 'released', written first, so an ack that comes later counts nothing) and appended to the
# log again with one lease loss more, or failed once its losses reach its budget
# (max_lease_losses, else ``max_losses``). Leases another release holds are skipped.
# Returns each released row's id and whether it failed.
LOG_RELEASE = """
WITH lease AS (
    DELETE FROM job_lease WHERE batch IN (
        SELECT batch FROM job_lease
         WHERE expires_at < now() OR owner = ANY(%(owners)s::text[])
         ORDER BY batch LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
    RETURNING owner, seqs, days
), rows AS (
    SELECT lease.owner, u.seq, u.day FROM lease, unnest(lease.seqs, lease.days) AS u(seq, day)
), released AS (
    INSERT INTO job_done (seq, day, id, status, attempt, owner, last_error)
    SELECT l.seq, l.day, l.id,
           CASE WHEN l.lease_losses + 1 >= coalesce(l.max_lease_losses, %(max_losses)s) THEN 'failed' ELSE 'released' END,
           l.attempts + 1, r.owner, 'lease lost: its owner stopped renewing it'
      FROM rows r JOIN job_log l ON l.seq = r.seq AND l.day = r.day
    ON CONFLICT (seq, day) DO NOTHING
    RETURNING seq, day, id, status
), again AS (
    INSERT INTO job_log (id, queue, actor, args, kwargs, options, payload, priority, attempts, max_attempts,
                         lease_losses, max_lease_losses, message_timestamp, created_at)
    SELECT l.id, l.queue, l.actor, l.args, l.kwargs, l.options, l.payload, l.priority, l.attempts + 1,
           l.max_attempts, l.lease_losses + 1, l.max_lease_losses, l.message_timestamp, l.created_at
      FROM released r JOIN job_log l ON l.seq = r.seq AND l.day = r.day
     WHERE r.status = 'released'
)
SELECT id::text, status = 'failed' FROM released
"""

# Cancel a job of the log that has not ended: its newest attempt gets a 'cancelled' done
# row (a running one's ack then counts nothing, and the cancel channel interrupts it) and
# a job_log_cancel row, which the claims pass over. Returns the cancelled seqs.
LOG_CANCEL = """
WITH done AS (
    INSERT INTO job_done (seq, day, id, status, attempt, owner, last_error)
    SELECT l.seq, l.day, l.id, 'cancelled', l.attempts + 1, NULL, %(reason)s
      FROM job_log l
     WHERE l.id = %(id)s::uuid
       AND NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = l.seq AND d.day = l.day)
    ON CONFLICT (seq, day) DO NOTHING
    RETURNING seq, day
), passed AS (
    INSERT INTO job_log_cancel (seq, day) SELECT seq, day FROM done
)
SELECT seq FROM done
"""

# Days of the log made ahead, and retention: job_log_drop_before (039) drops each day
# before the cutoff with its done rows, after appending its rows with no outcome to today.
LOG_ADD_DAY = "SELECT job_log_add_day(current_date + %(ahead)s)"
LOG_DROP_BEFORE = "SELECT job_log_drop_before(%(cutoff)s::date)"
