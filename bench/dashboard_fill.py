"""The fill of ``dashboard_scale.py``: --rows finished jobs over --days of history days,
--live live ones, their failed attempts' events, a day of the recorder's rollup.

Written straight into the tables (``INSERT ... SELECT generate_series``), never through
the ``jobs`` view (its trigger is a row at a time): the days' partitions first
(``job_history_add_day``), then each chunk of rows lands in the day it finished on.
Ids are ``md5`` of the row number, so the events of a failed job are written from the
same numbers without reading the history back.

What is made (g: the row number, newest last):
  history   finished evenly over the last --days; 10 % failed (3 attempts, a traceback,
            3 job_events: 2 retried, 1 failed), 1 % cancelled, the rest succeeded (1 in 50
            of those after a retried attempt: 1 job_event); 20 actors, each of one of the
            queues default / mail / reports / images, and 1 in 10,000 in the queue `rare`;
            3 error groups per actor; a dedupe key on 1 in 50, a concurrency key on 1 in 7;
            and one failure of a rare group (report_monthly) six days ago
  live      created over the last 30 minutes: 200 running, 5 % retryable, 10 % delayed by an
            hour, the rest pending and due
  rollup    queue_samples of the last 25 h at the fill's rate, as the recorder leaves them
  workers   8 live worker processes serving every queue
  log       with log_share: that share of the finished jobs in job_log and job_done (the
            default storage's tables) instead of job_history
  workflow  one of WORKFLOW_STEPS steps (a root, the rest in parallel, a join) written
            straight into workflows and workflow_steps, the first 60 parallel ones the
            live jobs' (enqueued), for the Workflows page
"""

from __future__ import annotations

if __name__ == "__main__":  # imported by the scripts as bench.<name>; nothing to run
    raise SystemExit(f"{__file__}: a module the scripts in bench/ import, not a script (bench/README.md lists them)")

import time
import uuid

import psycopg

from bench.common import say
from supervisor.broker.sql import joblog
from supervisor.http.dashboard import recorder

CHUNK = 500_000
QUEUES = ("default", "mail", "reports", "images")
ERRORS = (("ValueError", "tasks.py:charge"), ("KeyError", "tasks.py:lookup"), ("TimeoutError", "tasks.py:fetch"))

# One row number's columns, shared by the history and the events.
_ROWS = """
  FROM (SELECT g, now() - %(days)s * interval '1 day' + g * (%(days)s * interval '1 day' / %(rows)s) AS t,
               CASE WHEN g %% 10 = 0 THEN 'failed' WHEN g %% 100 = 5 THEN 'cancelled' ELSE 'succeeded' END AS status,
               CASE WHEN g %% 10000 = 3 THEN 'rare' ELSE (%(queues)s::text[])[1 + g / 10 %% 4] END AS queue,
               g / 10 %% 20 AS actor,
               (%(types)s::text[])[1 + g / 200 %% 3] AS error_type, (%(wheres)s::text[])[1 + g / 200 %% 3] AS error_where
          FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g) AS s"""

HISTORY = """
INSERT INTO job_history (id, queue, actor, args, kwargs, options, status, priority, run_at, attempts, max_attempts,
                         lease_owner, claimed_at, dedupe_key, concurrency_key, last_error, created_at, started_at,
                         finished_at, lease_losses)
SELECT md5('h' || g)::uuid, queue, 'actor_' || actor, jsonb_build_array(g, 'item-' || g),
       jsonb_build_object('user_id', g %% 1000), '{}', status, 0, t - interval '300 ms',
       CASE status WHEN 'failed' THEN 3 WHEN 'cancelled' THEN 0 ELSE 1 END, 3,
       CASE WHEN status <> 'cancelled' THEN 'bench-' || (g %% 8) END,
       CASE WHEN status <> 'cancelled' THEN t - interval '60 ms' END,
       CASE WHEN g %% 50 = 0 THEN 'order-' || g END, CASE WHEN g %% 7 = 0 THEN 'user-' || (g %% 1000) END,
       CASE WHEN status = 'failed' THEN format(E'Traceback (most recent call last):\\n'
            '  File "/srv/app/%%s", line %%s, in %%s\\n    raise %%s(...)\\n%%s: item-%%s went wrong',
            split_part(error_where, ':', 1), 10 + g %% 90, split_part(error_where, ':', 2), error_type, error_type, g) END,
       t - interval '300 ms', CASE WHEN status <> 'cancelled' THEN t - interval '50 ms' END, t, 0
""" + _ROWS

