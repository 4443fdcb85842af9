"""The claim: runnable rows of a queue become running rows of one process; and the
wake-up timer's next due time."""

import functools

from .compact import compact as _compact
from .flow import CLAIMABLE, KEYED, META, take_slots
from .timers import NEXT_DUE_TIMERS

# Columns a consumer needs to rebuild a Dramatiq message and fence its lease.
# args, kwargs and options travel as one JSON text: one json.loads per row on
# the client instead of three jsonb decodes (the claim's largest client cost).
_CLAIMED = """j.id::text, j.queue, j.actor, jsonb_build_array(j.args, j.kwargs, j.options)::text,
    j.attempts, j.max_attempts, j.concurrency_key, j.lease_losses,
    coalesce(j.message_timestamp, (extract(epoch FROM j.created_at) * 1000)::bigint), j.payload,
    j.priority, j.run_at"""  # the last two: where this process's next claims may start (broker/consuming/floors.py)
# After them in a claim's rows: whether the row waited for its limit key (no floor moves
# for it), and the keyed part's wait, cursor, keys seen and rows taken from keys (NULL but
# in its META row, the first, whose id is NULL: sql/flow.py; a claimed row's last column
# is its place in the claim order).
KEYED_COLUMN, WAIT_COLUMN, CURSOR_COLUMN, KEYS_COLUMN, TOOK_COLUMN = 12, 13, 14, 15, 16

# jobs.priority is an integer: the levels' seed is one above its range, and a probe with no
# known level below starts one under it (a bound of -2**31 left a row at the lowest priority
# pending forever).
_ABOVE_ANY_PRIORITY = 2**31
_BELOW_ANY_PRIORITY = -(2**31) - 1
# Priority levels the claim reads one by one before it reads the rest in one scan.
_LEVELS_ONE_BY_ONE = 16

