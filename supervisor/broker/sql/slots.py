"""The job log's keyed jobs (migrations 053, 054): their append, and the sweep of the
slots the hand-off could not give.

A job whose limit key carries a concurrency limit, a rate limit or a daily quota (no
weight; no dedupe key: jobkeys.py writes those) is appended to ``job_log`` with its key and
limits (``flow_key``, ``flow``). A rate's or quota's start is reserved by the claim that
first meets the row (``job_log_pace``, 054: now, or the row waits in ``job_timers`` for it). The claim (``job_log_claim``) gives each such row a slot of its own key
(``job_log_gate``: 046's ``job_concurrency`` rows, SKIP LOCKED) or parks it in
``job_blocked``; a job's end (its done row carrying the key: ``job_done_slot_end``) hands
its slot to the key's oldest parked job, which is appended to the log again holding it
(``job_slot_hand``), else frees it. Every such step reads the rows of one key only.
"""

from .joblog import LOG_COLUMNS

# A keyed row's columns as a producer writes them: the plain ones, then its key and limit.
LOG_KEYED_COLUMNS = LOG_COLUMNS + ", flow_key, flow"

_KEYED_ROWS = f"""unnest(%(id)s::uuid[], %(queue)s::text[], %(actor)s::text[], %(args)s::jsonb[], %(kwargs)s::jsonb[],
              %(options)s::jsonb[], %(payload)s::bytea[], %(priority)s::int[], %(max_attempts)s::int[],
              %(max_lease_losses)s::int[], %(message_timestamp)s::bigint[], %(flow_key)s::text[], %(flow)s::jsonb[])
    AS m({LOG_KEYED_COLUMNS})"""
# Keyed rows appended (one array per column), in the caller's transaction: as LOG_INSERT_ONE,
# a message whose id a live job has (job_id_live: job_queue, the timers, the log's rows with
# no outcome, a parked row among them) is not written again. Only batches with keyed rows
# send this: a plain row's statements (LOG_INSERT, LOG_COPY) are as before.
_LOG_INSERT_KEYED = f"""
INSERT INTO job_log ({LOG_KEYED_COLUMNS})
SELECT * FROM {_KEYED_ROWS}
 WHERE NOT job_id_live(m.id)
"""
LOG_INSERT_KEYED = _LOG_INSERT_KEYED
# Written again on a fresh connection (sending.py): any row of the log with the id means the
# first write went in (as LOG_INSERT_AGAIN).
_AGAIN = """
   AND NOT EXISTS (SELECT 1 FROM job_log l WHERE l.id = m.id)
"""
LOG_INSERT_KEYED_AGAIN = _LOG_INSERT_KEYED.rstrip() + _AGAIN
# Sent with a delay: they wait in job_timers with their key and limits (as timers.TIMER_INSERT),
# and the claim that promotes them gates them as any keyed row of the log.
_TIMER_INSERT_KEYED = f"""
INSERT INTO job_timers ({LOG_KEYED_COLUMNS}, run_at)
SELECT m.*, now() + %(delay_ms)s * interval '1 millisecond' FROM {_KEYED_ROWS}
 WHERE NOT job_id_live(m.id)"""
TIMER_INSERT_KEYED = _TIMER_INSERT_KEYED + "\nON CONFLICT (id) DO NOTHING\n"
TIMER_INSERT_KEYED_AGAIN = _TIMER_INSERT_KEYED + _AGAIN + "ON CONFLICT (id) DO NOTHING\n"

# The upkeep's sweep (every SWEEP_SECONDS, any worker; job_blocked_sweep): the free slots of
# keys with parked jobs, and those whose job is no longer live, handed to the key's oldest
# parked job (no floor), each slot locked SKIP LOCKED (a slot a claim or a job's end holds
# is theirs). It closes the one window the claim's locks leave open (a claim that met a slot
# row being freed, SKIP LOCKED, parked its row while that end found nothing parked yet).
# With nothing parked: one probe of an empty table. Returns how many jobs it handed a slot.
LOG_SWEEP_BLOCKED = "SELECT job_blocked_sweep()"
SWEEP_SECONDS = 1.0

