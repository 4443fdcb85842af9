"""The claim's keyed part: waiting rows (flow control, supervisor/flow.py) reached key by
key, in turn, each key taking what its limits allow (migration 036).

A row with a limit key waits as status 'waiting', outside jobs_claim: the claim's scan of
runnable rows never walks a key's backlog, however deep, and a row that may not start
holds nothing (no thread, no lease). The claim reads the queue's keys with waiting rows
from jobs_waiting (queue, flow_key, priority DESC, run_at, id), one index descent each (a
loose index scan, as the priority levels), starting after the key this process served
last (its cursor) and wrapping round: keys take turns (round robin), each ``weight`` rows
a turn. Each key visited is checked as it is read:

  - blocked (``RateLimited``: rate_limiter_state.blocked_until in the future): none;
  - rate: the tokens of its bucket (rate_limiter_state, refilled by elapsed time up to
    the burst; a key with no bucket yet has a full one);
  - daily quota: what is left of it this UTC day (the same row);
  - concurrency: its limit less its taken slots (job_concurrency, slot 0..N-1).

The scan stops once the keys allowed some rows carry weights enough for the claim (or at
``max_keys`` keys: the rest is for the next claim, which starts where this one ended). A
key whose bucket another claim holds right now is passed over (never waited on); the
buckets of the keys it takes from are locked (SKIP LOCKED) and read again before their
tokens are taken, so two claims never spend one token. Slots are kept rows, taken in
key order, never waited on (take_slots below, migration 046); a row
whose slot another claim took stays waiting (its tokens are lost, never overspent).

What the claim learns goes back with its rows (a last row with no job, ``META``):
seconds until a key it found gated by time (rate, quota, block) allows a row again, 0
when it stopped short of what it could take (claim again at once), and the key it served
last. A wait earlier than the one this process announced last goes out as NOTIFY
'~queue seconds': every process serving the queue wakes then (timer.py), so a freed token
starts its job without a poll (a freed slot wakes the queue through the release trigger).
"""

# A gate's opening is announced again only when sooner by this much than the one announced
# (the claims of several processes see the same time give or take their clocks' jitter:
# re-announcing it would wake every process for nothing): kannounce below, and gates.py.
# Defined here, with the statement, so the store's SQL imports nothing of the broker.
ANNOUNCE_MARGIN = 0.01

# A bucket fills up to its burst, plus what it refills in CARRY_SECONDS (at most half a
# token): the time between a token falling due and the claim that takes it (the timer's
# slack, a round trip) is not lost. With a burst of 1, a bucket capped at the burst lost it
# at every token: 20/s gave 18.4 starts a second (bench_limits.py L1). Whole tokens are
# taken, so the most starts in any window of W seconds stay burst + rate x W, rounded down.
CARRY_SECONDS = 0.025
_CARRY = "least(0.5, {rate} * " + str(CARRY_SECONDS) + ")"


