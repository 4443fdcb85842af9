"""Every statement on the job log (migration 039): ``job_log``, ``job_done``, ``job_lease``
and ``job_cursor``. The log holds ready work; nothing here updates or deletes a job's row.

An attempt's outcome is one ``job_done`` row whose primary key (seq, day) is the fence:
"finish this attempt if it is still mine" is an insert that does nothing on conflict, so
whichever of an ack, a release by the reaper or a cancel comes first writes the outcome
and the others write nothing (they learn so from RETURNING). An outcome that goes on as
another attempt writes that attempt in the same statement, and only for the rows whose
done row went in: a retry with a delay becomes a ``job_timers`` row (retryable, at its
run_at: 051, promoted into the log when due), a requeue or a release is appended to the
log again.
"""

from .outcomes import GONE

# Enqueue: one row per message, inside the caller's transaction when it has one (the
# claim's windows follow transactions, so a producer's long transaction costs no claim
# anything and its rows are claimed once it commits). Parameters: one array per column.
# A message whose id a live job has (in job_queue or job_timers, or in the log of yesterday to tomorrow,
# UTC days, with no outcome: job_id_live, 041) is not written again, as job_queue's key absorbs
# it: a producer that sends one message twice runs it once.
# A log row's columns as a producer writes them (the rest are defaults: seq, day, tx, ...).
LOG_COLUMNS = "id, queue, actor, args, kwargs, options, payload, priority, max_attempts, max_lease_losses, message_timestamp"
_LOG_INSERT = f"""
INSERT INTO job_log ({LOG_COLUMNS})
SELECT * FROM unnest(%(id)s::uuid[], %(queue)s::text[], %(actor)s::text[], %(args)s::jsonb[], %(kwargs)s::jsonb[],
                     %(options)s::jsonb[], %(payload)s::bytea[], %(priority)s::int[], %(max_attempts)s::int[],
                     %(max_lease_losses)s::int[], %(message_timestamp)s::bigint[])
    AS m({LOG_COLUMNS})
"""
# Many messages: the check written out, as scalar subqueries (an index probe a row whatever
# the planner guesses of the tables, 2-3 us a row); planned at each call, which a batch pays
# once. One message: the check as job_id_live's plan, cached in the function (written out, the
# statement's planning over both tables' partitions cost 0.3-0.5 ms a send).
LOG_INSERT = _LOG_INSERT + """
 WHERE NOT (SELECT EXISTS (SELECT 1 FROM job_queue q WHERE q.id = m.id))
   AND NOT (SELECT EXISTS (SELECT 1 FROM job_timers t WHERE t.id = m.id))
   AND NOT (SELECT EXISTS (SELECT 1 FROM job_log l
                            WHERE l.id = m.id AND l.day BETWEEN job_log_today() - 1 AND job_log_today() + 1
                              AND NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = l.seq AND d.day = l.day)))
"""
LOG_INSERT_ONE = _LOG_INSERT + " WHERE NOT job_id_live(m.id)\n"

# LOG_INSERT written again on a fresh connection (sending.py): the first write may have
# committed before its connection died, and its jobs may even have run since: a row of
# the log with the id, whatever its outcome and day, means it went in.
LOG_INSERT_AGAIN = LOG_INSERT.rstrip() + """
   AND NOT EXISTS (SELECT 1 FROM job_log l WHERE l.id = m.id)
"""

# A large batch (bulk.COPY_MIN_ROWS rows or more) streams in with COPY, in one transaction
# with the check before it: the ids of the batch that a live job has (job_ids_live, 044:
# LOG_INSERT's check for the whole batch, an index scan per partition with every id, its
# plan cached by the session), which the COPY leaves out. Against LOG_INSERT's arrays, the
# server's CPU per job fell by a third and the client's by half (bench/README.md,
# bulk_vs_pgqueuer.py).
LOG_LIVE_IDS = "SELECT i::text FROM job_ids_live(%(ids)s::uuid[]) AS i"
# The same written again (LOG_INSERT_AGAIN's check): any row of the log with the id too.
LOG_SENT_IDS = LOG_LIVE_IDS + """
UNION ALL
SELECT l.id::text FROM job_log l WHERE l.id = ANY(%(ids)s::uuid[])
"""
LOG_COPY = f"COPY job_log ({LOG_COLUMNS}) FROM STDIN"

