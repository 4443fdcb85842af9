"""What happens to a running row: ack, failure, retry, requeue, heartbeat, lease loss,
cancel, and the retry of a failed row. Each is fenced by lease owner and attempt.

Lock order: a statement that updates several job rows and may wait for one locks
them in id order first (``ORDER BY j.id FOR NO KEY UPDATE``: the rows are sorted,
or read in id order from the primary key, before each is locked), then updates the
rows it holds. An UPDATE alone locks rows in whatever order its plan reads them: a
heartbeat's bitmap of the primary key reads them in the table's order, an ack batch's
nested loop in the order of its array (the order the jobs finished); two such
statements of one process over the same rows each held a row the other waited for,
and PostgreSQL killed one of them (deadlock detected). ``FOR NO KEY UPDATE`` is the
lock the UPDATE itself takes, so taking it first changes nothing else. Statements that
skip locked rows (claim, reap, release, prune) never wait, so their order is free.
A statement that deletes rows (a job finishing leaves job_queue for job_history) locks
them ``FOR UPDATE``, the lock the DELETE takes, in the same id order.

Live rows are in job_queue; a finished row is deleted from it and appended to
job_history in the same statement (``history.archive``).
"""

from .compact import compact
from .history import JOB_COLUMNS, archive

# Every outcome its owner writes for an attempt goes through FINISH, one statement for a
# batch of any mix (River's completer): success, failure, retry (the Retries middleware's
# re-enqueue of the message it is processing), and requeue (claimed, never started: a
# drain, or given back for want of a thread). Each row is fenced by lease owner and
# attempt number, so a late write after a reclaim, or the ack that follows a retry,
# changes nothing; the fence and the outcome are one statement, so they cannot disagree.
#   succeeded, failed: the row leaves job_queue for job_history (archive()); a failure
#       writes its traceback and an event (its group on the Errors page, 032).
#   retry: the row stays, 'retryable' at now() + delay_ms, with the message's new options
#       (the retry count) and an event. The wake-up names the queue when the retry is due
#       now (consumers claim at once) and '@' || queue when later (timers move, timer.py).
#   requeue: back to 'pending' in its place in line (run_at kept), the claim not counted
#       as an attempt (nothing ran), an event; NOTIFY '!' || queue (floors.py).
#   limited: the actor raised RateLimited (supervisor/flow.py): as a requeue, the claim not
#       counted; NOTIFY '~queue seconds' so every process's timer wakes when the block ends
#       (the block itself: sql.BLOCK_JOB_KEY, in the same transaction, kept out of this
#       statement so an ack batch pays nothing for it). A job with no limit key is put
#       back for delay_ms instead ('@' || queue).
# A row with a limit key goes back to 'waiting' (retry, requeue, limited), not 'pending'
# or 'retryable': it waits for its key again (sql/flow.py); its wake-up is '+' || queue
# (the keyed part has no floors; broker/consuming/gates.py) or '@' || queue for a later retry.
# A job's latest unwritten progress report rides along with a success (progress NULL:
# none); started_us / ended_us say how long ago the attempt started and ended running in
# its thread, and the server sets started_at / finished_at from its own now() (no host's
# wall clock). Arrays given as NULL (an ack batch has no errors) read as NULLs: a
# multi-array unnest pads the shorter ones.