# What one key allows now, read (not locked) as this claim's snapshot sees it: key and
# flow are the expressions naming the key and its limits (the row's flow jsonb). An
# operator's override (the bucket's ``override``, migration 037) replaces the values it
# names, read through the bucket's join (no other read per key); a null value lifts that
# limit. Every later step (kfinal, kupd, kslots) takes the limits from here.
# Columns: weight, needs_bucket, has_bucket, allow (rows, up to n), wake (seconds until a
# time gate opens), rate, burst, quota, conc.
def _gate(key: str, flow: str) -> str:
    return f"""(
    SELECT s.weight, s.needs_bucket, b.key IS NOT NULL AS has_bucket,
           CASE WHEN b.blocked_until > now() THEN 0
                ELSE greatest(0, least(%(n)s, floor(t.tokens)::int, s.quota - t.used,
                                       s.conc - (SELECT count(*) FROM job_concurrency c
                                                  WHERE c.key = {key} AND c.job_id IS NOT NULL
                                                    AND s.conc IS NOT NULL)::int))
           END AS allow,
           (CASE WHEN b.blocked_until > now() THEN extract(epoch FROM b.blocked_until - now())
                 WHEN t.used >= s.quota
                 THEN extract(epoch FROM (date_trunc('day', now() AT TIME ZONE 'UTC') + interval '1 day')
                                         AT TIME ZONE 'UTC' - now())
                 WHEN t.tokens < 1 THEN (1 - t.tokens) / s.rate
            END)::float8 AS wake,
           s.rate, s.burst, s.quota, s.conc
      FROM (SELECT 1) o
      LEFT JOIN rate_limiter_state b ON b.key = {key}
     CROSS JOIN LATERAL (
        SELECT CASE WHEN b.override IS NULL THEN {flow} ELSE coalesce({flow}, '{{}}') || b.override END AS f) e
     CROSS JOIN LATERAL (
        SELECT (e.f->>'r')::float8 AS rate,
               -- (an override's rate alone, on a key that had none: burst 1, as an option's)
               coalesce((e.f->>'b')::float8, CASE WHEN e.f->>'r' IS NOT NULL THEN 1 END) AS burst, (e.f->>'q')::int AS quota,
               (e.f->>'c')::int AS conc, greatest(1, coalesce((e.f->>'w')::int, 1)) AS weight,
               (e.f->>'r') IS NOT NULL OR (e.f->>'q') IS NOT NULL AS needs_bucket) s
     CROSS JOIN LATERAL (
        SELECT CASE WHEN s.rate IS NULL THEN NULL
                    WHEN b.key IS NULL THEN s.burst
                    ELSE least(s.burst + {_CARRY.format(rate="s.rate")},
                               b.tokens + s.rate * greatest(0, extract(epoch FROM now() - b.updated_at)))
               END AS tokens,
               -- (a quota day ahead of today: the log's claims reserved today's quota and
               -- more, 054: none is left today)
               CASE WHEN b.quota_day = (now() AT TIME ZONE 'UTC')::date THEN b.quota_used
                    WHEN b.quota_day > (now() AT TIME ZONE 'UTC')::date THEN s.quota ELSE 0 END AS used) t)"""


# Where the keyed part's reads of waiting rows start (broker/consuming/floors.py's waiting floor: the
# oldest run_at among the queue's waiting rows when the process's probe last looked, less the
# slack; '-infinity' when it knows none). Under a pinned horizon jobs_waiting keeps an entry
# for every row that waited since the pin, each a heap visit to pass over: a key's descent
# walked all of its key's (3.5 ms a descent, 94 ms a claim of 50 keys, 45 s into a pin at
# 800 jobs/s). run_at is a column of the index, so the bound is checked on each entry
# before any heap visit: the rows claimed before the floor cost a comparison each. The
# bound is a subquery (an InitPlan: a value the planner cannot see): given as a value, a
# floor newer than the statistics' last run_at (every floor, once an ANALYZE ran while rows
# waited) was estimated to leave a row or two, and the planner read jobs_waiting_due
# (queue, run_at) from the floor and sorted by key instead: every row since the floor, at
# each key of the loose scan (1.4 s a claim after a pin's release, 22,000 rows a descent).
WAITING_FLOOR = "j.run_at >= (SELECT %(kfloor)s::timestamptz)"


# The first waiting row of the next key (its head: the index order within a key is the
# claim order), or nothing; ``cond`` bounds the key.
def _next_key(cond: str, pass_no: str) -> str:
    return f"""(SELECT j.flow_key, j.flow, {pass_no} AS pass FROM job_queue j
      WHERE j.queue = %(queue)s AND j.status = 'waiting' AND {cond} AND {WAITING_FLOOR}
      ORDER BY j.flow_key, j.priority DESC, j.run_at, j.id LIMIT 1)"""