# Up to n ready rows of a queue for an owner, as one leased batch (job_log_claim, 039);
# ``relaxed``: an idle claim, committed without waiting for its WAL flush.
# Columns: batch, seq, day, id, queue, actor, body (args, kwargs, options as one JSON
# array), attempt (this one), max_attempts, lease_losses, max_lease_losses,
# message_timestamp, payload, priority, created_at. id, day and created_at as text: the
# worker uses the id as text and only sends day and created_at back (LOG_FINISH), and parsing
# then formatting them again cost it 1.5 us a job.
LOG_CLAIM = """
SELECT batch, seq, day::text, id::text, queue, actor, body, attempt, max_attempts, lease_losses, max_lease_losses,
       message_timestamp, payload, priority, created_at::text
  FROM job_log_claim(%(queue)s, %(n)s, %(owner)s, %(lease_s)s, %(relaxed)s)
"""

# The one way an attempt of a log row ends (sql.FINISH's counterpart, with its parameters
# plus each row's seq and day: completer.finish_params): a batch of outcomes, any mix.
#   succeeded, failed: the done row is all (a failure's traceback and its event, grouped on
#       the Errors page as sql.FINISH's are);
#   retry: done 'retried', and the job goes on in job_timers (051), 'retryable' (a keyed
#       one 'waiting', 054) at now() + delay_ms with the message's new options (its retry
#       count), and an event; the
#       claims promote it into the log once due (timers.LOG_CLAIM_DUE);
#   requeue (claimed, never started): done 'requeued', appended to the log again, the
#       attempt not counted; limited (RateLimited): the same, but through job_timers at
#       now() + delay_ms, pending (waiting with a limit key, which BLOCK_JOB_KEY blocks).
# started_us / ended_us: how long ago the attempt started and ended running in its thread
# (the server's now() sets the times); results: a stored result each (NULL: none; the jobs
# view's result, which job_queue's rows get from the results backend's store). Leases
# whose every row has an outcome written (``ended``: the owner knows) go in the same
# statement. Returns how many rows this statement wrote; any other was ended before
# (released by a reaper, cancelled) and its outcome here counts for nothing.
# LOG_FINISH_FIRST is the same without the ON CONFLICT: the owner's first try, as nearly
# every attempt's done row is its first (a speculative insertion cost the ack 2 us a row, an
# eighth of it); a unique violation means another writer ended one of these attempts first,
# and LOG_FINISH, tried next, lets the fence decide (completer.write_log_outcomes).
_LOG_OUTCOMES = """
WITH f AS (
    SELECT * FROM unnest(%(seqs)s::bigint[], %(days)s::date[], %(ids)s::uuid[], %(attempts)s::int[],
                         %(kinds)s::text[], %(progress)s::jsonb[], %(started_us)s::bigint[], %(ended_us)s::bigint[],
                         %(errors)s::text[], %(error_types)s::text[], %(error_wheres)s::text[], %(reasons)s::text[],
                         %(delays_ms)s::bigint[], %(options)s::jsonb[], %(payloads)s::bytea[], %(batches)s::bigint[],
                         %(queues)s::text[], %(actors)s::text[], %(created)s::timestamptz[], %(results)s::jsonb[])
        AS f(seq, day, id, attempt, kind, progress, started_us, ended_us, error, error_type, error_where, reason,
             delay_ms, options, payload, batch, queue, actor, created_at, result)
"""
# A batch of successes only (the ack batcher's, nearly every write): the outcomes' columns
# a success has, the rest constant, and none of the statements a job that goes on needs
# (their plan's start, and the INSERT triggers of job_queue and job_log that fire on an
# insert of no row, cost the write a tenth of its time).
_LOG_SUCCESSES = """
WITH f AS (
    SELECT f.*, 'succeeded'::text AS kind, NULL::text AS error
      FROM unnest(%(seqs)s::bigint[], %(days)s::date[], %(ids)s::uuid[], %(attempts)s::int[], %(progress)s::jsonb[],
                  %(started_us)s::bigint[], %(ended_us)s::bigint[], %(batches)s::bigint[], %(queues)s::text[],
                  %(actors)s::text[], %(created)s::timestamptz[], %(results)s::jsonb[])
        AS f(seq, day, id, attempt, progress, started_us, ended_us, batch, queue, actor, created_at, result)
"""
# The done rows (the fence), and the leases ended, which every write has.
_LOG_DONE = """), b AS (
    -- when each batch was claimed (the jobs' claimed_at) and its rows' keys, one lookup a batch
    SELECT x.batch, x.claimed_at, x.seqs, x.keys, x.slots FROM job_lease x WHERE x.batch = ANY(ARRAY(SELECT DISTINCT batch FROM f))
), done AS (
    INSERT INTO job_done (seq, day, id, queue, actor, created_at, status, attempt, owner, claimed_at, started_at,
                          finished_at, last_error, progress, result, flow_key, flow_slot)
    SELECT f.seq, f.day, f.id, f.queue, f.actor, f.created_at,
           CASE f.kind WHEN 'retry' THEN 'retried' WHEN 'requeue' THEN 'requeued' WHEN 'limited' THEN 'requeued'
                       ELSE f.kind END,
           f.attempt, %(owner)s, b.claimed_at, now() - f.started_us * interval '1 microsecond',
           now() - coalesce(f.ended_us, 0) * interval '1 microsecond', f.error, f.progress, f.result,
           -- a keyed job's key and slot row (053): its done row's trigger ends its hold of the slot
           CASE WHEN b.keys IS NOT NULL THEN b.keys[array_position(b.seqs, f.seq)] END,
           CASE WHEN b.keys IS NOT NULL THEN b.slots[array_position(b.seqs, f.seq)] END
      FROM f LEFT JOIN b ON b.batch = f.batch
    -- fence --
    RETURNING seq, day
"""
_LOG_ENDED = """), ended AS (
    DELETE FROM job_lease WHERE batch = ANY(%(ended)s::bigint[]) AND owner = %(owner)s
)
"""
_LOG_GOES_ON = """), went AS (
    -- the rows written whose job goes on, or that leave an event: their log row's body
    SELECT f.*, l.args, l.kwargs, l.options AS old_options, l.payload AS old_payload,
           l.priority, l.max_attempts, l.lease_losses, l.max_lease_losses, l.message_timestamp, l.dedupe_key,
           l.flow_key, l.flow
      FROM done d JOIN f ON f.seq = d.seq AND f.day = d.day JOIN job_log l ON l.seq = d.seq AND l.day = d.day
     WHERE f.kind <> 'succeeded'
), timed AS (
    -- a retry waits for its backoff in job_timers (051), which the claims promote into the
    -- log; a limited job waits there too, its attempt not counted. One with a limit key
    -- waits as 'waiting' (as job_queue's keyed rows do, 054): promoted, it is gated again and
    -- takes a new start and slot of its key (a limited one's key is blocked: BLOCK_JOB_KEY)
    INSERT INTO job_timers (id, queue, actor, args, kwargs, options, payload, status, priority, run_at, attempts,
                            max_attempts, lease_losses, max_lease_losses, message_timestamp, created_at, last_error, dedupe_key,
                            flow_key, flow)
    SELECT id, queue, actor, args, kwargs, coalesce(options, old_options), CASE kind WHEN 'retry' THEN payload ELSE old_payload END,
           CASE WHEN flow_key IS NOT NULL THEN 'waiting' WHEN kind = 'retry' THEN 'retryable' ELSE 'pending' END, priority,
           now() + coalesce(delay_ms, 0) * interval '1 millisecond',
           CASE kind WHEN 'retry' THEN attempt ELSE attempt - 1 END, max_attempts, lease_losses,
           max_lease_losses, message_timestamp, created_at, error, dedupe_key, flow_key, flow
      FROM went WHERE kind IN ('retry', 'limited')
), again AS (
    -- (a keyed one is gated again for a slot, its slot gone with its done row; it never
    -- started, so it keeps the start of its rate and quota it took: flow_paced, 054)
    INSERT INTO job_log (id, queue, actor, args, kwargs, options, payload, priority, attempts, max_attempts,
                         lease_losses, max_lease_losses, message_timestamp, created_at, dedupe_key, flow_key, flow,
                         flow_paced)
    SELECT id, queue, actor, args, kwargs, old_options, old_payload, priority, attempt - 1, max_attempts,
           lease_losses, max_lease_losses, message_timestamp, created_at, dedupe_key, flow_key, flow,
           CASE WHEN flow_key IS NOT NULL THEN true END
      FROM went WHERE kind = 'requeue'
), ev AS (
    INSERT INTO job_events (job_id, who, from_status, to_status, reason, actor, error_type, error_where)
    SELECT id, %(owner)s, 'running',
           CASE WHEN kind = 'failed' THEN 'failed' WHEN kind IN ('retry', 'limited') AND flow_key IS NOT NULL THEN 'waiting'
                WHEN kind = 'retry' THEN 'retryable' ELSE 'pending' END,
           reason, actor, error_type, error_where
      FROM went
), wake AS (
    SELECT pg_notify('actor_supervisor_jobs', CASE WHEN coalesce(delay_ms, 0) > 0 THEN '@' ELSE '' END || queue)
      FROM (SELECT DISTINCT queue, delay_ms FROM went WHERE kind IN ('retry', 'limited')) AS w
"""
_LOG_FINISH = (_LOG_OUTCOMES + _LOG_DONE + _LOG_GOES_ON + _LOG_ENDED
               + "SELECT (SELECT count(*) FROM done), (SELECT count(*) FROM wake)\n")