FINISH = compact("""
WITH o AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(attempts)s::int[], %(kinds)s::text[], %(progress)s::jsonb[],
                         %(started_us)s::bigint[], %(ended_us)s::bigint[], %(errors)s::text[],
                         %(error_types)s::text[], %(error_wheres)s::text[], %(reasons)s::text[],
                         %(delays_ms)s::bigint[], %(options)s::jsonb[], %(payloads)s::bytea[])
        AS o(id, attempts, kind, progress, started_us, ended_us, error, error_type, error_where, reason,
             delay_ms, options, payload)
), locked AS (
    -- each row looked up by its id (a nested loop over the batch, in id order: locks are
    -- taken in one order). The UPDATE and DELETE below find their rows by id = ANY of an
    -- array of the locked ids, which the planner cannot count: a primary-key lookup per row
    -- whatever the statistics. Joined on id alone, the planner chose a scan of the whole
    -- table once an ANALYZE under a pinned horizon counted its dead rows (ack batches of
    -- 0.3-1.7 s, claims stalled behind them for seconds: bench/pressure.py, second session
    -- of 2026-11-28); with id = ANY(ids), at 1,024 of 33,000 live rows it hashed a scan of
    -- the whole table (2.4 of a batch's 11.6 ms). Not by ctid, as the claim's UPDATE: a
    -- heartbeat that renewed a row after this statement's snapshot leaves its new version
    -- at another ctid, and the ack would miss it.
    SELECT o.*
      FROM (SELECT * FROM o ORDER BY o.id) o
     CROSS JOIN LATERAL (
        SELECT 1 FROM job_queue j
         WHERE j.id = o.id AND j.attempts = o.attempts AND j.status = 'running' AND j.lease_owner = %(owner)s
           FOR UPDATE) x
), stays AS (
    UPDATE job_queue j
       SET status = CASE WHEN j.flow_key IS NOT NULL THEN 'waiting' WHEN l.kind = 'retry' THEN 'retryable'
                         ELSE 'pending' END,
           attempts = CASE WHEN l.kind IN ('requeue', 'limited') THEN j.attempts - 1 ELSE j.attempts END,
           lease_owner = CASE WHEN l.kind IN ('requeue', 'limited') THEN NULL ELSE j.lease_owner END,
           options = coalesce(l.options, j.options), payload = CASE l.kind WHEN 'retry' THEN l.payload ELSE j.payload END,
           last_error = coalesce(l.error, j.last_error),
           started_at = CASE l.kind WHEN 'retry' THEN now() - l.started_us * interval '1 microsecond'
                                    ELSE j.started_at END,
           run_at = CASE WHEN l.kind = 'retry' OR (l.kind = 'limited' AND j.flow_key IS NULL)
                         THEN now() + l.delay_ms * interval '1 millisecond' ELSE j.run_at END,
           lease_expires_at = NULL
      FROM locked l
     WHERE j.id = ANY(ARRAY(SELECT id FROM locked WHERE kind IN ('retry', 'requeue', 'limited'))) AND j.id = l.id
 RETURNING j.id, j.queue, j.actor, j.status, j.run_at <= now() AS due, l.reason, l.error_type, l.error_where,
           l.kind, j.flow_key, l.delay_ms
), gone AS (
    DELETE FROM job_queue j WHERE j.id = ANY(ARRAY(SELECT id FROM locked WHERE kind IN ('succeeded', 'failed')))
 RETURNING j.*
), done AS (
    SELECT g.*, l.kind, l.progress AS new_progress, l.started_us, l.ended_us, l.error AS new_error, l.reason,
           l.error_type, l.error_where
      FROM gone g JOIN locked l ON l.id = g.id
), kept AS (
    """ + archive("done", status="done.kind", lease_expires_at="NULL",
                  started_at="now() - done.started_us * interval '1 microsecond'",
                  finished_at="now() - coalesce(done.ended_us, 0) * interval '1 microsecond'",
                  progress="coalesce(done.new_progress, done.progress)",
                  last_error="coalesce(done.new_error, done.last_error)") + """
), ev AS (
    INSERT INTO job_events (job_id, who, from_status, to_status, reason, actor, error_type, error_where)
    SELECT id, %(owner)s, 'running', 'failed', reason, actor, error_type, error_where FROM done WHERE kind = 'failed'
    UNION ALL
    SELECT id, %(owner)s, 'running', status, reason, actor, error_type, error_where FROM stays
), wake AS (
    -- a requeued row kept its run_at, its place in line, which may be behind the floors of
    -- every process's claims: '!' || queue makes them sweep (broker/consuming/floors.py)
    SELECT pg_notify('actor_supervisor_jobs',
                     CASE WHEN kind = 'limited' AND flow_key IS NOT NULL
                          THEN '~' || queue || ' ' || round(delay_ms / 1000.0, 3)::text
                          WHEN status = 'pending' AND kind <> 'limited' THEN '!' || queue
                          WHEN NOT due THEN '@' || queue
                          WHEN status = 'waiting' THEN '+' || queue ELSE queue END)
      FROM (SELECT DISTINCT queue, due, status, kind, flow_key IS NOT NULL AS flow_key,
                            CASE WHEN kind = 'limited' THEN delay_ms END AS delay_ms FROM stays) AS w
    UNION ALL
    -- a waiting row put back kept its run_at too, which may be behind the waiting floors
    -- (sql/flow.py's WAITING_FLOOR): '!' || queue as well
    SELECT pg_notify('actor_supervisor_jobs', '!' || queue)
      FROM (SELECT DISTINCT queue FROM stays WHERE status = 'waiting' AND kind IN ('requeue', 'limited')) AS r
)
SELECT (SELECT count(*) FROM done) + (SELECT count(*) FROM stays), (SELECT count(*) FROM wake)
""")