# What makes a row of the queue runnable now: due, and its concurrency key (if any) free.
_RUNNABLE = """j.queue = %(queue)s
       AND j.status IN ('pending', 'retryable')
       AND j.run_at <= now()
       AND (j.concurrency_key IS NULL
            OR NOT EXISTS (SELECT 1 FROM job_concurrency c WHERE c.key = j.concurrency_key AND c.job_id IS NOT NULL))"""



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
_HEAD = f"""
WITH RECURSIVE floors AS (
    -- Where this process's claims of each priority level start reading (broker/consuming/floors.py):
    -- every runnable row before it was claimed already (or is a straggler, which the
    -- process's next sweep, a claim with no floors, finds). Under a pinned xmin horizon
    -- the claim index keeps an entry for every row claimed since the pin; read from the
    -- floor, a claim passes over none of them. No floors: a sweep from the start.
    SELECT * FROM unnest(%(floor_levels)s::int[], %(floor_at)s::timestamptz[]) AS f(p, at)
), floor_all AS (
    -- Below the levels read one by one, the scan cannot seek by run_at (it follows
    -- priority in the index): the lowest floor is checked on each index entry, so an
    -- entry before it costs no heap visit. No floors: -infinity.
    SELECT CASE WHEN count(*) = 0 THEN '-infinity'::timestamptz ELSE min(at) END AS lowest FROM floors
), levels AS (
    -- The queue's highest priority levels, one index descent each (a loose index scan,
    -- as NEXT_DUE), each read from its run_at lower bound: rows due later at a higher
    -- priority are never walked (one scan in (priority, run_at) order walked them all:
    -- 100,000 delayed rows made every claim 6x slower). The seed is one above any
    -- priority, so one lookup serves every level (it plans faster, which a pooled
    -- connection pays on every claim). Only the first {_LEVELS_ONE_BY_ONE} levels: a descent per
    -- level costs more than stepping over a row, so below them, where a queue with
    -- thousands of distinct priorities keeps most of them, one ordered scan reads on.
    --
    -- No seed, so no level and no row, while the queue is paused. The seed also relaxes an
    -- idle claim's commit: this transaction's commit does not wait for its WAL flush, a
    -- third of the enqueue-to-start latency. A claim lost in a server crash only puts the
    -- row back to pending (a rerun, which the attempt fence handles). Claims under load
    -- stay synchronous: unflushed commits delay the hint bits that let later claims skip
    -- dead index entries. Set once, for this transaction only: one round trip, and nothing
    -- outlives it on a pooled (PgBouncer) connection.
    SELECT {_ABOVE_ANY_PRIORITY}::bigint AS p, 0 AS depth
     WHERE NOT EXISTS (SELECT 1 FROM queue_pauses p WHERE p.queue = %(queue)s)
       AND (SELECT CASE WHEN %(relaxed)s THEN set_config('synchronous_commit', 'off', true)
                        ELSE 'on' END) IS NOT NULL
    UNION ALL
    -- The next level is the next one this process has claimed from (it has a floor) or one
    -- between it and this level, whichever is higher: the probe reads only the gap between
    -- known levels, not the entries of a known level claimed since a pin.
    SELECT greatest((SELECT max(f.p) FROM floors f WHERE f.p < l.p),
                    (SELECT max(priority) FROM job_queue
                      WHERE queue = %(queue)s AND status IN ('pending', 'retryable') AND priority < l.p
                        AND priority > coalesce((SELECT max(f.p) FROM floors f WHERE f.p < l.p), {_BELOW_ANY_PRIORITY}::bigint))),
           l.depth + 1
      FROM levels l WHERE l.p IS NOT NULL AND l.depth < {_LEVELS_ONE_BY_ONE}
), cand AS (
    -- No ORDER BY here: levels come out highest first, each level's rows in (run_at, id)
    -- order, a LATERAL runs as a nested loop that keeps that order, and UNION ALL reads
    -- its second part only after the first. So LIMIT takes the first n rows in claim
    -- order and stops pulling: a level is read (and its rows locked) only while the claim
    -- still needs rows. A sort would lock up to n rows per level.
    SELECT x.* FROM levels l CROSS JOIN LATERAL (
    SELECT j.ctid AS tid, j.id, j.actor, j.concurrency_key, j.priority, j.run_at
      FROM job_queue j
     WHERE {_RUNNABLE}
       AND j.priority = l.p
       AND j.run_at >= coalesce((SELECT f.at FROM floors f WHERE f.p = l.p), '-infinity')
     ORDER BY j.run_at, j.id
     LIMIT %(n)s
       FOR UPDATE SKIP LOCKED) x
     WHERE l.p < {_ABOVE_ANY_PRIORITY}
    UNION ALL
    -- below the last level read one by one (none when the queue has fewer levels)
    SELECT y.* FROM (
    SELECT j.ctid AS tid, j.id, j.actor, j.concurrency_key, j.priority, j.run_at
      FROM job_queue j
     WHERE {_RUNNABLE}
       AND j.priority < (SELECT l.p FROM levels l WHERE l.depth = {_LEVELS_ONE_BY_ONE})
       AND j.run_at >= (SELECT f.lowest FROM floor_all f)
     ORDER BY j.priority DESC, j.run_at, j.id
     LIMIT %(n)s
       FOR UPDATE SKIP LOCKED) y
     LIMIT %(n)s
)"""

# A row with a concurrency key (written by hand: a producer's waits for its key) takes its
# key's one slot (slot 0), as sql/flow.py's take_slots takes them: in key order, never
# waiting on a slot another transaction holds. The CTE ``slots``: the ids that got theirs.
_SLOTS = take_slots("slots", "SELECT concurrency_key AS key, 0 AS slot, id FROM keyed")


def _update(tids: str, out: str) -> str:
    """The claimed rows (found by ``tids``) become running rows of this process; ``budget``:
    the budgets of the actors this process knows, for rows that carry none. They come back
    in claim order, with the columns ``out`` adds to _CLAIMED (and its FROM)."""
    return f"""
), budget AS (
    SELECT * FROM unnest(%(actors)s::text[], %(actor_max_attempts)s::int[], %(actor_max_losses)s::int[])
        AS b(actor, max_attempts, max_lease_losses)
), claimed AS (
UPDATE job_queue j
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
       started_at = NULL  -- set by the outcome: when this attempt began running in a thread
 WHERE j.ctid = ANY(ARRAY({tids}))
RETURNING j.*
)
-- a TID scan returns rows in ctid order: hand them out in claim order again (a META row,
-- with no priority, first)
SELECT {_CLAIMED}, {out}"""