_LOG_ACK = _LOG_SUCCESSES + _LOG_DONE + _LOG_ENDED + "SELECT (SELECT count(*) FROM done), 0\n"
LOG_FINISH = _LOG_FINISH.replace("-- fence --", "ON CONFLICT (seq, day) DO NOTHING")
LOG_FINISH_FIRST = _LOG_FINISH.replace("-- fence --", "")
LOG_ACK = _LOG_ACK.replace("-- fence --", "ON CONFLICT (seq, day) DO NOTHING")
LOG_ACK_FIRST = _LOG_ACK.replace("-- fence --", "")

# The owner's beat: every lease it holds, one statement, whatever their number.
# Only the batches it knows it holds: a batch whose claim committed but never reached the
# process (its answer lost) expires and is released, never kept alive by a healthy beat
# (as sql.HEARTBEAT). Batches whose every outcome is written (``ended``) go with it.
# Returns the batches renewed: a held one missing was released (the reaper found it
# expired) and its jobs must stop.
LOG_RENEW = """
WITH ended AS (
    DELETE FROM job_lease WHERE batch = ANY(%(ended)s::bigint[]) AND owner = %(owner)s
)
UPDATE job_lease SET renewed_at = now(), expires_at = now() + %(lease_s)s * interval '1 second'
 WHERE batch = ANY(%(batches)s::bigint[]) AND owner = %(owner)s
RETURNING batch
"""