# Renews only the rows the process knows it holds: a row whose claim committed
# but never reached the process (connection lost mid-claim) is left to expire
# and be reaped, instead of being kept alive for ever by a healthy heartbeat.
# The ids renewed come back: a held row missing from them was reclaimed or
# cancelled, and its process interrupts the job (self-fencing).
HEARTBEAT = """
WITH locked AS (
    SELECT id FROM job_queue
     WHERE id = ANY(%(ids)s::uuid[]) AND lease_owner = %(owner)s AND status = 'running'
     ORDER BY id
       FOR NO KEY UPDATE
)
UPDATE job_queue j  -- by the primary key whatever the planner counts (see _RELEASE_BODY)
   SET heartbeat_at = now(), lease_expires_at = now() + %(lease_s)s * interval '1 second'
 WHERE j.id = ANY(ARRAY(SELECT id FROM locked))
RETURNING j.id::text
"""

# Lease lost (process or host died, froze, or stopped beating): the row goes back
# to pending, whatever its exception budget (max_retries counts exceptions only,
# as in Dramatiq). Each loss is counted; at max_lease_losses the job is a poison
# pill (it keeps killing or stalling its process) and ends failed. The event
# names the prior owner. Used with either an owner (supervisor saw the process
# die) or the expiry clock (a whole host died).
_LOSS_BUDGET = """coalesce(max_lease_losses, %(default_max_losses)s) AS budget,
           lease_losses + 1 >= coalesce(max_lease_losses, %(default_max_losses)s) AS poison"""

# The rows are updated and deleted by `id = ANY(ARRAY(...))`, an array whose length the
# planner cannot know, so by the primary key whatever it counts (as sql.FINISH): joined
# to `lost` (estimated at one row), the UPDATE and the DELETE were each planned as a walk
# of the whole primary key, which under a pinned horizon holds an entry for every version
# of every job since (722,644 buffers, 0.8-2.9 s a statement with nothing to release, a
# minute into a pin at 4,000 jobs/s: every reap and every quarter beat's release).
_RELEASE_BODY = """
, upd AS (
    UPDATE job_queue j
       SET status = CASE WHEN j.flow_key IS NULL THEN 'pending' ELSE 'waiting' END,
           lease_losses = j.lease_losses + 1,
           lease_owner = NULL, lease_expires_at = NULL, run_at = now()
     WHERE j.id = ANY(ARRAY(SELECT id FROM lost WHERE NOT lost.poison))
 RETURNING j.id, j.queue, j.actor, j.status, j.lease_losses
), removed AS (
    DELETE FROM job_queue j
     WHERE j.id = ANY(ARRAY(SELECT id FROM lost WHERE lost.poison))
 RETURNING j.*
), poisoned AS (
    SELECT removed.*, lost.budget, lost.owner AS lost_owner FROM removed JOIN lost ON lost.id = removed.id
), kept AS (
    """ + archive(
    "poisoned", status="'failed'", lease_losses="poisoned.lease_losses + 1", finished_at="now()",
    lease_owner="NULL", lease_expires_at="NULL", run_at="now()",
    last_error="""format('poison pill: lease lost %%s times while running (the job killed'
                         ' or stalled its process; last owner %%s, %%s); budget'
                         ' max_lease_losses=%%s used up, giving up',
                         poisoned.lease_losses + 1, poisoned.lost_owner, %(why)s::text, poisoned.budget)""") + """
), out AS (
    SELECT upd.id, upd.queue, upd.actor, upd.status, upd.lease_losses, lost.budget, lost.owner
      FROM upd JOIN lost ON lost.id = upd.id
    UNION ALL
    SELECT id, queue, actor, 'failed', lease_losses + 1, budget, lost_owner FROM poisoned
), ev AS (
    -- grouped on the Errors page as the runtime's own failures (032): no exception, no frame
    INSERT INTO job_events (job_id, who, from_status, to_status, reason, actor, error_type, error_where)
    SELECT id, %(who)s::text, 'running', status,
           format('%%s; prior owner %%s; lease loss %%s of %%s', %(why)s, owner, lease_losses, budget),
           actor, CASE WHEN status = 'failed' THEN 'PoisonPill' ELSE 'LeaseLost' END, ''
      FROM out
)
SELECT out.id, out.status, out.owner
  FROM out CROSS JOIN LATERAL (SELECT pg_notify('actor_supervisor_jobs',
                                                CASE WHEN out.status = 'waiting' THEN '+' ELSE '' END || out.queue)) AS wake
"""

