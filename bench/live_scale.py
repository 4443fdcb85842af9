"""The statements on live rows at scale, with millions of finished rows beside a few
live ones: the reaper, the release of a process's jobs, the ack and the heartbeat (the
workers'), and the reads of live rows per queue (/metrics, the dashboard, the CLI).

    python bench/live_scale.py [--finished 2000000] [--running 32] [--runs 9] [--database-url URL]

Fills a fresh database with --finished 'succeeded' rows, 100 failed ones, --running
running rows of 4 owners (claimed now, leases expiring in 30 s) and 1,000 pending ones,
VACUUM ANALYZE,
then times each statement --runs times (each in a transaction rolled back, so every run
sees the same rows) and prints the median and the scans of its plan. Every worker runs
the reaper every lease / 2; the master runs the release for each process that ends;
/metrics reads v_queue_capacity at each scrape and the dashboard's recorder samples the
queues every 10 s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Figure, bench_database, code_state, print_table, say, server_url
from supervisor import db
from supervisor.broker import reads, sql
from supervisor.broker.consuming.completer import Finish, finish_params
from supervisor.broker.consuming.leases import reap_params
from supervisor.http.dashboard import recorder

BUDGET = {"who": "lease-scale", "why": "bench", "default_max_losses": 3}


def fill(conn: psycopg.Connection, finished: int, running: int) -> None:
    t0 = time.monotonic()
    conn.execute("INSERT INTO jobs (queue, actor, max_attempts, status, finished_at) SELECT 'q', 'noop', 1, "
                 "'succeeded', now() - interval '1 hour' FROM generate_series(1, %s)", (finished,))
    conn.execute("INSERT INTO jobs (queue, actor, max_attempts, status, lease_owner, lease_expires_at, claimed_at, "
                 "attempts) SELECT 'q', 'noop', 1, 'running', 'owner' || (g %% 4), now() + interval '30 s', now(), 1 "
                 "FROM generate_series(1, %s) g", (running,))
    conn.execute("INSERT INTO jobs (queue, actor, max_attempts, status, finished_at) SELECT 'q', 'noop', 1, "
                 "'failed', now() - interval '1 hour' FROM generate_series(1, 100)")
    conn.execute("INSERT INTO jobs (queue, actor, max_attempts) SELECT 'q', 'noop', 1 FROM generate_series(1, 1000)")
    conn.execute("VACUUM ANALYZE jobs")
    say(f"filled: {finished:,} succeeded, 100 failed, {running} running, 1,000 pending "
        f"({time.monotonic() - t0:.0f}s)")


def timed(conn: psycopg.Connection, statement: str, params: dict, runs: int) -> tuple[list[float], str]:
    """Run times in ms (each run rolled back), and the plan's scans."""
    times = []
    for _ in range(runs):
        with conn.transaction(force_rollback=True):
            t0 = time.perf_counter()
            conn.execute(statement, params)
            times.append((time.perf_counter() - t0) * 1000)
    plan = [r[0].strip().removeprefix("->  ") for r in conn.execute("EXPLAIN " + statement, params)]
    scans = "; ".join(line.split("  (")[0] for line in plan if " Scan " in f" {line}" and "CTE Scan" not in line)
    return times, scans


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--finished", type=int, default=2_000_000)
    p.add_argument("--running", type=int, default=32)
    p.add_argument("--runs", type=int, default=9)
    p.add_argument("--database-url", default=None)
    args = p.parse_args(argv)
    figures: list[Figure] = []
    with bench_database(server_url(args.database_url)) as url, psycopg.connect(url, autocommit=True) as conn:
        say(code_state())
        fill(conn, args.finished, args.running)
        ids = [str(r[0]) for r in conn.execute("SELECT id FROM jobs WHERE lease_owner = 'owner1'")]
        statements = {
            "reap expired leases": (sql.REAP_EXPIRED, reap_params("bench", margin_s=1.0)),
            "release an owner's jobs": (sql.RELEASE_OWNER, {**BUDGET, "owner": "owner1"}),
            "ack a batch": (sql.FINISH, finish_params("owner1", [Finish(i, 1, "succeeded") for i in ids])),
            "heartbeat": (sql.HEARTBEAT, {"ids": db.array_text(ids), "owner": "owner1", "lease_s": 30.0}),
            "live rows per queue": (reads.LIVE_BY_QUEUE, {}),
            "v_queue_capacity (/metrics)": (reads.CAPACITY, {}),
            "queue sample (dashboard)": (recorder.SAMPLE_QUEUES, {"step_s": recorder.SAMPLE_SECONDS}),
            "live rows of a queue (join)": (sql.LIVE_IN_QUEUE, {"queue": "q"}),
            "failed rows per queue (dashboard)": (reads.FAILED_BY_QUEUE, {}),
        }
        for name, (statement, params) in statements.items():
            times, scans = timed(conn, statement, params, args.runs)
            say(f"{name}: median {statistics.median(times):.2f} ms; reads: {scans}")
            figures.append(Figure(name, "ms", tuple(times), higher_is_better=False,
                                  config=f"{args.finished:,} finished"))
    say("")
    print_table(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