# Release batches whose owner can no longer finish them, any of: leases expired
# ``margin_s`` ago (NULL: none by expiry), the given ``owners`` (a process seen gone or
# stopping), processes found dead by their beat (``stale_beats``, NULL: none; the rule
# of sql.RELEASE_DEAD: beat stale, no session left, same server instance), the processes
# of a node forgotten (``node``, NULL: none). Every row of theirs with no outcome yet
# gets its done row first ('released'), so an ack that comes later counts nothing, and
# is appended to the log again with one lease loss more, or fails ('failed') once its
# losses reach its budget (max_lease_losses, else ``max_losses``; the done row keeps the
# count, this loss included: 043), with an event as
# sql.FINISH's releases write. Batches another release holds are skipped. Returns each
# released job's id, status and prior owner.
LOG_RELEASE = """
WITH gone AS MATERIALIZED (
    SELECT w.id FROM workers w WHERE %(stale_beats)s::float8 IS NOT NULL AND """ + GONE + """
), lease AS (
    DELETE FROM job_lease WHERE batch IN (
        SELECT batch FROM job_lease
         WHERE expires_at < now() - %(margin_s)s::float8 * interval '1 second'
            OR owner = ANY(%(owners)s::text[])
            OR owner IN (SELECT id FROM gone)
            OR left(owner, length(%(node)s::text) + 1) = %(node)s::text || ':'
         ORDER BY batch LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
    RETURNING owner, seqs, days, slots
), rows AS (
    SELECT lease.owner, u.seq, u.day, u.slot FROM lease, unnest(lease.seqs, lease.days, lease.slots) AS u(seq, day, slot)
), released AS (
    INSERT INTO job_done (seq, day, id, queue, actor, created_at, status, attempt, owner, lease_losses, last_error,
                          flow_key, flow_slot)
    SELECT l.seq, l.day, l.id, l.queue, l.actor, l.created_at,
           CASE WHEN l.lease_losses + 1 >= coalesce(l.max_lease_losses, %(max_losses)s) THEN 'failed' ELSE 'released' END,
           l.attempts + 1, r.owner, l.lease_losses + 1,
           CASE WHEN l.lease_losses + 1 >= coalesce(l.max_lease_losses, %(max_losses)s)
                THEN format('poison pill: lease lost %%s times while running (the job killed or stalled its process;'
                            ' last owner %%s, %%s); budget max_lease_losses=%%s used up, giving up',
                            l.lease_losses + 1, r.owner, %(why)s::text, coalesce(l.max_lease_losses, %(max_losses)s))
           END, l.flow_key, r.slot
      FROM rows r JOIN job_log l ON l.seq = r.seq AND l.day = r.day
    ON CONFLICT (seq, day) DO NOTHING
    RETURNING seq, day, id, status, owner, flow_slot AS slot
), went AS (
    SELECT r.status, r.owner, r.slot, l.* FROM released r JOIN job_log l ON l.seq = r.seq AND l.day = r.day
), again AS (
    -- (a keyed one keeps its slot: 'released' does not end its hold, 053)
    INSERT INTO job_log (id, queue, actor, args, kwargs, options, payload, priority, attempts, max_attempts,
                         lease_losses, max_lease_losses, message_timestamp, created_at, dedupe_key, flow_key, flow,
                         flow_held, flow_slot)
    SELECT id, queue, actor, args, kwargs, options, payload, priority, attempts + 1, max_attempts,
           lease_losses + 1, max_lease_losses, message_timestamp, created_at, dedupe_key, flow_key, flow,
           flow_key IS NOT NULL, slot
      FROM went WHERE status = 'released'
), ev AS (
    INSERT INTO job_events (job_id, who, from_status, to_status, reason, actor, error_type, error_where)
    SELECT id, %(who)s::text, 'running', CASE status WHEN 'failed' THEN 'failed' ELSE 'pending' END,
           format('%%s; prior owner %%s; lease loss %%s of %%s', %(why)s::text, owner, lease_losses + 1,
                  coalesce(max_lease_losses, %(max_losses)s)),
           actor, CASE WHEN status = 'failed' THEN 'PoisonPill' ELSE 'LeaseLost' END, ''
      FROM went
)
SELECT id::text, CASE status WHEN 'released' THEN 'pending' ELSE status END, owner FROM went
"""

