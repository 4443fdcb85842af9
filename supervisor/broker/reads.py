"""The operator's and the dashboard's reads of ``jobs`` and ``job_events``.

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
    # a value at a path inside the arguments (jobsearch.Match): a text[] path for #>
    "match_args": "args #> %(match_args)s::text[] = %(match_value)s::jsonb",
    "match_kwargs": "kwargs #> %(match_kwargs)s::text[] = %(match_value)s::jsonb",
}
# Filters an index serves (jobs_created_id, the primary key): a search's window of the
# newest rows is read through them; every other filter is checked on the window's rows.
WINDOW_FILTERS = frozenset({"created_after", "created_before", "id_lo"})
AFTER = "(created_at, id) < (%(after_at)s, %(after_id)s::uuid)"

LIST_COLUMNS = f"""id, queue, actor, status, priority, attempts, max_attempts, run_at, created_at, started_at,
       finished_at, lease_owner, progress, dedupe_key, concurrency_key, {_ERROR_LINE.format(width=200)}"""
PAGE_COLUMNS = f"""id, queue, actor, status, attempts, max_attempts, created_at, started_at, finished_at,
       {_ERROR_LINE.format(width=120)}, progress, dedupe_key, concurrency_key"""


def where(names: frozenset[str], *, after: bool = False) -> str:
    """The conjunction of the named filters' fragments (and the cursor's), or TRUE."""
    parts = [FILTERS[n] for n in FILTERS if n in names] + ([AFTER] if after else [])
    return "\n   AND ".join(parts) or "TRUE"


@functools.cache
def jobs_page(columns: str, names: frozenset[str], after: bool) -> str:
    """Newest first; the next page starts after the (created_at, id) of the last row seen."""
    return f"""
SELECT {columns}
  FROM jobs
 WHERE {where(names, after=after)}
 ORDER BY created_at DESC, id DESC
 LIMIT %(limit)s"""


def _window(names: frozenset[str], after: bool) -> str:
    """The newest %(scan_rows)s jobs (after the cursor) within the index-served filters."""
    return f"""(SELECT * FROM jobs
         WHERE {where(names & WINDOW_FILTERS, after=after)}
         ORDER BY created_at DESC, id DESC
         LIMIT %(scan_rows)s) AS w"""


@functools.cache
def window_page(columns: str, names: frozenset[str], after: bool) -> str:
    """A search no index serves: its matches among a window of the newest jobs only, so a
    page reads at most %(scan_rows)s rows however rare the match (read lazily: it stops at
    %(limit)s matches)."""
    return f"""
SELECT {columns}
  FROM {_window(names, after)}
 WHERE {where(names - WINDOW_FILTERS)}
 ORDER BY created_at DESC, id DESC
 LIMIT %(limit)s"""


@functools.cache
def window_edge(names: frozenset[str], after: bool) -> str:
    """The last row of the window and the first after it: with both, older rows were left unread."""
    return f"""
SELECT created_at, id::text FROM jobs
 WHERE {where(names & WINDOW_FILTERS, after=after)}
 ORDER BY created_at DESC, id DESC
 OFFSET %(scan_rows)s - 1 LIMIT 2"""


@functools.cache
def window_count(names: frozenset[str]) -> str:
    return f"SELECT count(*) FROM {_window(names, False)} WHERE {where(names - WINDOW_FILTERS)}"


@functools.cache
def matching_ids(names: frozenset[str], window: bool) -> str:
    """Ids of the jobs a bulk action covers, oldest first (a search: within its window)."""
    source = _window(names, False) if window else "jobs"
    rest = names - WINDOW_FILTERS if window else names
    return f"SELECT id::text FROM {source} WHERE {where(rest)} ORDER BY created_at, id LIMIT %(limit)s"


# An exact count stops at the threshold; past it the planner's estimate stands in.
@functools.cache
def count_upto(names: frozenset[str]) -> str:
    return f"SELECT count(*) FROM (SELECT 1 FROM jobs WHERE {where(names)} LIMIT %(upto)s) AS m"


@functools.cache
def count_plan(names: frozenset[str]) -> str:
    return f"EXPLAIN (FORMAT JSON) SELECT 1 FROM jobs WHERE {where(names)}"


# --- the dashboard's reads: only indexed slices (live rows, rows finished lately) ---

# Jobs finished per time bucket over the last window_s seconds, from the rows (the
# dashboard reads the recorder's rollup for windows longer than an hour).
FINISHED_PER_BUCKET = """
SELECT date_bin(%(step_s)s * interval '1 second', finished_at, timestamptz 'epoch') AS t,
       count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE status = 'failed')    AS failed
  FROM jobs
 WHERE status IN ('succeeded', 'failed', 'cancelled') AND finished_at > now() - %(window_s)s * interval '1 second'
 GROUP BY 1 ORDER BY 1