# A failed job's three attempts (two retried a second apart, the last failed for good);
# one in 50 succeeded jobs after one retried attempt.
EVENTS = """
INSERT INTO job_events (job_id, at, who, from_status, to_status, actor, error_type, error_where)
SELECT md5('h' || g)::uuid, t - k * interval '1 second', 'bench-' || (g %% 8), 'running',
       CASE WHEN k = 0 AND status = 'failed' THEN 'failed' ELSE 'retryable' END,
       'actor_' || actor, error_type, error_where
""" + _ROWS + """
 CROSS JOIN LATERAL generate_series(CASE status WHEN 'failed' THEN 0 ELSE 1 END,
                                    CASE status WHEN 'failed' THEN 2 ELSE 1 END) AS k
 WHERE status = 'failed' OR (status = 'succeeded' AND g %% 50 = 1)
"""

LIVE = """
INSERT INTO job_queue (id, queue, actor, args, kwargs, status, run_at, attempts, max_attempts, lease_owner,
                       claimed_at, heartbeat_at, lease_expires_at, created_at, started_at)
SELECT md5('l' || g)::uuid, (%(queues)s::text[])[1 + g %% 4], 'actor_' || (g %% 20),
       jsonb_build_array(g, 'live-' || g), '{}', status,
       CASE WHEN g %% 10 = 1 THEN now() + interval '1 hour' ELSE t END,
       CASE WHEN status = 'pending' THEN 0 ELSE 1 END, 3,
       CASE WHEN status = 'running' THEN 'bench-' || (g %% 8) END,
       CASE WHEN status = 'running' THEN now() END, CASE WHEN status = 'running' THEN now() END,
       CASE WHEN status = 'running' THEN now() + interval '30 s' END, t,
       CASE WHEN status = 'running' THEN now() END
  FROM (SELECT g, now() - interval '30 minutes' + g * (interval '30 minutes' / %(live)s) AS t,
               CASE WHEN g <= 200 THEN 'running' WHEN g %% 20 = 2 THEN 'retryable' ELSE 'pending' END AS status
          FROM generate_series(1, %(live)s) AS g) AS s
"""

# What the recorder leaves: a row per queue and 10 s period, with the period's finished jobs.
ROLLUP = """
INSERT INTO queue_samples (at, queue, ready, scheduled, running, retryable, succeeded, failed)
SELECT date_bin(%(step_s)s * interval '1 second', now() - p * %(step_s)s * interval '1 second', timestamptz 'epoch'),
       q, %(live)s / 5, %(live)s / 40, 50, %(live)s / 80,
       -- whole numbers that add up to the fill's rate (a fraction of a job a period rounded to 0)
       floor((p + 1) * %(per_step)s * 0.89) - floor(p * %(per_step)s * 0.89),
       floor((p + 1) * %(per_step)s * 0.1) - floor(p * %(per_step)s * 0.1)
  FROM generate_series(0, %(keep_s)s / %(step_s)s - 1) AS p, unnest(%(queues)s::text[]) AS q
ON CONFLICT DO NOTHING
"""