# Cancel a job of the log that has not ended: its newest attempt gets a 'cancelled' done
# row (a running one's ack then counts nothing, and its process, told on the cancel
# channel, interrupts it, as sql.CANCEL's), a job_log_cancel row, which the claims pass
# over, and an event. Returns the cancelled job's id.
LOG_CANCEL = """
WITH done AS (
    INSERT INTO job_done (seq, day, id, queue, actor, created_at, status, attempt, owner, last_error, flow_key)
    SELECT l.seq, l.day, l.id, l.queue, l.actor, l.created_at, 'cancelled', l.attempts + 1, NULL, %(reason)s, l.flow_key
      FROM job_log l
     WHERE l.id = %(id)s::uuid
       AND NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = l.seq AND d.day = l.day)
    ON CONFLICT (seq, day) DO NOTHING
    RETURNING seq, day, id
), passed AS (
    INSERT INTO job_log_cancel (seq, day) SELECT seq, day FROM done
), was AS (
    SELECT done.id, EXISTS (SELECT 1 FROM job_lease x WHERE done.seq = ANY(x.seqs)) AS running,
           EXISTS (SELECT 1 FROM job_blocked b WHERE b.seq = done.seq AND b.day = done.day) AS parked
      FROM done
), told AS (
    SELECT pg_notify('actor_supervisor_cancel', id::text) FROM was WHERE running
)
INSERT INTO job_events (job_id, who, from_status, to_status, reason)
SELECT id, %(who)s, CASE WHEN running THEN 'running' WHEN parked THEN 'waiting' ELSE 'pending' END, 'cancelled',
       %(reason)s
  FROM was, (SELECT count(*) FROM told) AS t
RETURNING job_id
"""