def take_slots(name: str, wanted: str) -> str:
    """CTEs that take concurrency slots (migration 046: kept rows): ``wanted`` selects
    (key, slot, id) pairs, each slot for the job ``id``; ``name`` is the CTE of the ids
    that got theirs. A free kept row is locked FOR UPDATE SKIP LOCKED and taken; a slot with
    no row yet is inserted (ON CONFLICT DO NOTHING). Neither waits on a row another
    transaction holds: a claim that waited on a slot row a finishing job was freeing (an
    ON CONFLICT DO UPDATE locks the row it meets even when its WHERE then refuses it) while
    that job's FINISH waited on a slot row the claim had locked so deadlocked (seen 1 in 8
    runs of test_concurrency_key_claims_never_overlap). A slot being freed right now is
    passed over: the freeing commit NOTIFYs '+queue', and the next claim takes it. Both in
    key order, as the single slot was taken."""
    return f"""{name}_want AS (
    {wanted}
), {name}_kept AS (
    SELECT c.key, c.slot FROM job_concurrency c
     WHERE (c.key, c.slot) IN (SELECT key, slot FROM {name}_want) AND c.job_id IS NULL
     ORDER BY c.key, c.slot
       FOR UPDATE SKIP LOCKED
), {name}_took AS (
    UPDATE job_concurrency c SET job_id = w.id, freed_at = NULL
      FROM {name}_want w
     WHERE c.key = w.key AND c.slot = w.slot AND (c.key, c.slot) IN (SELECT key, slot FROM {name}_kept)
 RETURNING c.job_id
), {name}_new AS (
    INSERT INTO job_concurrency (key, slot, job_id)
    SELECT w.key, w.slot, w.id FROM {name}_want w
     WHERE NOT EXISTS (SELECT 1 FROM job_concurrency c WHERE c.key = w.key AND c.slot = w.slot)
     ORDER BY w.key, w.slot
    ON CONFLICT DO NOTHING
 RETURNING job_id
), {name} AS (
    SELECT job_id FROM {name}_took UNION ALL SELECT job_id FROM {name}_new"""


# The keyed rows picked, each given one of its key's free slots (kfree), in turn.
_KSLOTS_WANT = """SELECT s.key, s.slot, p.id
      FROM (SELECT id, flow_key, row_number() OVER (PARTITION BY flow_key ORDER BY priority DESC, run_at, id) AS r
              FROM pick WHERE part = 1 AND conc IS NOT NULL) p
      JOIN kfree s ON s.key = p.flow_key AND s.r = p.r"""