# One failure of its own kind six days ago: a rare group, whose sample must be found by
# the group's index, not by reading the week's events before it.
RARE = """
WITH j AS (
    INSERT INTO job_history (id, queue, actor, status, attempts, max_attempts, last_error, created_at, started_at,
                             finished_at, lease_owner)
    VALUES (md5('rare')::uuid, 'reports', 'report_monthly', 'failed', 1, 1,
            E'Traceback (most recent call last):\n  File "/srv/app/reports.py", line 7, in monthly\n'
            '    raise LookupError(...)\nLookupError: no ledger for 1999-12',
            now() - interval '6 days 1 minute', now() - interval '6 days 1 minute', now() - interval '6 days', 'bench-0')
    RETURNING id, finished_at
)
INSERT INTO job_events (job_id, at, who, from_status, to_status, actor, error_type, error_where)
SELECT id, finished_at, 'bench-0', 'running', 'failed', 'report_monthly', 'LookupError', 'reports.py:monthly' FROM j
"""

WORKERS = """
INSERT INTO workers (id, host, pid, role, queues, started_at, heartbeat_at, state, capacity, jobs_in_flight)
SELECT 'bench-' || w, 'bench-host', 1000 + w, 'default', %(queues)s::text[], now() - interval '1 hour', now(),
       'running', 32, 25
  FROM generate_series(0, 7) AS w
"""


# --log-share: that share of the finished (succeeded and failed) jobs moved from job_history
# into the job log's tables, as the default storage keeps a plain job that ran: its job_log
# row and its final job_done row, on the day it was created; each level's cursor then past
# them (no log row pending). Their events stay as they are. Each table is written in the
# order the product writes it: log rows as jobs are sent, done rows as they finish. A log
# row's producer transaction (tx) is one of 100 rows each, all ended before the cursors'
# snapshots (%(below)s: their xmin), so the planner sees as many transactions as a
# producer sending batches makes (one tx for every row priced each one's rows as the log).
LOG_SHARE = """
WITH moved AS (
    DELETE FROM job_history h
     WHERE h.status IN ('succeeded', 'failed') AND abs(hashtext(h.id::text) %% 10000) < %(share)s * 10000
    RETURNING h.*
), logged AS (
    INSERT INTO job_log (seq, day, tx, id, queue, actor, args, kwargs, options, priority, attempts, max_attempts,
                         created_at)
    SELECT nextval('job_log_seq'), (m.created_at AT TIME ZONE 'UTC')::date,
           greatest(3, %(below)s - 1 - (count(*) OVER () - row_number() OVER (ORDER BY m.created_at)) / 100)::text::xid8,
           m.id, m.queue, m.actor, m.args, m.kwargs, m.options, m.priority, m.attempts - 1, m.max_attempts, m.created_at
      FROM moved m
     ORDER BY m.created_at
    RETURNING seq, day, id
)
INSERT INTO job_done (seq, day, id, queue, actor, status, attempt, owner, created_at, claimed_at, started_at,
                      finished_at, last_error)
SELECT l.seq, l.day, m.id, m.queue, m.actor, m.status, m.attempts, m.lease_owner, m.created_at, m.claimed_at,
       m.started_at, m.finished_at, m.last_error
  FROM logged l JOIN moved m ON m.id = l.id
 ORDER BY m.finished_at  -- as done rows arrive: in finish order (job_done_finished, a block range index, relies on it)
"""
LOG_CURSORS = """
INSERT INTO job_cursor (queue, priority, lo, hi, at_tx, at_seq, drained)
SELECT q.queue, q.priority, pg_current_snapshot(), pg_current_snapshot(), '0', 0, true
  FROM (SELECT DISTINCT queue, priority FROM job_log) AS q
"""