# An operator retries a job that ended in the log (failed: its last attempt, or its lease
# losses used up; cancelled): as sql.RETRY_FAILED does for job_history, the job goes on,
# pending now, with room for one more attempt and one more lease loss: appended to the log
# again (as a release appends it), so it stays where a pinned horizon costs its claim
# nothing. Its done row becomes 'retried' (the outcome of an attempt whose job went on), so
# the jobs view shows the job once, live, and the day's drop neither archives it nor counts
# it failed; the row lock makes a second retry find nothing. Not while the same id runs
# again (a message sent again once it ended). Returns the retried job's id.
LOG_RETRY_FAILED = """
WITH done AS (
    UPDATE job_done d SET status = 'retried'
      FROM job_log l, job_done was  -- was: the row as it stood (RETURNING gives the new one)
     WHERE d.id = %(id)s::uuid AND d.status IN ('failed', 'cancelled') AND l.seq = d.seq AND l.day = d.day
       AND was.seq = d.seq AND was.day = d.day
       -- not while the id runs again (sent again once ended): the producers' own check
       AND NOT job_id_live(d.id)
       -- a key it had: taken again (052), unless another live job holds it now (then no retry)
       AND (l.dedupe_key IS NULL OR (SELECT t.job_id FROM job_keys_take(ARRAY[l.dedupe_key], ARRAY[d.id]) t) = d.id)
    RETURNING d.id, d.attempt, d.last_error, d.started_at, l.queue, l.actor, l.args, l.kwargs, l.options, l.payload,
              l.priority, l.max_attempts, coalesce(d.lease_losses, l.lease_losses) AS lease_losses, l.max_lease_losses,
              l.message_timestamp, l.created_at, was.status AS was, l.dedupe_key, l.flow_key, l.flow
), back AS (
    INSERT INTO job_log (id, queue, actor, args, kwargs, options, payload, priority, attempts, max_attempts,
                         lease_losses, max_lease_losses, message_timestamp, created_at, dedupe_key, flow_key, flow)
    SELECT id, queue, actor, args, kwargs, options, payload, priority, attempt,
           greatest(max_attempts, attempt - lease_losses + 1), lease_losses, greatest(max_lease_losses, lease_losses + 1),
           message_timestamp, created_at, dedupe_key, flow_key, flow
      FROM done
    RETURNING id
), ev AS (
    INSERT INTO job_events (job_id, who, from_status, to_status, reason)
    SELECT b.id, %(who)s, d.was, 'pending', 'retried by operator' FROM back b JOIN done d ON d.id = b.id
)
SELECT id FROM back
"""

# A job that passed through job_queue goes back into the log (057's job_queue_to_log): the
# job an operator retried from job_history (sql.RETRY_FAILED writes it into job_queue, as it
# stood), if it is live, not running, and its key is one the log takes. Returns whether it moved.
QUEUE_TO_LOG = "SELECT job_queue_to_log(%(id)s::uuid)"

# Days of the log made ahead (the upkeep, as history.ADD_DAY: attaching a day locks the
# default partitions for a moment), and retention: job_log_drop_before (039) drops each
# day that ended before the retention of succeeded jobs, with its done rows, after
# appending its rows with no outcome to today and archiving its failed and cancelled
# jobs into job_history (their own retention). Days are UTC dates (041). lock_timeout: a
# day a reader holds goes at the next round. Local to the transaction (pooled connections).
LOG_ADD_DAY = "SELECT set_config('lock_timeout', '200ms', true), job_log_add_day(job_log_today() + %(days)s::int)"
LOG_DROP_DAYS = """
SELECT set_config('lock_timeout', '200ms', true),
       job_log_drop_before(((now() - %(older_than_s)s * interval '1 second') AT TIME ZONE 'UTC')::date)
"""

# The last block range of every day of job_done summarized in its block range index
# (job_done_finished): VACUUM summarizes only whole ranges, and a range with no summary is
# read by every window of finish times, so each day's partial last range (up to 16 pages,
# ~800 rows) was read by every "finished since" read, once per day kept (6,000+ rows for a
# week). A summarized range is widened by later inserts, so summarizing it early is safe.
LOG_SUMMARIZE_DONE = """
SELECT count(brin_summarize_range(i.indexrelid::regclass,
                                  greatest(pg_relation_size(i.indrelid) / current_setting('block_size')::int - 1, 0)))
  FROM pg_inherits h
  JOIN pg_index i ON i.indrelid = h.inhrelid
  JOIN pg_class ic ON ic.oid = i.indexrelid
  JOIN pg_am am ON am.oid = ic.relam AND am.amname = 'brin'
 WHERE h.inhparent = 'job_done'::regclass
"""

