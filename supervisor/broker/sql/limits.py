"""The limit keys as the claim sees them, for the Limits page, ``GET /api/v1/limits``,
``/metrics`` and ``supervisor limits list`` (read through ``supervisor.limits.seen``).

One statement, bounded however many jobs wait: the keys come from a skip scan of
``jobs_waiting`` (one descent per queue and key, at most ``max_keys`` keys a queue), the
running rows (``jobs_running``: at most the fleet's threads) and the buckets
(``rate_limiter_state`` by its primary key), after ``after`` in key order, ``max_keys`` of
them (and one more, to tell that there are). Each key's waiting rows are counted up to
``upto`` (its count is "at least" then), in the same descent that finds the oldest due
one; each key's gate is the claim's own (``flow._gate``: the head row's limits, the
operator's override, tokens, quota, block, slots), so the page says what the next claim
will do.
"""

from .flow import _gate

# The rows a gate is asked to allow: enough that ``allow`` says how many could start now.
GATE_ROWS = 1_000_000

LIMITS = f"""
WITH RECURSIVE wq(queue) AS (
    -- the queues with waiting rows (a skip scan: one descent each)
    (SELECT queue FROM job_queue WHERE status = 'waiting' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM job_queue j WHERE j.status = 'waiting' AND j.queue > q.queue
             ORDER BY j.queue LIMIT 1)
      FROM wq q WHERE q.queue IS NOT NULL
), wk(queue, key, i) AS (
    -- each queue's keys with waiting rows, in key order, after ``after``
    SELECT q.queue, h.flow_key, 1
      FROM wq q CROSS JOIN LATERAL (
        SELECT j.flow_key FROM job_queue j
         WHERE j.queue = q.queue AND j.status = 'waiting' AND j.flow_key > %(after)s
         ORDER BY j.flow_key LIMIT 1) h
     WHERE q.queue IS NOT NULL
    UNION ALL
    SELECT w.queue, h.flow_key, w.i + 1
      FROM wk w CROSS JOIN LATERAL (
        SELECT j.flow_key FROM job_queue j
         WHERE j.queue = w.queue AND j.status = 'waiting' AND j.flow_key > w.key
         ORDER BY j.flow_key LIMIT 1) h
     WHERE w.i < %(max_keys)s
), tk(key, i) AS (
    -- the keys of the log's waiting timers (054: starts reserved, a block's end; a skip scan
    -- of job_timers_key, one descent each)
    (SELECT t.flow_key, 1 FROM job_timers t WHERE t.flow_key > %(after)s ORDER BY t.flow_key LIMIT 1)
    UNION ALL
    SELECT (SELECT t.flow_key FROM job_timers t WHERE t.flow_key > k.key ORDER BY t.flow_key LIMIT 1), k.i + 1
      FROM tk k WHERE k.key IS NOT NULL AND k.i <= %(max_keys)s
), running AS (
    SELECT j.flow_key AS key, count(*)::int AS n, min(j.id::text) AS one
      FROM job_queue j
     WHERE j.status = 'running' AND j.claimed_at IS NOT NULL AND j.flow_key > %(after)s
     GROUP BY j.flow_key
), keys AS (
    SELECT key FROM (
        SELECT key FROM wk
        UNION SELECT key FROM running
        UNION SELECT key FROM (SELECT key FROM rate_limiter_state WHERE key > %(after)s
                                ORDER BY key LIMIT %(max_keys)s + 1) b
        -- the log's keys (053): those with parked jobs, and those whose slots are held
        UNION SELECT key FROM (SELECT DISTINCT key FROM job_blocked WHERE key > %(after)s
                                ORDER BY key LIMIT %(max_keys)s + 1) p
        UNION SELECT key FROM (SELECT DISTINCT key FROM job_concurrency WHERE job_id IS NOT NULL AND key > %(after)s
                                ORDER BY key LIMIT %(max_keys)s + 1) s
        -- and (056) those of the log's running jobs that hold no slot: a weighted key's
        UNION SELECT key FROM (SELECT DISTINCT u.key FROM job_lease x CROSS JOIN LATERAL unnest(x.keys) AS u(key)
                                WHERE x.keys IS NOT NULL AND u.key > %(after)s
                                ORDER BY 1 LIMIT %(max_keys)s + 1) r
        UNION SELECT key FROM tk WHERE key IS NOT NULL) k
     ORDER BY key LIMIT %(max_keys)s + 1
), parked AS (
    -- per key of the log: its parked jobs (each one's parked row with no outcome), the oldest
    -- one's creation and limits
    SELECT b.key, array_agg(DISTINCT b.queue) AS queues, count(*)::int AS n, min(l.created_at) AS since,
           (array_agg(l.flow ORDER BY b.pos))[1] AS flow
      FROM job_blocked b CROSS JOIN LATERAL (  -- by (seq, day), never a hash of the whole log
             SELECT x.created_at, x.flow FROM job_log x WHERE x.seq = b.seq AND x.day = b.day OFFSET 0) l
     WHERE b.key IN (SELECT key FROM keys)
       AND NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = b.seq AND d.day = b.day)
     GROUP BY b.key
), timed AS (
    -- per key of the log: its jobs waiting in job_timers (up to ``upto``), the oldest one's
    -- creation and limits
    SELECT k.key, c.n, c.since, c.flow, c.queues
      FROM keys k CROSS JOIN LATERAL (
        SELECT count(*)::int AS n, min(x.created_at) AS since, (array_agg(x.flow))[1] AS flow,
               array_agg(DISTINCT x.queue) AS queues
          FROM (SELECT t.created_at, t.flow, t.queue FROM job_timers t WHERE t.flow_key = k.key LIMIT %(upto)s) x) c
     WHERE c.n > 0
), wh AS (
    -- per queue and key: its waiting rows (up to ``upto``), the oldest due, the head's limits
    SELECT w.queue, w.key, c.n, c.since,
           (SELECT j.flow FROM job_queue j WHERE j.queue = w.queue AND j.status = 'waiting' AND j.flow_key = w.key
             ORDER BY j.priority DESC, j.run_at, j.id LIMIT 1) AS flow
      FROM wk w
     CROSS JOIN LATERAL (
        SELECT count(*)::int AS n, min(x.run_at) FILTER (WHERE x.run_at <= now()) AS since
          FROM (SELECT j.run_at FROM job_queue j
                 WHERE j.queue = w.queue AND j.status = 'waiting' AND j.flow_key = w.key
                 ORDER BY j.priority DESC, j.run_at, j.id LIMIT %(upto)s) x) c
     WHERE w.key IN (SELECT key FROM keys)
), wa AS (
    SELECT h.key, array_agg(h.queue ORDER BY h.queue) AS queues, sum(h.n)::int AS waiting,
           bool_or(h.n >= %(upto)s) AS waiting_more, min(h.since) AS since,
           (array_agg(h.flow ORDER BY h.queue))[1] AS flow
      FROM wh h GROUP BY h.key
), kv AS MATERIALIZED (
    -- (materialized: the gate names the key's flow many times; each would run its subquery)
    SELECT k.key, coalesce(a.queues, p.queues, td.queues, '{{}}') AS queues,
           coalesce(a.waiting, 0) + coalesce(p.n, 0) + coalesce(td.n, 0) AS waiting,
           coalesce(a.waiting_more, false) OR coalesce(td.n >= %(upto)s, false) AS waiting_more,
           least(a.since, p.since, td.since) AS waiting_since,
           coalesce(a.flow, p.flow, td.flow, (SELECT j.flow FROM job_queue j WHERE j.id = r.one::uuid),
                    (SELECT l.flow FROM job_concurrency c JOIN job_log l ON l.id = c.job_id
                      WHERE c.key = k.key AND l.flow IS NOT NULL LIMIT 1)) AS flow,
           -- (a log job holding a slot: running, or handed it and about to be claimed)
           coalesce(r.n, 0) + (SELECT count(*) FROM job_concurrency c
                                WHERE c.key = k.key AND c.job_id IS NOT NULL
                                  AND NOT EXISTS (SELECT 1 FROM job_queue j WHERE j.id = c.job_id))::int
           -- (056: a log job of the key running without a slot: a weight alone, or a lifted limit)
           + (SELECT count(*) FROM job_lease x
               CROSS JOIN LATERAL unnest(x.seqs, x.days, x.keys, x.slots) AS u(seq, day, key, slot)
               WHERE x.keys IS NOT NULL AND u.key = k.key AND u.slot IS NULL
                 AND NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = u.seq AND d.day = u.day))::int AS running
      FROM keys k LEFT JOIN wa a ON a.key = k.key LEFT JOIN running r ON r.key = k.key
      LEFT JOIN parked p ON p.key = k.key LEFT JOIN timed td ON td.key = k.key
)
SELECT v.key, v.queues, v.waiting, v.waiting_more, extract(epoch FROM now() - v.waiting_since)::float8 AS wait_s,
       v.running, (SELECT count(*) FROM job_concurrency c WHERE c.key = v.key AND c.job_id IS NOT NULL)::int AS slots_taken,
       l.rate, l.burst, l.quota, g.conc AS concurrency, g.weight,
       CASE WHEN l.rate IS NULL THEN NULL
            WHEN b.key IS NULL OR b.tokens IS NULL THEN l.burst
            -- (below 0: the starts the log's claims reserved ahead, 054; none to take now)
            ELSE greatest(0, least(l.burst, b.tokens + l.rate * greatest(0, extract(epoch FROM now() - b.updated_at))))
       END::float8 AS tokens,
       -- (a quota day ahead: the log's claims reserved all of today's, 054)
       CASE WHEN b.quota_day = (now() AT TIME ZONE 'UTC')::date THEN b.quota_used
            WHEN b.quota_day > (now() AT TIME ZONE 'UTC')::date THEN l.quota ELSE 0 END AS quota_used,
       CASE WHEN b.blocked_until > now() THEN b.blocked_until END AS blocked_until,
       g.allow, CASE WHEN g.allow = 0 THEN g.wake END AS opens_in_s,
       CASE WHEN b.blocked_until > now() THEN 'blocked'
            WHEN g.allow = 0 AND g.quota IS NOT NULL
                 AND (b.quota_day = (now() AT TIME ZONE 'UTC')::date AND b.quota_used >= g.quota
                      OR b.quota_day > (now() AT TIME ZONE 'UTC')::date) THEN 'quota'
            WHEN g.allow = 0 AND g.wake IS NOT NULL THEN 'rate'
            WHEN g.allow = 0 THEN 'concurrency'
       END AS gated_by,
       b.override, b.override_by, b.override_at, coalesce(b.granted_total, 0) AS granted_total,
       coalesce(b.denied_total, 0) AS denied_total, v.flow IS NOT NULL AS from_jobs
  FROM kv v
 CROSS JOIN LATERAL {_gate("v.key", "v.flow")} g
  LEFT JOIN rate_limiter_state b ON b.key = v.key
 CROSS JOIN LATERAL (
    -- a key no job names now (a take() caller's bucket): its bucket's own limits, under the override
    SELECT CASE WHEN v.flow IS NOT NULL OR b.override ? 'r' THEN g.rate ELSE b.rate_per_second END AS rate,
           CASE WHEN v.flow IS NOT NULL OR b.override ? 'b' THEN g.burst ELSE b.burst END AS burst,
           CASE WHEN v.flow IS NOT NULL OR b.override ? 'q' THEN g.quota ELSE b.daily_quota END AS quota) l
 ORDER BY v.key
"""

# A key's limits changed (an override set or cleared): every queue with rows waiting on it
# claims them again now ('+queue', as a freed slot does), not at the time a gate announced.
WAKE_WAITING = """
WITH RECURSIVE wq(queue) AS (
    (SELECT queue FROM job_queue WHERE status = 'waiting' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM job_queue j WHERE j.status = 'waiting' AND j.queue > q.queue
             ORDER BY j.queue LIMIT 1)
      FROM wq q WHERE q.queue IS NOT NULL
)
SELECT pg_notify('actor_supervisor_jobs', '+' || q.queue)
  FROM wq q
 WHERE q.queue IS NOT NULL
   AND EXISTS (SELECT 1 FROM job_queue j WHERE j.queue = q.queue AND j.status = 'waiting' AND j.flow_key = %(key)s)
"""
