"""The operator's and the dashboard's reads of ``jobs``, ``job_history`` and ``job_events``.

The jobs table's SQL is this module and ``sql/`` (claims, outcomes, leases:
what workers run); these statements only read, for the CLI, the HTTP API and
the dashboard.
"""

import functools

GET = "SELECT * FROM jobs WHERE id = %(id)s"

STATUS = "SELECT status FROM jobs WHERE id = %(id)s"

EVENTS = "SELECT * FROM job_events WHERE job_id = %(id)s ORDER BY at, id"

# The line of last_error a person reads in a list: a traceback's exception, not its
# "Traceback (most recent call last):" header. What follows the last frame (a
# "  File ..." line and the deeper-indented source lines under it) is the exception
# (a chained one's last), its lines joined into one. Text that is no traceback (a
# poison pill, a missing actor) stays as it is. The job's own page shows it whole.
_ERROR_LINE = r"""left(coalesce(nullif(btrim(regexp_replace(
           regexp_replace(last_error, '^.*\n  File [^\n]*\n(    [^\n]*\n)*', ''), '\s+', ' ', 'g')), ''),
       last_error), {width}) AS last_error"""
ERROR_LINE = _ERROR_LINE  # for the other modules of reads (actor_reads)

# --- the operator's view: filtered listing with keyset (cursor) paging, capacity ---

# Each filter of a listing, by the bind parameter that gives it: a statement holds only
# the fragments of the filters given (``where``), so the planner sees each condition as
# it is (an id range becomes a range scan of the primary key) instead of a generic
# ``%(x)s IS NULL OR ...`` that a cached plan would have to walk past. No fragment takes
# text from a request: values are bind parameters.
FILTERS = {
    "status": "status = %(status)s",
    "queue": "queue = %(queue)s",
    "actor": "actor = %(actor)s",
    # a substring of the job's arguments (args and kwargs as JSON text)
    "text": "strpos(args::text || ' ' || kwargs::text, %(text)s) > 0",
    "created_after": "created_at >= %(created_after)s",
    "created_before": "created_at < %(created_before)s",
    "finished_after": "finished_at >= %(finished_after)s",
    "finished_before": "finished_at < %(finished_before)s",
    # an id or the start of one: every uuid from prefix000... to prefixfff... (jobsearch.id_range)
    "id_lo": "id BETWEEN %(id_lo)s::uuid AND %(id_hi)s::uuid",
    "dedupe_key": "dedupe_key = %(dedupe_key)s",
    "concurrency_key": "concurrency_key = %(concurrency_key)s",
    # the steps of a workflow (migration 049): its steps' ids by workflow_steps' index, each
    # part's rows then by their id index
    "workflow": "id IN (SELECT s.id FROM workflow_steps s WHERE s.workflow = %(workflow)s::uuid)",
    # a value at a path inside the arguments (jobsearch.Match): a text[] path for #>
    "match_args": "args #> %(match_args)s::text[] = %(match_value)s::jsonb",
    "match_kwargs": "kwargs #> %(match_kwargs)s::text[] = %(match_value)s::jsonb",
}
# Filters an index or a partition bound serves: a status prunes to its days of
# job_history (or to job_queue), a time range to its days or to a range of
# job_history_created, an id range to the primary keys, a workflow to its steps' ids. Rows read through them all
# match, so a listing stops after its page and a count after COUNT_EXACT_UPTO rows.
# Every other filter (a queue, an actor, text, a key, a value inside the arguments) has
# no index on job_history (each would cost every finished job an entry: ARCHITECTURE.md,
# "Storage"): it is checked on a window of the newest %(scan_rows)s jobs only.
INDEXED = frozenset({"status", "created_after", "created_before", "finished_after", "finished_before", "id_lo",
                     "workflow"})
AFTER = "(created_at, id) < (%(after_at)s, %(after_id)s::uuid)"

LIST_COLUMNS = f"""id, queue, actor, status, priority, attempts, max_attempts, run_at, created_at, started_at,
       finished_at, lease_owner, progress, dedupe_key, concurrency_key, {_ERROR_LINE.format(width=200)}"""
PAGE_COLUMNS = f"""id, queue, actor, status, attempts, max_attempts, created_at, started_at, finished_at,
       {_ERROR_LINE.format(width=120)}, progress, dedupe_key, concurrency_key"""


def where(names: frozenset[str], *, after: bool = False) -> str:
    """The conjunction of the named filters' fragments (and the cursor's), or TRUE."""
    parts = [FILTERS[n] for n in FILTERS if n in names] + ([AFTER] if after else [])
    return "\n   AND ".join(parts) or "TRUE"


# The final statuses of the log's finished jobs: a listing reads each one's part in order.
LOG_FINAL = ("succeeded", "failed", "cancelled")