# CTEs of the claim (after the plain part's ``cand``); the claim's UPDATE takes the rows of
# ``pick`` that ``claimable`` lets through and returns ``kmeta`` last.
KEYED = f"""
kscan(i, key, flow, pass, weight, needs_bucket, has_bucket, allow, wake, rate, burst, quota, conc, cum) AS (
    -- pass 0: keys after the cursor; pass 1: from the first key up to the cursor. No key
    -- while the queue is paused (no seed in levels).
    SELECT 1, h.flow_key, h.flow, h.pass, g.*, CASE WHEN g.allow > 0 THEN g.weight ELSE 0 END
      FROM ({_next_key("j.flow_key > %(cursor)s", "0")}
            UNION ALL
            {_next_key("j.flow_key <= %(cursor)s", "1")}
            LIMIT 1) h
     CROSS JOIN LATERAL {_gate("h.flow_key", "h.flow")} g
     WHERE EXISTS (SELECT 1 FROM levels WHERE depth = 0)
    UNION ALL
    SELECT k.i + 1, h.flow_key, h.flow, h.pass, g.*, k.cum + CASE WHEN g.allow > 0 THEN g.weight ELSE 0 END
      FROM kscan k
     CROSS JOIN LATERAL ({_next_key("k.pass = 0 AND j.flow_key > k.key", "0")}
            UNION ALL
            {_next_key("k.pass = 1 AND j.flow_key > k.key AND j.flow_key <= %(cursor)s", "1")}
            UNION ALL
            {_next_key("k.pass = 0 AND j.flow_key <= %(cursor)s", "1")}
            LIMIT 1) h
     CROSS JOIN LATERAL {_gate("h.flow_key", "h.flow")} g
     WHERE k.cum < %(n)s AND k.i < %(max_keys)s
), kuse AS (
    -- the keys allowed rows, in turn order, until their weights cover the claim
    SELECT * FROM kscan WHERE allow > 0 AND cum - weight < %(n)s
), klock AS (
    -- the buckets to take from, locked; one another claim holds is passed over
    SELECT b.key, b.tokens, b.updated_at, b.quota_day, b.quota_used
      FROM rate_limiter_state b
     WHERE b.key IN (SELECT key FROM kuse WHERE needs_bucket AND has_bucket)
       FOR UPDATE SKIP LOCKED
), kfinal AS (
    -- each key's rows this claim may take: its allowance (again from its locked bucket),
    -- at most its weight per turn for as many turns as the claim needs
    SELECT u.i, u.key, u.weight, u.needs_bucket, u.has_bucket, u.allow, u.rate, u.burst, u.quota, u.conc,
           CASE WHEN u.rate IS NULL THEN NULL WHEN u.has_bucket THEN l.tokens ELSE u.burst END AS tokens,
           coalesce(l.used, 0) AS used,
           least(u.allow, u.weight * (SELECT ceil(%(n)s::float8 / sum(weight))::int FROM kuse),
                 floor(l.tokens)::int, u.quota - l.used) AS lim
      FROM kuse u
      LEFT JOIN LATERAL (
        SELECT CASE WHEN u.rate IS NOT NULL
                    THEN least(u.burst + {_CARRY.format(rate="u.rate")},
                               b.tokens + u.rate * greatest(0, extract(epoch FROM now() - b.updated_at)))
               END AS tokens,
               CASE WHEN b.quota_day = (now() AT TIME ZONE 'UTC')::date THEN b.quota_used ELSE 0 END AS used,
               true AS held
          FROM klock b WHERE b.key = u.key) l ON true
     WHERE NOT (u.needs_bucket AND u.has_bucket AND l.held IS NULL)
), kcand AS (
    SELECT x.tid, x.id, x.flow_key, x.priority, x.run_at, f.i, f.weight, f.conc,
           row_number() OVER (PARTITION BY f.key ORDER BY x.priority DESC, x.run_at, x.id) AS rank
      FROM kfinal f CROSS JOIN LATERAL (
        SELECT j.ctid AS tid, j.id, j.flow_key, j.priority, j.run_at
          FROM job_queue j
         WHERE j.queue = %(queue)s AND j.status = 'waiting' AND j.flow_key = f.key AND j.run_at <= now()
           AND {WAITING_FLOOR}
         ORDER BY j.priority DESC, j.run_at, j.id
         LIMIT f.lim
           FOR UPDATE SKIP LOCKED) x
     WHERE f.lim > 0
), pick AS (
    -- the plain rows (in claim order) and the keyed ones (turn after turn), by priority;
    -- seq numbers them in that order (the order the claim hands them out)
    SELECT m.priority, m.tid, m.id, m.concurrency_key, m.flow_key, m.conc, m.run_at, m.part,
           row_number() OVER (ORDER BY m.priority DESC, m.seq, m.part) AS seq
      FROM (
        SELECT c.tid, c.id, c.concurrency_key, NULL::text AS flow_key, NULL::int AS conc, c.priority, c.run_at,
               row_number() OVER (ORDER BY c.priority DESC, c.run_at, c.id) AS seq, 0 AS part
          FROM cand c
        UNION ALL
        SELECT k.tid, k.id, NULL, k.flow_key, k.conc, k.priority, k.run_at,
               row_number() OVER (ORDER BY ceil(k.rank::float8 / k.weight), k.i), 1
          FROM kcand k) m
     ORDER BY m.priority DESC, m.seq, m.part
     LIMIT %(n)s
), ktake AS (
    -- each key's rows in the pick, with its limits and bucket as read (one hash join)
    SELECT f.key, t.n, f.rate, f.burst, f.quota, f.conc, f.tokens, f.used, f.needs_bucket, f.has_bucket
      FROM (SELECT flow_key, count(*)::int AS n FROM pick WHERE part = 1 GROUP BY flow_key) t
      JOIN kfinal f ON f.key = t.flow_key
), kupd AS (
    UPDATE rate_limiter_state b
       SET tokens = CASE WHEN t.rate IS NULL THEN b.tokens ELSE t.tokens - t.n END,
           burst = coalesce(t.burst, b.burst), rate_per_second = coalesce(t.rate, b.rate_per_second),
           daily_quota = t.quota, updated_at = greatest(b.updated_at, now()),
           quota_day = (now() AT TIME ZONE 'UTC')::date, quota_used = t.used + t.n,
           granted_total = b.granted_total + t.n
      FROM ktake t
     WHERE b.key = t.key AND t.needs_bucket AND t.has_bucket
 RETURNING b.key
), knew AS (
    -- a key's first bucket, full less what this claim takes; a claim that made it first wins
    INSERT INTO rate_limiter_state AS b (key, tokens, burst, rate_per_second, updated_at, daily_quota,
                                         quota_day, quota_used, granted_total)
    SELECT t.key, coalesce(t.burst, 1) - CASE WHEN t.rate IS NULL THEN 0 ELSE t.n END, coalesce(t.burst, 1),
           coalesce(t.rate, 1), now(), t.quota, (now() AT TIME ZONE 'UTC')::date, t.n, t.n
      FROM ktake t
     WHERE t.needs_bucket AND NOT t.has_bucket
     ORDER BY t.key
    ON CONFLICT DO NOTHING
 RETURNING b.key
), kok AS (
    SELECT key FROM ktake WHERE NOT needs_bucket UNION ALL SELECT key FROM kupd UNION ALL SELECT key FROM knew
), kfree AS (
    -- free slots of each concurrency-limited key, as many as it takes
    SELECT t.key, s.slot, row_number() OVER (PARTITION BY t.key ORDER BY s.slot) AS r
      FROM ktake t
     CROSS JOIN LATERAL (
        SELECT g.slot FROM generate_series(0, t.conc - 1) AS g(slot)
         WHERE NOT EXISTS (SELECT 1 FROM job_concurrency c
                            WHERE c.key = t.key AND c.slot = g.slot AND c.job_id IS NOT NULL)
         LIMIT t.n) s
     WHERE t.conc IS NOT NULL AND t.key IN (SELECT key FROM kok)
), {take_slots("kslots", _KSLOTS_WANT)}
), kcut AS (
    -- the scan stopped at max_keys short of what the claim could take: keys beyond may
    -- allow rows; keyed rows taken: whether this claim made progress
    SELECT (SELECT max(i) FROM kscan) >= %(max_keys)s AND (SELECT max(cum) FROM kscan) < %(n)s AS cut,
           (SELECT count(*) FROM ktake) > 0 AS took,
           (SELECT max(i) FROM kfinal) AS used
), kmeta AS (
    -- wait: 0 to claim again at once (progress made, and keys not reached or rows left);
    -- else the first time gate to open among the keys read (a scan cut at max_keys that
    -- found every key it read gated: the process reads on a little later, gates.py).
    -- cursor: where the next turn starts: after the last key served, unless every key read
    -- after it was gated: then after the last key read.
    SELECT CASE WHEN (SELECT count(*) FROM pick) < %(n)s AND x.took
                     AND (x.cut OR EXISTS (SELECT 1 FROM kfinal f
                                            WHERE f.lim < f.allow
                                              AND f.lim <= (SELECT count(*) FROM kcand c WHERE c.flow_key = f.key)))
                THEN 0::float8
                ELSE (SELECT min(w.s) FROM (
                        SELECT wake AS s FROM kscan WHERE allow = 0
                        UNION ALL
                        SELECT (1 - (t.tokens - t.n)) / t.rate FROM ktake t
                         WHERE t.rate IS NOT NULL AND t.tokens - t.n < 1) w WHERE w.s > 0)
           END AS wait,
           CASE WHEN EXISTS (SELECT 1 FROM kscan k WHERE k.allow > 0 AND k.i > coalesce(x.used, 0))
                THEN (SELECT key FROM kscan WHERE i = x.used)
                ELSE (SELECT key FROM kscan ORDER BY i DESC LIMIT 1) END AS cursor
      FROM kcut x
), kannounce AS (
    SELECT pg_notify('actor_supervisor_jobs', '~' || %(queue)s || ' ' || round(m.wait::numeric, 3)::text)
      FROM kmeta m
     WHERE m.wait > 0 AND (%(announced)s::float8 IS NULL OR m.wait < %(announced)s::float8 - {ANNOUNCE_MARGIN})
)"""