"""

# How long an attempt waited to start: from when it could run (enqueued, or due: run_at,
# which a retry, a lease loss and a requeue move) to when it began running in a thread
# (started_at, the attempt's own). In seconds, never below 0; NULL for a job that never
# ran (greatest() alone would make that a wait of 0: it skips NULLs).
_WAIT_S = """CASE WHEN started_at IS NOT NULL
            THEN greatest(extract(epoch FROM started_at - greatest(created_at, run_at))::float8, 0) END"""
WAIT_S = _WAIT_S  # for the other modules of reads (actor_reads)

# The start waits of jobs finished in the last window (a running attempt's start is
# written with its outcome, so only finished ones are known).
START_LATENCY = f"""
SELECT count(*) AS n,
       percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY {_WAIT_S}) AS pct
  FROM jobs
 WHERE status IN ('succeeded', 'failed') AND finished_at > now() - %(window_s)s * interval '1 second'
   AND started_at IS NOT NULL
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

# Failed rows kept, per queue (retention prunes them; the jobs_finished index holds them).
FAILED_BY_QUEUE = "SELECT queue, count(*) AS failed FROM jobs WHERE status = 'failed' GROUP BY queue"

# Per queue over the last hour of finished rows: outcomes, durations (the last
# attempt's run time; rows that never ran have none), the processes that finished
# them (for throughput per worker-hour) and the start waits, p50 / p95 / p99, in
# seconds rounded to the millisecond. An attempt's wait is not its duration.
FINISHED_BY_QUEUE = f"""
SELECT queue,
       count(*) FILTER (WHERE status = 'failed')                 AS failed_1h,
       count(*) FILTER (WHERE status IN ('succeeded', 'failed')) AS finished_1h,
       avg(dur_s) FILTER (WHERE status = 'succeeded')            AS avg_s,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY dur_s) FILTER (WHERE status = 'succeeded') AS p95_s,
       count(DISTINCT lease_owner) FILTER (WHERE status IN ('succeeded', 'failed')) AS owners_1h,
       round(percentile_cont(0.5) WITHIN GROUP (ORDER BY wait_s)::numeric, 3)::float8 AS wait_p50_s,
       round(percentile_cont(0.95) WITHIN GROUP (ORDER BY wait_s)::numeric, 3)::float8 AS wait_p95_s,
       round(percentile_cont(0.99) WITHIN GROUP (ORDER BY wait_s)::numeric, 3)::float8 AS wait_p99_s
  FROM (SELECT queue, status, lease_owner,
               extract(epoch FROM finished_at - started_at)::float8 AS dur_s,
               CASE WHEN status IN ('succeeded', 'failed') THEN {_WAIT_S} END AS wait_s
          FROM jobs
         WHERE status IN ('succeeded', 'failed', 'cancelled') AND finished_at > now() - interval '1 hour') AS f
 GROUP BY queue
"""


COUNT_BY_QUEUE_AND_STATUS = "SELECT queue, status, count(*) FROM jobs GROUP BY queue, status"

CAPACITY = "SELECT * FROM v_queue_capacity ORDER BY queue"