def fill(conn: psycopg.Connection, *, rows: int, live: int, days: int, log_share: float = 0.0) -> None:
    """Fill an empty, migrated database (autocommit connection)."""
    t0 = time.perf_counter()
    conn.execute("SET synchronous_commit = off")  # a fill: losing its last moments on a crash is fine
    for status in ("succeeded", "failed", "cancelled"):
        for d in range(-days - 1, 3):
            conn.execute("SELECT job_history_add_day(%s, current_date + %s)", (status, d))
    params = {"rows": rows, "days": days, "queues": list(QUEUES), "types": [t for t, _ in ERRORS],
              "wheres": [w for _, w in ERRORS]}
    for lo in range(1, rows + 1, CHUNK):
        chunk = {**params, "lo": lo, "hi": min(lo + CHUNK - 1, rows)}
        conn.execute(HISTORY, chunk)
        conn.execute(EVENTS, chunk)
        say(f"  {chunk['hi']:,} of {rows:,} finished jobs ({time.perf_counter() - t0:.0f}s)")
    conn.execute(RARE)
    if log_share:
        for d in range(-days - 1, 3):
            conn.execute("SELECT job_log_add_day(current_date + %s)", (d,))
        below = conn.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint").fetchone()
        conn.execute(LOG_SHARE, {"share": log_share, "below": below[0] if below else 3})
        conn.execute(LOG_CURSORS)
    conn.execute(LIVE, {"live": live, "queues": list(QUEUES)})
    fill_workflow(conn)
    sampled = [*QUEUES, "rare"]
    per_step = rows / (days * 86400) * recorder.SAMPLE_SECONDS / len(sampled)
    conn.execute(ROLLUP, {"step_s": recorder.SAMPLE_SECONDS, "keep_s": recorder.KEEP_HOURS * 3600, "live": live,
                          "per_step": per_step, "queues": sampled})
    conn.execute(WORKERS, {"queues": [*QUEUES, "rare"]})
    for table in ("job_history", "job_queue", "job_events", "queue_samples", "workers", "job_log", "job_done",
                  "job_cursor"):
        conn.execute(f"VACUUM ANALYZE {table}")
    conn.execute(joblog.LOG_SUMMARIZE_DONE)  # as the upkeep's prune leaves job_done's days
    say(f"{rows:,} finished and {live:,} live jobs in {time.perf_counter() - t0:.0f}s")


WORKFLOW_STEPS = 2_000
WORKFLOW = "INSERT INTO workflows (id, name, policy, steps) VALUES (%(id)s, 'fill-fan', 'continue', %(steps)s)"
WORKFLOW_STEP_ROWS = """
INSERT INTO workflow_steps (id, workflow, position, parents, children, remaining, state, to_log, queue, actor, args,
                            kwargs, options, enqueued_at)
SELECT m.id, %(id)s, m.pos, m.parents::uuid[], m.children::uuid[], 0, m.state, false, 'default', 'actor_1', '[]',
       '{}', '{}', CASE WHEN m.state <> 'blocked' THEN now() END
  FROM unnest(%(ids)s::uuid[], %(pos)s::int[], %(parents)s::text[], %(children)s::text[], %(states)s::text[])
       AS m(id, pos, parents, children, state)
"""


def fill_workflow(conn: psycopg.Connection) -> None:
    """One wide workflow (a root, WORKFLOW_STEPS - 2 in parallel, a join); steps written as
    rows, not run (the workflows' triggers fire on updates only)."""
    live = [r[0] for r in conn.execute("SELECT id FROM job_queue ORDER BY id LIMIT 60")]
    root, join = uuid.uuid4(), uuid.uuid4()
    mids = [*live, *(uuid.uuid4() for _ in range(WORKFLOW_STEPS - 2 - len(live)))]
    ids = [root, *mids, join]
    wid = uuid.uuid4()
    conn.execute(WORKFLOW, {"id": wid, "steps": len(ids)})
    conn.execute(WORKFLOW_STEP_ROWS, {
        "id": wid, "ids": ids, "pos": list(range(len(ids))),
        "parents": ["{}", *([f"{{{root}}}"] * len(mids)), "{" + ",".join(map(str, mids)) + "}"],
        "children": ["{" + ",".join(map(str, mids)) + "}", *([f"{{{join}}}"] * len(mids)), "{}"],
        "states": ["succeeded", *("enqueued" if i < len(live) else "succeeded" for i in range(len(mids))), "blocked"]})
