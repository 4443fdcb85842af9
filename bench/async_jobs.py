"""Async actors on the own executor (issue 24, item 3): 1,000 jobs that each
``await asyncio.sleep(1)``, on one `supervisor worker` process of 4 threads.

    python bench/async_jobs.py [--jobs 1000] [--seconds 1] [--threads 4] [--limits 100,500,1000] [--runs 3]

For each async_limit: the seconds from the insert of the jobs (one statement, committed)
to the last one succeeded (target, at a limit that lets them all run at once: <= 3 s),
and how many ran at once at most (from the rows' started_at / finished_at). The ideal is
ceil(jobs / limit) x seconds. A warm-up batch runs first in each process.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    LIVE,
    Figure,
    WorkerPool,
    bench_database,
    code_state,
    print_table,
    reset,
    say,
    server_url,
    wait_until,
)

QUEUE = "async"
ACTORS = "bench.async_actors"
INSERT = ("INSERT INTO jobs (queue, actor, args, max_attempts) SELECT %(queue)s, 'asleep',"
          " jsonb_build_array(%(seconds)s::float), 1 FROM generate_series(1, %(jobs)s)")
# At a job's start, the jobs that had started and not yet finished: the most at once. A
# running sum over the starts (+1) and finishes (-1), a finish first at the same instant;
# the jobs view read once (a count per job, re-reading the view, took 10 s for 50 jobs).
OVERLAP = """
WITH r AS (SELECT started_at, finished_at FROM jobs WHERE started_at IS NOT NULL),
     e AS (SELECT started_at AS at, 1 AS d FROM r UNION ALL SELECT finished_at, -1 FROM r WHERE finished_at IS NOT NULL)
SELECT max(n) FROM (SELECT sum(d) OVER (ORDER BY at, d) AS n FROM e) s"""


def one_run(conn: psycopg.Connection, jobs: int, seconds: float) -> tuple[float, int]:
    conn.execute("TRUNCATE job_queue, job_history, job_events")
    conn.execute(INSERT, {"queue": QUEUE, "seconds": seconds, "jobs": jobs})
    sent = time.monotonic()
    done = wait_until(lambda: conn.execute(LIVE).fetchone()[0] == 0, 120, interval=0.01, what="the drain")
    failed = conn.execute("SELECT count(*) FROM jobs WHERE status <> 'succeeded'").fetchone()[0]
    if failed:
        say(f"  warning: {failed} jobs did not succeed")
    return done - sent, int(conn.execute(OVERLAP).fetchone()[0] or 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--limits", default="100,500,1000")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--database-url", help="the server (default $DATABASE_URL, else the local one)")
    args = parser.parse_args()
    say(code_state())
    figures: list[Figure] = []
    with bench_database(server_url(args.database_url)) as url, psycopg.connect(url, autocommit=True) as conn:
        for limit in (int(x) for x in args.limits.split(",")):
            reset(conn)
            pool = WorkerPool(url, count=1, threads=args.threads, queues=QUEUE, actors=ACTORS,
                              extra=("--async-limit", str(limit)))
            took: list[float] = []
            most: list[float] = []
            with pool:
                one_run(conn, 20, 0.01)  # warm-up: imports, prepared statements, the loop
                for _ in range(args.runs):
                    seconds, overlap = one_run(conn, args.jobs, args.seconds)
                    took.append(seconds)
                    most.append(overlap)
                    say(f"  async_limit {limit}: {args.jobs} jobs of {args.seconds:g} s in {seconds:.2f} s,"
                        f" at most {overlap} at once")
            config = f"1 x {args.threads} threads, async_limit {limit}"
            ideal = math.ceil(args.jobs / limit) * args.seconds
            all_at_once = limit >= args.jobs
            figures.append(Figure(f"{args.jobs} async jobs of {args.seconds:g} s", "s", tuple(took),
                                  higher_is_better=False, target=3.0 if all_at_once else None,
                                  config=f"{config} (ideal {ideal:g} s)"))
            figures.append(Figure("most at once", "jobs", tuple(most), config=config))
    print_table(figures)


if __name__ == "__main__":
    main()