# The plain claim's rows: no META row can follow, none of its columns.
_PLAIN_OUT = "j.flow_key IS NOT NULL FROM claimed j"
# A probing or keyed claim's rows: the META row's columns (NULL), then the claim order
# (pick's: turns between keys) for the keyed one.
_META_OUT = "j.flow_key IS NOT NULL, NULL::float8, NULL::text, NULL::int, NULL::bigint FROM claimed j"
_KEYED_OUT = "j.flow_key IS NOT NULL, NULL::float8, NULL::text, NULL::int, p.seq FROM claimed j JOIN pick p ON p.id = j.id"


# A queue with no waiting rows known: the plain rows only. A queue's first waiting rows
# are announced ('+' || queue: the insert trigger, sql.FINISH, the releases), which sends
# the process to CLAIM_KEYED; CLAIM_PROBE, now and then (broker/consuming/gates.py), also answers with
# a META row when the queue has waiting rows that no notice reached this process about.
# So a queue whose jobs carry no limit pays nothing for flow control but an index descent
# every PROBE_SECONDS.
_PLAIN = f"""{_HEAD}, keyed AS (
    SELECT DISTINCT ON (concurrency_key) id, concurrency_key
      FROM cand WHERE concurrency_key IS NOT NULL
     ORDER BY concurrency_key, priority DESC, run_at, id
), {_SLOTS}{_update("SELECT tid FROM cand WHERE concurrency_key IS NULL OR id IN (SELECT job_id FROM slots)",
                                "{out}")}"""

CLAIM = _compact(_PLAIN.replace("{out}", _PLAIN_OUT) + "\nORDER BY 11 DESC, 12, 1\n")

CLAIM_PROBE = _compact(_PLAIN.replace("{out}", _META_OUT) + """
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL, 1, NULL
 -- min(): one descent of jobs_waiting whatever the planner guesses (EXISTS became a scan of
 -- the whole table when half its rows were some other queue's waiting ones)
 WHERE (SELECT min(w.flow_key) FROM job_queue w WHERE w.queue = %(queue)s AND w.status = 'waiting') IS NOT NULL
ORDER BY 11 DESC, 12, 1
""")

# A queue with waiting rows: the plain rows and the keyed ones (sql/flow.py), and always a
# META row (its last column: how many keys with waiting rows the claim saw; none sends the
# process back to CLAIM).
CLAIM_KEYED = _compact(f"""{_HEAD},{KEYED}, keyed AS (
    SELECT DISTINCT ON (concurrency_key) id, concurrency_key
      FROM pick WHERE part = 0 AND concurrency_key IS NOT NULL
     ORDER BY concurrency_key, priority DESC, run_at, id
), {_SLOTS}{_update("SELECT p.tid FROM pick p WHERE " + CLAIMABLE, _KEYED_OUT)}
UNION ALL{META}
ORDER BY 11 DESC, 17, 1
""")


@functools.lru_cache(maxsize=64)
def claim(n: int, keyed: bool = False, probe: bool = False) -> str:
    """The claim for up to ``n`` rows: CLAIM, CLAIM_PROBE (``probe``) or, for a queue with
    waiting rows, CLAIM_KEYED (``keyed``); its parameters are CLAIM_KEYED's (the others
    read fewer), ``n`` among them.

    With ``LIMIT $n`` the server prices a generic plan at a tenth of the table; whether
    it then keeps a generic plan or plans every claim afresh (0.3-0.7 ms, a third of the
    claim's server time) depends on its estimates. For a power of two, ``n`` is written
    into the text instead, and that size keeps one generic plan once psycopg has prepared
    it (at its 5th run): the drain floor rises from 13,600 to 16,600 rows/s at claims of
    32 where the server had planned every claim (bench/README.md). Only powers of two: each
    cached plan holds about 340 KB of the server's memory per size and connection, and a
    consumer asks for any size up to 16 x threads; powers of two are at most 12 sizes up
    to 2,048; in the W1 drain (then at 4 x threads) 314 of a process's 319 claims asked
    for the full 32. Other sizes share CLAIM. Only an int goes into the text, never input."""
    if type(n) is not int or n < 1:
        raise ValueError(f"a claim takes a positive number of rows, not {n!r}")
    statement = CLAIM_KEYED if keyed else CLAIM_PROBE if probe else CLAIM
    if n & (n - 1):
        return statement
    return statement.replace("%(n)s", str(n))