# Which rows of ``pick`` the claim's UPDATE takes: a plain row with no concurrency key, or
# whose key's slot it won; a keyed row whose key's bucket it took from (if it needs one)
# and whose slot it won (if its key has a concurrency limit).
CLAIMABLE = """(p.part = 0 AND (p.concurrency_key IS NULL OR p.id IN (SELECT job_id FROM slots)))
                              OR (p.part = 1 AND p.flow_key IN (SELECT key FROM kok)
                                  AND (p.conc IS NULL OR p.id IN (SELECT job_id FROM kslots)))"""

# The claim's META row (no job: its id is NULL): kmeta's wait and cursor, how many keys with
# waiting rows it saw (none: the queue has none now) and how many of its rows came from keys.
META = """
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, m.wait, m.cursor,
       (SELECT count(*) FROM kscan)::int, (SELECT coalesce(sum(n), 0) FROM ktake)::bigint
  FROM kmeta m
 WHERE (SELECT count(*) FROM kannounce) >= 0"""


# RateLimited (in the transaction of the outcome's 'limited' row: sql.FINISH's, or
# LOG_FINISH's, whose job then waits in job_timers: 054): the job's limit key blocked for
# ``seconds`` on every process, its bucket emptied so the first starts after the block do
# not come as a burst (as supervisor.ratelimit.block). A bucket below 0 keeps its debt (the
# starts the log's claims reserved ahead: 054), so no start is reserved twice. Nothing for
# a job with no key.
BLOCK_JOB_KEY = """
INSERT INTO rate_limiter_state AS s (key, tokens, burst, rate_per_second, updated_at, blocked_until)
SELECT k.flow_key, 0, 1, 1, now(), now() + %(seconds)s * interval '1 second'
  FROM (SELECT j.flow_key FROM job_queue j WHERE j.id = %(id)s
        UNION ALL
        SELECT t.flow_key FROM job_timers t WHERE t.id = %(id)s) k
 WHERE k.flow_key IS NOT NULL
 LIMIT 1
ON CONFLICT (key) DO UPDATE
   SET blocked_until = greatest(coalesce(s.blocked_until, '-infinity'), EXCLUDED.blocked_until),
       tokens = least(coalesce(s.tokens, 0), 0), updated_at = greatest(s.updated_at, EXCLUDED.updated_at)
RETURNING key
"""


# A plain row claimed for an actor with flow control whose producer did not key it
# (broker/consuming/late_keys.py): its key and limits written in, fenced by owner and attempt, still
# running; the requeue that follows in the same transaction (sql.FINISH) sends it to
# 'waiting' (a row with a key waits for it) with the claim not counted.
KEY_LATE = """
UPDATE job_queue j
   SET flow_key = k.flow_key, flow = k.flow::jsonb, concurrency_key = k.concurrency_key
  FROM unnest(%(ids)s::uuid[], %(attempts)s::int[], %(keys)s::text[], %(flows)s::text[],
              %(concurrency_keys)s::text[]) AS k(id, attempt, flow_key, flow, concurrency_key)
 WHERE j.id = k.id AND j.lease_owner = %(owner)s AND j.attempts = k.attempt AND j.status = 'running'
"""
