"""The dashboard's reads at scale: a jobs table of --rows rows (default 1,000,000).

    python bench/dashboard_scale.py [--rows 1000000] [--runs 20] [--database-url URL]

Fills a fresh database with finished jobs spread over the last 2 days (10 % failed)
plus 1 % live ones, and a day of the recorder's rollup rows for 4 queues, then prints the median and worst time of each statement the
dashboard's pages run: the Jobs page (first page, the 100th page by cursor, a
status filter, a text filter, the count with its threshold; finding a job by id, id prefix,
a value inside its arguments or a dedupe key), the Queues page and the
Overview's 24 h charts. Prints only; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_database, code_state, say, server_url  # noqa: E402
from supervisor import admin, jobsearch  # noqa: E402
from supervisor.broker import reads  # noqa: E402
from supervisor.http.dashboard import gather, recorder  # noqa: E402

CHUNK = 250_000

INSERT = """
INSERT INTO jobs (queue, actor, status, attempts, max_attempts, args, run_at, created_at, started_at,
                  finished_at, lease_owner, last_error)
SELECT 'q' || (g %% 4), 'actor_' || (g %% 20),
       CASE WHEN g %% 100 = 0 THEN 'pending' WHEN g %% 10 = 0 THEN 'failed' ELSE 'succeeded' END,
       1, 1, jsonb_build_array(g, 'item-' || g), t, t,
       CASE WHEN g %% 100 = 0 THEN NULL ELSE t + interval '20 ms' END,
       CASE WHEN g %% 100 = 0 THEN NULL ELSE t + interval '70 ms' END,
       CASE WHEN g %% 100 = 0 THEN NULL ELSE 'bench-' || (g %% 8) END,
       CASE WHEN g %% 10 = 0 AND g %% 100 <> 0 THEN 'RuntimeError: planned' END
  FROM (SELECT g, now() - interval '2 days' + g * (interval '2 days' / %(rows)s) AS t
          FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g) AS s
"""


ROLLUP = """
INSERT INTO queue_samples (at, queue, ready, scheduled, running, retryable, succeeded, failed)
SELECT date_bin(%(step_s)s * interval '1 second', now() - p * %(step_s)s * interval '1 second', timestamptz 'epoch'),
       'q' || q, 0, 0, 0, 0, 50, 5
  FROM generate_series(0, 86400 / %(step_s)s - 1) AS p, generate_series(0, 3) AS q
"""


def timed(conn: psycopg.Connection, runs: int, fn: Any) -> tuple[float, float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn(conn)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), max(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--database-url")
    args = ap.parse_args()
    say(code_state())
    with bench_database(server_url(args.database_url), prefix="as_dash") as url, \
            psycopg.connect(url, autocommit=True) as conn:
        t0 = time.perf_counter()
        for lo in range(1, args.rows + 1, CHUNK):
            conn.execute(INSERT, {"rows": args.rows, "lo": lo, "hi": min(lo + CHUNK - 1, args.rows)})
        conn.execute(ROLLUP, {"step_s": recorder.SAMPLE_SECONDS})  # a day of rollup rows, as the recorder leaves
        conn.execute("VACUUM ANALYZE jobs")
        conn.execute("VACUUM ANALYZE queue_samples")
        say(f"{args.rows:,} jobs in {time.perf_counter() - t0:.1f}s")

        def page(where: admin.JobFilter, after: tuple[Any, Any] | None = None) -> admin.JobsPage:
            return admin.jobs_page(conn, where, limit=gather.PAGE_SIZE, after=after,
                                   columns=reads.PAGE_COLUMNS)

        cursor: tuple[Any, Any] | None = None
        for _ in range(99):  # walk to the 100th page once; then time that page
            cursor = page(admin.JobFilter(), cursor).after
        deep = cursor
        some_id = str(conn.execute("SELECT id FROM jobs WHERE created_at < now() - interval '1 day' LIMIT 1").fetchone()[0])

        def search(**fields: str) -> admin.JobFilter:
            return admin.JobFilter(search=jobsearch.Search.parse(fields))
        cases: list[tuple[str, Any]] = [
            ("jobs: first page", lambda c: page(admin.JobFilter())),
            ("jobs: 100th page (cursor)", lambda c: page(admin.JobFilter(), deep)),
            ("jobs: status=failed page", lambda c: page(admin.JobFilter(status="failed"))),
            ("jobs: text filter page", lambda c: page(admin.JobFilter(text="item-4242"))),
            ("jobs: count, no filter", lambda c: gather.count_jobs(c, admin.JobFilter())),
            ("jobs: count, status=failed", lambda c: gather.count_jobs(c, admin.JobFilter(status="failed"))),
            ("find: whole id", lambda c: page(search(id=some_id))),
            ("find: id prefix (6 digits)", lambda c: page(search(id=some_id[:6]))),
            ("find: id prefix, count", lambda c: gather.count_jobs(c, search(id=some_id[:6]))),
            ("find: match, a day old (window)", lambda c: page(search(match="args[1] = item-42"))),
            ("find: match, one recent hit", lambda c: page(search(match=f"args[0] = {args.rows - 7}"))),
            ("find: match, count (window)", lambda c: gather.count_jobs(c, search(match="args[1] = item-42"))),
            ("find: dedupe key (window)", lambda c: page(search(dedupe_key="order-1"))),
            ("queues: live rows", lambda c: c.execute(reads.LIVE_BY_QUEUE).fetchall()),
            ("queues: finished 1 h", lambda c: c.execute(reads.FINISHED_BY_QUEUE).fetchall()),
            ("queues: failed kept", lambda c: c.execute(reads.FAILED_BY_QUEUE).fetchall()),
            ("queues: 6 h / 24 h rollup", lambda c: c.execute(recorder.OUTCOMES_BY_QUEUE).fetchall()),
            ("overview: finished per bucket 1 h (rows)",
             lambda c: c.execute(reads.FINISHED_PER_BUCKET, {"step_s": 60, "window_s": 3600}).fetchall()),
            ("overview: finished per bucket 24 h (rollup)",
             lambda c: c.execute(recorder.FINISHED_SERIES, {"step_s": 900, "window_s": 86400}).fetchall()),
            ("overview: start latency 1 h", lambda c: c.execute(reads.START_LATENCY, {"window_s": 3600}).fetchall()),
        ]
        print(f"\n{'statement':<38} {'median ms':>10} {'max ms':>10}")
        for name, fn in cases:
            med, worst = timed(conn, args.runs, fn)
            print(f"{name:<38} {med:>10.1f} {worst:>10.1f}")


if __name__ == "__main__":
    main()