def ordered(names: frozenset[str], limit: str, *, after: bool = False, newest: bool = True) -> str:
    """The jobs matching the named filters in (created_at, id) order, newest first unless
    told, up to ``limit`` (SQL of bind parameters), as a relation named ``jobs``: each
    part (job_queue and job_history; the log's live jobs; its finished jobs of one final
    status, by job_done_status_created) read in order and up to the limit on its own, the
    parts merged. Read through the jobs view, the planner sorted every done row of the
    log: a part with a WHERE is a subquery it cannot read in order (042)."""
    order = "created_at DESC, id DESC" if newest else "created_at, id"
    w = where(names, after=after)
    parts = [f"(SELECT * FROM {view} WHERE {w} ORDER BY {order} LIMIT {limit})"
             for view in ("jobs_queue_history", "jobs_log_live")]
    # A window of finish times bounds the log's done rows (job_done_finished) where creation
    # order cannot: its days are the days jobs were sent, so each day's rows would be read
    # in order, every one, to find the few that finished in the window. Read apart (OFFSET 0),
    # the window's rows are found first, then ordered.
    fence = " OFFSET 0" if "finished_after" in names else ""
    parts += [f"(SELECT * FROM (SELECT * FROM jobs_log_finished WHERE status = '{s}' AND {w}{fence}) AS d"
              f" ORDER BY {order} LIMIT {limit})" for s in LOG_FINAL]
    return "(" + "\n        UNION ALL ".join(parts) + ") AS jobs"


@functools.cache
def jobs_page(columns: str, names: frozenset[str], after: bool) -> str:
    """Newest first; the next page starts after the (created_at, id) of the last row seen."""
    return f"""
SELECT {columns}
  FROM {ordered(names, "%(limit)s", after=after)}
 ORDER BY created_at DESC, id DESC
 LIMIT %(limit)s"""


def _window(names: frozenset[str], after: bool) -> str:
    """The newest %(scan_rows)s jobs (after the cursor) within the indexed filters, and the
    one after them (it tells whether older jobs were left unread), numbered newest first
    (``i``), each with whether the other filters match it (``hit``)."""
    return f"""(SELECT j.*, ({where(names - INDEXED)}) AS hit,
               row_number() OVER (ORDER BY created_at DESC, id DESC) AS i
          FROM (SELECT * FROM {ordered(names & INDEXED, "%(scan_rows)s + 1", after=after)}
                 ORDER BY created_at DESC, id DESC
                 LIMIT %(scan_rows)s + 1) AS j) AS w"""


@functools.cache
def window_page(columns: str, names: frozenset[str], after: bool) -> str:
    """A search no index serves, in one read of its window: the matches (up to
    %(limit)s), then, once the window's rows run out, the window's last row and the one
    after it (``i`` >= %(scan_rows)s: where the next page starts). Read lazily: a page
    that fills stops there, however large the window."""
    return f"""
SELECT {columns}, hit, i
  FROM {_window(names, after)}
 WHERE hit OR i >= %(scan_rows)s
 ORDER BY created_at DESC, id DESC
 LIMIT %(limit)s + 2"""


@functools.cache
def window_count(names: frozenset[str]) -> str:
    """A search's matches in its (first) window, and the window's last row when older
    jobs were left unread (else NULLs): one read of the window."""
    return f"""
SELECT count(*) FILTER (WHERE hit AND i <= %(scan_rows)s) AS matches,
       CASE WHEN count(*) > %(scan_rows)s THEN min(created_at) FILTER (WHERE i = %(scan_rows)s) END AS edge_at
  FROM {_window(names, False)}"""


@functools.cache
def matching_ids(names: frozenset[str], window: bool) -> str:
    """Ids of the jobs a bulk action covers, oldest first (a search: within its window)."""
    if window:
        return f"""SELECT id::text FROM {_window(names, False)}
 WHERE hit AND i <= %(scan_rows)s ORDER BY created_at, id LIMIT %(limit)s"""
    return f"SELECT id::text FROM {ordered(names, '%(limit)s', newest=False)} ORDER BY created_at, id LIMIT %(limit)s"


# An exact count stops at the threshold; past it the planner's estimate stands in.
@functools.cache
def count_upto(names: frozenset[str]) -> str:
    return f"SELECT count(*) FROM (SELECT 1 FROM jobs WHERE {where(names)} LIMIT %(upto)s) AS m"


# The planner's estimate of the stored jobs (job_queue, job_history, the log's finished
# ones); of the log's live jobs (a join of its cursors the planner cannot see) it guessed
# millions where there were none, so those are counted (count_log_live) and added.
@functools.cache
def count_plan(names: frozenset[str]) -> str:
    w = where(names)
    return f"""EXPLAIN (FORMAT JSON) SELECT 1 FROM jobs_queue_history WHERE {w}
 UNION ALL SELECT 1 FROM jobs_log_finished WHERE {w}"""