# The cursor rows no claim reads any more: every one older than a minute that a newer row of
# its level follows, oldest first, a bounded batch per call (the upkeep's _batches).
LOG_PRUNE_CURSORS = """
DELETE FROM job_cursor c
 WHERE c.at = ANY(ARRAY(SELECT o.at FROM job_cursor o
                         WHERE o.made_at < now() - interval '1 minute'
                           AND EXISTS (SELECT 1 FROM job_cursor n
                                        WHERE n.queue = o.queue AND n.priority = o.priority AND n.at > o.at)
                         ORDER BY o.at LIMIT %(limit)s))
"""

# The narrow tables the log's path updates and deletes (a lease row a batch, a cursor row a
# claim, pruned, a timer row a delayed job, a key row taken over or pruned: jobkeys.py): vacuumed by the upkeep (worker/upkeep.py) once enough dead tuples wait and
# none ran lately, as job_queue is (a server may run no autovacuum). They stay a few pages.
# Analyzed with it: the jobs view's pending part is priced by its cursors' levels.
LOG_VACUUM_DUE = """
SELECT coalesce(sum(s.n_dead_tup), 0)::bigint FROM pg_stat_user_tables s
 WHERE s.relname IN ('job_lease', 'job_cursor', 'job_log_cancel', 'job_timers', 'job_keys', 'job_blocked',
                     'job_fair_floor')
HAVING sum(s.n_dead_tup) >= %(dead_rows)s
   AND max(coalesce(greatest(s.last_vacuum, s.last_autovacuum), '-infinity')) < now() - %(min_s)s * interval '1 second'
"""
VACUUM_LOG = ("VACUUM (ANALYZE, SKIP_LOCKED, TRUNCATE false, PARALLEL 0) job_lease, job_cursor, job_log_cancel, job_timers,"
              " job_keys, job_blocked, job_fair_floor")

# Broker.flush: the queue's log rows that no claim holds and have no outcome are
# cancelled (the claims pass them over, as a pending job an operator cancels).
LOG_FLUSH = """
WITH done AS (
    INSERT INTO job_done (seq, day, id, queue, actor, created_at, status, attempt, last_error, flow_key)
    SELECT l.seq, l.day, l.id, l.queue, l.actor, l.created_at, 'cancelled', l.attempts + 1, 'flushed', l.flow_key
      FROM job_log l
     WHERE l.queue = %(queue)s
       AND NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = l.seq AND d.day = l.day)
       AND NOT EXISTS (SELECT 1 FROM job_lease x WHERE l.seq = ANY(x.seqs))
    ON CONFLICT (seq, day) DO NOTHING
    RETURNING seq, day
)
INSERT INTO job_log_cancel (seq, day) SELECT seq, day FROM done
"""

# Broker.join's fail_fast and dead_letters: the log's failed attempts since a cut-off, as
# sql.FAILED_SINCE and sql.DEAD_LETTERS read job_history's (the same columns).
LOG_FAILED_SINCE = """
SELECT d.id, d.actor, d.last_error FROM job_done d
 WHERE d.queue = %(queue)s AND d.status = 'failed' AND d.finished_at >= %(since)s
 ORDER BY d.finished_at
 LIMIT 1
"""
LOG_DEAD_LETTERS = """
SELECT d.id::text, l.queue, l.actor, jsonb_build_array(l.args, l.kwargs, l.options)::text, d.attempt,
       coalesce(l.max_attempts, d.attempt), NULL::text, l.lease_losses,
       coalesce(l.message_timestamp, (extract(epoch FROM l.created_at) * 1000)::bigint), l.payload, l.priority,
       l.created_at, d.finished_at
  FROM job_done d JOIN job_log l ON l.seq = d.seq AND l.day = d.day
 WHERE d.queue = ANY(%(queues)s) AND d.status = 'failed' AND d.finished_at >= %(since)s
"""