def _release(where: str, tail: str = "") -> str:
    """A release of the running rows ``where`` selects (as ``lost``), then _RELEASE_BODY.
    Every running row is claimed: ``claimed_at IS NOT NULL`` lets jobs_running serve (027)."""
    return ("""
WITH lost AS (
    SELECT id, lease_owner AS owner, """ + _LOSS_BUDGET + """ FROM job_queue
     WHERE status = 'running' AND claimed_at IS NOT NULL AND """ + where + tail + """
       FOR UPDATE SKIP LOCKED
)""" + _RELEASE_BODY)


RELEASE_OWNER = _release("lease_owner = %(owner)s")

# `supervisor nodes forget NODE`: an operator says a host is gone (one whose processes
# no beat rule covers, e.g. all connections pooled): every job leased to one of its
# processes (owner ids are "node:pid:token", identity.owner_id) goes back at once. The
# node name is compared as a prefix by length, not LIKE: '_' is a valid name character.
RELEASE_NODE = _release("left(lease_owner, length(%(node)s) + 1) = %(node)s || ':'")

# Expired leases, read only where one can be. A process whose workers row beat within
# REAP_FRESH_BEATS of its beat interval renewed every row it held just before that beat
# (the upkeep renews, then beats; a failed renewal skips the beat), so none of its
# leases has run out: its key range of jobs_running is never read. Under a pinned horizon
# that range holds a dead entry for every job the process ran since the pin, a heap visit
# each (tests/test_reaper.py: 3,002 entries read for 3,000 jobs, 1 skipping it). Read
# instead: the gaps between the fresh owners' keys (every other owner: dead, frozen,
# stopped, registered with no beat interval or not at all, such as the dramatiq CLI; rows
# with no owner) and the reaper's own rows when it says some may be orphaned (%(me)s:
# rows it does not hold, see Leases.may_have_orphaned). Each arm is one range of the
# index; none reads past a fresh owner's key. The candidates are then locked by id, their
# lease checked again.
_EXPIRED_WHERE = ("SELECT id, lease_expires_at FROM job_queue"
                  " WHERE status = 'running' AND claimed_at IS NOT NULL"
                  " AND lease_expires_at < now() - %(margin_s)s * interval '1 second' AND ")
REAP_EXPIRED = """
WITH fresh AS MATERIALIZED (
    SELECT id FROM workers
     WHERE stopped_at IS NULL AND beat_seconds IS NOT NULL
       AND heartbeat_at > now() - %(fresh_beats)s * beat_seconds * interval '1 second'
       AND id IS DISTINCT FROM %(me)s::text
), gaps AS MATERIALIZED (
    SELECT lo, hi FROM (SELECT lag(id) OVER (ORDER BY id) AS lo, id AS hi FROM fresh) AS g WHERE lo IS NOT NULL
), expired AS (
    """ + "\n    UNION ALL\n    ".join([
    _EXPIRED_WHERE + "lease_owner < (SELECT min(id) FROM fresh)",
    # kept a subquery (OFFSET 0): the gap's bounds are its index range, not a join filter
    "SELECT j.id, j.lease_expires_at FROM gaps CROSS JOIN LATERAL ("
    + _EXPIRED_WHERE + "lease_owner > gaps.lo AND lease_owner < gaps.hi OFFSET 0) AS j",
    _EXPIRED_WHERE + "lease_owner > (SELECT max(id) FROM fresh)",
    _EXPIRED_WHERE + "lease_owner IS NULL",
    _EXPIRED_WHERE + "NOT EXISTS (SELECT FROM fresh)",  # no fresh owner: every running row
]) + """
), lost AS (
    SELECT id, lease_owner AS owner, """ + _LOSS_BUDGET + """ FROM job_queue
     WHERE id = ANY(ARRAY(SELECT id FROM expired ORDER BY lease_expires_at LIMIT %(limit)s))
       AND status = 'running' AND lease_expires_at < now() - %(margin_s)s * interval '1 second'
       FOR UPDATE SKIP LOCKED
)""" + _RELEASE_BODY