@functools.cache
def count_log_live(names: frozenset[str]) -> str:
    return f"SELECT count(*) FROM (SELECT 1 FROM jobs_log_live WHERE {where(names)} LIMIT %(upto)s) AS m"


# --- the dashboard's reads: only indexed slices (live rows, rows finished lately) ---
#
# Each read of finished rows names jobs_finished (job_history and the job log's final done
# rows, migration 039) and a window of finished_at: of job_history it reads only the days
# of its window (partition pruning), through job_history_finished (of job_done, a block
# range index of finished_at per day), newest
# first; a window longer than an hour reads at most its newest %(cap)s rows, and says
# from when they start. Live rows are read through jobs_live (the claim and running
# indexes): as many as the backlog.

# Jobs finished per time bucket over the last window_s seconds, from the rows (the
# dashboard reads the recorder's rollup for windows longer than an hour).
FINISHED_PER_BUCKET = """
SELECT date_bin(%(step_s)s * interval '1 second', finished_at, timestamptz 'epoch') AS t,
       count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE status = 'failed')    AS failed
  FROM jobs_finished
 WHERE finished_at > now() - %(window_s)s * interval '1 second'
 GROUP BY 1 ORDER BY 1
"""

# How long an attempt waited to start: from when it could run (enqueued, or due: run_at,
# which a retry, a lease loss and a requeue move) to when it began running in a thread
# (started_at, the attempt's own). In seconds, never below 0; NULL for a job that never
# ran (greatest() alone would make that a wait of 0: it skips NULLs). date_part, not
# extract: extract's numeric is a third of the Actors page's time over 100,000 rows.
_WAIT_S = """CASE WHEN started_at IS NOT NULL
            THEN greatest(date_part('epoch', started_at - greatest(created_at, run_at)), 0) END"""
WAIT_S = _WAIT_S  # for the other modules of reads (actor_reads)

# Where a capped window's reads start: the window's start, or later where the recorder's
# samples (finished jobs per queue and period, queue_samples) reach %(cap)s jobs back from
# now: the period two before the one that reaches it (a sample counts the jobs finished in
# the period before last). Read newest first up to the cap, the window would still read all
# its done rows of the log: a block range index of finish times cannot read newest first.
# Samples that count short (none kept, or gaps) only move the start earlier.
CAP_START = """greatest(now() - %(window_s)s * interval '1 second', coalesce((
    SELECT max(older) FROM (
        SELECT lead(at, 2) OVER w AS older, sum(n) OVER w AS upto
          FROM (SELECT at, sum(succeeded + failed) AS n FROM queue_samples
                 WHERE at > now() - %(window_s)s * interval '1 second' GROUP BY at) AS s
        WINDOW w AS (ORDER BY at DESC)) AS r
     WHERE upto >= %(cap)s), '-infinity'))"""

# The start waits of jobs finished in the last window (a running attempt's start is
# written with its outcome, so only finished ones are known): of its newest %(cap)s jobs
# at most, and the finish of the oldest one read (the window's start unless capped).
START_LATENCY = f"""
SELECT count(*) AS n, percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY wait) AS pct,
       min(finished_at) AS oldest
  FROM (SELECT {_WAIT_S} AS wait, finished_at
          FROM jobs_finished
         WHERE status IN ('succeeded', 'failed') AND finished_at > {CAP_START}
           AND started_at IS NOT NULL
         ORDER BY finished_at DESC
         LIMIT %(cap)s) AS f
"""

# Live rows per queue (jobs_live: the claim, waiting and running indexes, never the finished
# rows); a row waiting for its limit key counts as ready (or scheduled), as a pending one.
LIVE_BY_QUEUE = """
SELECT queue,
       count(*) FILTER (WHERE status IN ('pending', 'waiting') AND run_at <= now())   AS ready,
       count(*) FILTER (WHERE status IN ('pending', 'retryable', 'waiting') AND run_at > now()) AS scheduled,
       count(*) FILTER (WHERE status = 'running')                                    AS running,
       count(*) FILTER (WHERE status = 'retryable' AND run_at <= now())              AS retryable,
       extract(epoch FROM now() - min(run_at) FILTER (WHERE status IN ('pending', 'retryable', 'waiting')
                                                      AND run_at <= now()))::float8 AS oldest_wait_s
  FROM jobs_live
 GROUP BY queue
"""