# Whether a runnable row of the queue waits behind one of a process's claim floors (a
# straggler: broker/consuming/floors.py), per floor level one range scan of jobs_claim up to the
# floor (the floors as sql.CLAIM takes them, slack already taken off). Run by its own thread,
# off the claim's path: under a pinned horizon it reads every entry claimed since the pin,
# as a sweep does, but no claim waits for it; only when it finds one does a claim sweep.
STRAGGLERS = """
SELECT EXISTS (
    SELECT 1 FROM unnest(%(floor_levels)s::int[], %(floor_at)s::timestamptz[]) AS f(p, at)
     CROSS JOIN LATERAL (
        SELECT 1 FROM job_queue j
         WHERE j.queue = %(queue)s AND j.status IN ('pending', 'retryable') AND j.priority = f.p
           AND j.run_at < f.at AND j.run_at <= now()
           AND (j.concurrency_key IS NULL
                OR NOT EXISTS (SELECT 1 FROM job_concurrency c
                                WHERE c.key = j.concurrency_key AND c.job_id IS NOT NULL))
         LIMIT 1) s)
"""


# The waiting floor of a queue (sql/flow.py's WAITING_FLOOR, broker/consuming/floors.py): the oldest
# run_at among its waiting rows, or now when none is older; the probe's thread reads it,
# off the claim's path (under a pinned horizon the descent passes over every row that
# waited since the pin: jobs_waiting_due keeps their entries). A row committed later with
# an older run_at (a long transaction's) is behind the floor until the next round.
WAITING_FLOOR_AT = """
SELECT least(now(), (SELECT min(j.run_at) FROM job_queue j WHERE j.queue = %(queue)s AND j.status = 'waiting'))
"""

# How long (s) the oldest transaction of this database holding a snapshot or an xid has
# been open, 0 if none: what holds back the xmin horizon for its tables (PostgreSQL 14 on
# counts only the database's own sessions, plus replication slots and prepared
# transactions, which this leaves out). The claim floors' slack follows it (broker/consuming/floors.py).
HORIZON_HELD = """
SELECT coalesce(extract(epoch FROM now() - min(xact_start)), 0)::float8 FROM pg_stat_activity
 WHERE datname = current_database() AND pid <> pg_backend_pid()
   AND backend_type <> 'autovacuum worker'  -- shown with an xmin, but vacuum's own is left out of horizons
   AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
"""


# Seconds until the earliest future run_at of each of a process's queues (its
# wake-up timer). One index descent per priority level present in the queue
# (a loose index scan over jobs_claim), so a deep backlog costs nothing extra; and one
# into jobs_waiting_due for the rows that wait for a limit key (a key's own gate, a
# token or a block, comes from the claims: sql/flow.py); and one into job_timers (051).
NEXT_DUE = """
WITH RECURSIVE levels AS (
    SELECT q.queue, (SELECT max(j.priority) FROM job_queue j
                      WHERE j.queue = q.queue AND j.status IN ('pending', 'retryable')) AS priority
      FROM unnest(%(queues)s::text[]) AS q(queue)
    UNION ALL
    SELECT l.queue, (SELECT max(j.priority) FROM job_queue j
                      WHERE j.queue = l.queue AND j.status IN ('pending', 'retryable') AND j.priority < l.priority)
      FROM levels l
     WHERE l.priority IS NOT NULL
)
SELECT due.queue, extract(epoch FROM min(due.run_at) - now())::float8
  FROM (SELECT l.queue, d.run_at
          FROM levels l
         CROSS JOIN LATERAL (
            SELECT j.run_at FROM job_queue j
             WHERE j.queue = l.queue AND j.status IN ('pending', 'retryable') AND j.priority = l.priority
               AND j.run_at > now()
             ORDER BY j.run_at
             LIMIT 1) d
        UNION ALL
        SELECT q.queue, w.run_at
          FROM unnest(%(queues)s::text[]) AS q(queue)
         CROSS JOIN LATERAL (
            SELECT j.run_at FROM job_queue j
             WHERE j.queue = q.queue AND j.status = 'waiting' AND j.run_at > now()
             ORDER BY j.run_at
             LIMIT 1) w""" + NEXT_DUE_TIMERS + """) due
 GROUP BY due.queue
"""