# A dead process is noticed by its beat, not its lease (worker/liveness.py). Its rows go
# back once all of these hold:
#   - its workers row and each row's own renewal are older than stale_beats of its beat
#     intervals (it registered one: it stops its own jobs once its renewals have failed
#     for that long, see broker/consuming/leases.py, so a live process cut off from the server
#     has stopped them by then);
#   - the server holds no session of it: a process that died has none (its kernel closed
#     its sockets), a frozen one (SIGSTOP, a stalled VM) keeps them and is left to its
#     leases, as ever; so is a claim it sent just before dying, while it still runs;
#   - its last beat reached this very server instance: a restart or a failover ends every
#     session with no process dying (those are left to their leases too).
# The rule above, for a workers row ``w``: its process is gone (also the job log's, sql/joblog.py).
GONE = """w.stopped_at IS NULL AND w.beat_seconds IS NOT NULL AND w.session_name IS NOT NULL
       AND w.heartbeat_at < now() - w.beat_seconds * %(stale_beats)s::float8 * interval '1 second'
       AND w.server_started = pg_postmaster_start_time()
       AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a
                        WHERE a.datname = current_database() AND a.application_name = w.session_name)"""
RELEASE_DEAD = (
    """
WITH gone AS MATERIALIZED (  -- per process (a few), not per job: pg_stat_activity is read once each
    SELECT w.id, w.beat_seconds * %(stale_beats)s * interval '1 second' AS stale
      FROM workers w
     WHERE """ + GONE + """
), candidates AS (
    -- each gone owner's own range of jobs_running, never a scan of the whole index (a join
    -- the planner may hash): under a pinned horizon that holds a dead entry for every job
    -- run since, and this runs every quarter beat (1.4-2.7 s a statement, a minute into a
    -- pin at 4,000 jobs/s, on one of the worker's two connections, with no process gone)
    SELECT c.id FROM gone CROSS JOIN LATERAL (
        SELECT id FROM job_queue
         WHERE lease_owner = gone.id AND status = 'running' AND heartbeat_at < now() - gone.stale
           AND claimed_at IS NOT NULL  -- true of every running row; it lets jobs_running serve (027)
        OFFSET 0) AS c
), lost AS (
    SELECT j.id, j.lease_owner AS owner, """ + _LOSS_BUDGET + """
      FROM job_queue j
     WHERE j.id = ANY(ARRAY(SELECT id FROM candidates)) AND j.status = 'running'
       AND j.heartbeat_at < now() - (SELECT gone.stale FROM gone WHERE gone.id = j.lease_owner)
       FOR UPDATE SKIP LOCKED
)"""
    + _RELEASE_BODY
)

# A running job is cancelled too: the row leaves job_queue at once (which frees its
# concurrency slot) and its process, told by NOTIFY, interrupts the job.
CANCEL = f"""
WITH done AS (
    DELETE FROM job_queue WHERE id = %(id)s
 RETURNING *
), kept AS (
    {archive("done", status="'cancelled'", finished_at="now()", lease_expires_at="NULL")}
), told AS (
    SELECT pg_notify('actor_supervisor_cancel', id::text) FROM done WHERE status = 'running'
)
INSERT INTO job_events (job_id, who, from_status, to_status, reason)
SELECT id, %(who)s, status, 'cancelled', %(reason)s FROM done, (SELECT count(*) FROM told) AS t
RETURNING job_id
"""

# An operator retries a finished (failed or cancelled) job: it moves back to job_queue,
# pending now, with room for one more attempt and one more lease loss. A live job with
# the same dedupe key (in any store: job_keys, 052), or the same id (its message sent again),
# wins: the row stays in history.
RETRY_FAILED = """
WITH done AS (
    DELETE FROM job_history h
     WHERE h.id = %(id)s AND h.status IN ('failed', 'cancelled')
       AND (h.dedupe_key IS NULL
            OR NOT EXISTS (SELECT 1 FROM job_queue q WHERE q.dedupe_key = h.dedupe_key)
               AND NOT EXISTS (SELECT 1 FROM job_keys_live(ARRAY[h.dedupe_key]) k WHERE k.job_id <> h.id))
       AND NOT job_id_live(h.id)  -- the id sent again, live (in job_queue, a timer or the log)
 RETURNING *
), back AS (
    INSERT INTO job_queue (""" + ", ".join(JOB_COLUMNS) + """)
    SELECT """ + ", ".join({"status": "CASE WHEN flow_key IS NULL THEN 'pending' ELSE 'waiting' END",
                            "run_at": "now()", "finished_at": "NULL",
                            "max_attempts": "greatest(max_attempts, attempts - lease_losses + 1)",
                            "max_lease_losses": "greatest(max_lease_losses, lease_losses + 1)"}.get(c, c)
                           for c in JOB_COLUMNS) + """
      FROM done
    RETURNING id, queue, status
), ev AS (
    INSERT INTO job_events (job_id, who, from_status, to_status, reason)
    SELECT b.id, %(who)s, d.status, b.status, 'retried by operator' FROM back b JOIN done d ON d.id = b.id
)
SELECT id FROM back
"""