# Failed rows kept, per queue: counted when the failed days hold few (a count_upto of
# status = 'failed' says so), else estimated from each failed day's statistics as the
# planner would: its row count (reltuples, scaled to the table's size now) times the
# queue's frequency among the most common values of its sample (pg_stats). A day not yet
# analyzed, or a queue too rare to be among them, adds nothing. The job log's days
# (job_done) hold every outcome: their share of 'failed' multiplies in (the two columns
# taken as independent, as the planner takes them).
FAILED_BY_QUEUE = "SELECT queue, count(*) AS failed FROM jobs_finished WHERE status = 'failed' GROUP BY queue"
FAILED_BY_QUEUE_ESTIMATE = """
SELECT v.queue, round(sum(c.reltuples * v.freq * share.failed * pg_relation_size(c.oid)
                          / (current_setting('block_size')::int * c.relpages)))::bigint AS failed
  FROM pg_inherits i
  JOIN pg_class c ON c.oid = i.inhrelid AND c.relpages > 0 AND c.reltuples > 0
  JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_stats s ON s.schemaname = n.nspname AND s.tablename = c.relname AND s.attname = 'queue'
 CROSS JOIN LATERAL unnest(s.most_common_vals::text::text[], s.most_common_freqs) AS v(queue, freq)
 CROSS JOIN LATERAL (
     SELECT coalesce(sum(f.freq), 0) AS failed FROM pg_stats t,
            unnest(t.most_common_vals::text::text[], t.most_common_freqs) AS f(status, freq)
      WHERE i.inhparent = 'job_done'::regclass AND t.schemaname = n.nspname AND t.tablename = c.relname
        AND t.attname = 'status' AND f.status = 'failed'
     UNION ALL
     SELECT 1 WHERE i.inhparent = 'job_history_failed'::regclass) AS share
 WHERE i.inhparent IN ('job_history_failed'::regclass, 'job_done'::regclass)
 GROUP BY v.queue
"""

# Per queue over the last hour of finished rows: outcomes, durations (the last
# attempt's run time; rows that never ran have none), the processes that finished
# them (for throughput per worker-hour) and the start waits, p50 / p95 / p99, in
# seconds rounded to the millisecond. An attempt's wait is not its duration. One sort
# per column (an ordered-set aggregate sorts its group again for each call).
FINISHED_BY_QUEUE = f"""
SELECT queue, failed_1h, finished_1h, avg_s, p95_s, owners_1h,
       round(waits[1]::numeric, 3)::float8 AS wait_p50_s, round(waits[2]::numeric, 3)::float8 AS wait_p95_s,
       round(waits[3]::numeric, 3)::float8 AS wait_p99_s
  FROM (SELECT queue,
               count(*) FILTER (WHERE status = 'failed')                 AS failed_1h,
               count(*) FILTER (WHERE status IN ('succeeded', 'failed')) AS finished_1h,
               avg(dur_s) FILTER (WHERE status = 'succeeded')            AS avg_s,
               percentile_cont(0.95) WITHIN GROUP (ORDER BY dur_s) FILTER (WHERE status = 'succeeded') AS p95_s,
               count(DISTINCT lease_owner) FILTER (WHERE status IN ('succeeded', 'failed')) AS owners_1h,
               percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY wait_s) AS waits
          FROM (SELECT queue, status, lease_owner,
                       date_part('epoch', finished_at - started_at) AS dur_s,
                       CASE WHEN status IN ('succeeded', 'failed') THEN {_WAIT_S} END AS wait_s
                  FROM jobs_finished
                 WHERE finished_at > now() - interval '1 hour') AS f
         GROUP BY queue) AS q
"""

# The queues a filter may name, without reading the jobs: those with waiting rows (a
# skip scan of jobs_claim: one descent per queue), running rows (jobs_running), rows in
# the recorder's samples of the last day (a skip scan of their primary key), pauses and
# live processes. (The Jobs page took them from the Queues page's reads: 650 ms at 3 M.)
QUEUE_NAMES = """
WITH RECURSIVE waiting(queue) AS (
    (SELECT queue FROM job_queue WHERE status IN ('pending', 'retryable') ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM job_queue j WHERE j.status IN ('pending', 'retryable') AND j.queue > w.queue
             ORDER BY j.queue LIMIT 1)
      FROM waiting w WHERE w.queue IS NOT NULL
), sampled(queue) AS (
    (SELECT queue FROM queue_samples ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT s.queue FROM queue_samples s WHERE s.queue > p.queue ORDER BY s.queue LIMIT 1)
      FROM sampled p WHERE p.queue IS NOT NULL
)
SELECT queue FROM waiting WHERE queue IS NOT NULL
UNION SELECT queue FROM sampled WHERE queue IS NOT NULL
UNION SELECT queue FROM jobs_live WHERE status = 'running'
UNION SELECT queue FROM queue_pauses
UNION SELECT unnest(queues) FROM workers WHERE stopped_at IS NULL
ORDER BY 1
"""

CAPACITY = "SELECT * FROM v_queue_capacity ORDER BY queue"