# A queue's parked jobs (tests, the bench): how many wait for a slot of their key.
LOG_PARKED = """
SELECT count(*) FROM job_blocked b
 WHERE b.queue = %(queue)s AND NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = b.seq AND d.day = b.day)
"""

# A claimed log row whose writer did not know its actor (055: a send by actor name, an SQL
# insert through the jobs view; its row has no max_attempts) of an actor with limits, which
# the worker keys late (consuming/late_keys.py), in one statement: the attempt ends
# 'requeued' (the fence: a cancel or release that got there first wins; the claim not
# counted), and the job goes on as its producer would have written it had it known the
# actor, with the budget the worker's actor gives it (so it is not keyed again): a key whose
# limits the log takes (flow_log_takes: every one since 054, 056) appended to the log again
# with its key and limits (the next claim gates, paces or parks it), any other into
# job_queue 'waiting' (the keyed claim's).
# The event says why. Returns how many went on.
LOG_KEY_LATE = """
WITH k AS (
    SELECT * FROM unnest(%(seqs)s::bigint[], %(days)s::date[], %(batches)s::bigint[], %(keys)s::text[],
                         %(flows)s::jsonb[], %(concurrency_keys)s::text[], %(max_attempts)s::int[])
        AS k(seq, day, batch, flow_key, flow, concurrency_key, max_attempts)
), done AS (
    INSERT INTO job_done (seq, day, id, queue, actor, created_at, status, attempt, owner, claimed_at)
    SELECT l.seq, l.day, l.id, l.queue, l.actor, l.created_at, 'requeued', l.attempts + 1, %(owner)s,
           (SELECT x.claimed_at FROM job_lease x WHERE x.batch = k.batch)
      FROM k JOIN job_log l ON l.seq = k.seq AND l.day = k.day
    ON CONFLICT (seq, day) DO NOTHING
    RETURNING seq, day
), went AS (
    SELECT l.id, l.queue, l.actor, l.args, l.kwargs, l.options, l.payload, l.priority, l.attempts, k.max_attempts,
           l.lease_losses, l.max_lease_losses, l.message_timestamp, l.created_at, l.dedupe_key, k.flow_key, k.flow,
           k.concurrency_key, flow_log_takes(k.flow) AS logged
      FROM done JOIN k ON k.seq = done.seq AND k.day = done.day JOIN job_log l ON l.seq = done.seq AND l.day = done.day
), again AS (
    INSERT INTO job_log (id, queue, actor, args, kwargs, options, payload, priority, attempts, max_attempts,
                         lease_losses, max_lease_losses, message_timestamp, created_at, dedupe_key, flow_key, flow)
    SELECT id, queue, actor, args, kwargs, options, payload, priority, attempts, max_attempts, lease_losses,
           max_lease_losses, message_timestamp, created_at, dedupe_key, flow_key, flow
      FROM went WHERE logged
), queued AS (
    INSERT INTO job_queue (id, queue, actor, args, kwargs, options, payload, status, priority, run_at, attempts,
                           max_attempts, lease_losses, max_lease_losses, message_timestamp, created_at, dedupe_key,
                           flow_key, flow, concurrency_key)
    SELECT id, queue, actor, args, kwargs, options, payload, 'waiting', priority, now(), attempts, max_attempts,
           lease_losses, max_lease_losses, message_timestamp, created_at, dedupe_key, flow_key, flow, concurrency_key
      FROM went WHERE NOT logged
), ev AS (
    INSERT INTO job_events (job_id, who, from_status, to_status, reason)
    SELECT id, %(owner)s, 'running', CASE WHEN logged THEN 'pending' ELSE 'waiting' END,
           'keyed by its actor''s limits (its producer did not know them)'
      FROM went
)
SELECT count(*) FROM went
"""
