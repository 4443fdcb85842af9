"""Delayed and retried jobs on idle workers: how long after its due time a job starts.

    python bench/bench_delay.py [--jobs 200] [--delay-ms 100] [--interval-ms 20] [--pin] [--database-url URL]

D1  jobs sent with ``send_with_options(delay=...)``, ``--interval-ms`` apart.
D2  jobs that raise ``Retry(delay=...)`` once, sent ``--interval-ms`` apart.

Two idle worker processes (8 threads each) serve the queue. For each job the
start of the run that counts (the delayed run, or the retry) is read with
time.time() in the actor's first lines and compared with the row's run_at
(the server runs on this host, so both are the same clock). Before the due
timer, both waited for the consumers' 1 s poll. ``--pin``: a session holds the xmin
horizon (``BEGIN; SELECT txid_current()``) through each run, so nothing the run deletes
or updates is vacuumed or pruned meanwhile.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    WorkerPool,
    bench_database,
    code_state,
    percentile,
    reset,
    say,
    server_url,
    wait_until,
)

LATE_MS = """
SELECT (l.started - extract(epoch FROM j.run_at)) * 1000
  FROM bench_latency l JOIN jobs j ON j.id = l.job_id
"""


def run(url: str, send, *, jobs: int, interval: float, pin: bool = False) -> list[float]:
    with psycopg.connect(url, autocommit=True) as conn, psycopg.connect(url) as pinned:
        reset(conn)
        if pin:
            pinned.execute("SELECT txid_current()")  # held open (not autocommit) until the run ends
        with WorkerPool(url, count=2, threads=8):
            start = time.monotonic()
            for i in range(jobs):
                pause = start + i * interval - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                send()
            wait_until(lambda: conn.execute("SELECT count(*) FROM bench_latency").fetchone()[0] == jobs, 120,
                       interval=0.02, what="every job to start")
            return [float(r[0]) for r in conn.execute(LATE_MS).fetchall()]


def report(name: str, late_ms: list[float]) -> None:
    figures = " ".join(f"p{q} {percentile(late_ms, q):.1f}" for q in (50, 95, 99))
    say(f"{name}: start - due (ms): {figures} max {max(late_ms):.1f} min {min(late_ms):.1f} "
        f"({len(late_ms)} jobs; load {os.getloadavg()[0]:.2f})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--delay-ms", type=int, default=100)
    p.add_argument("--interval-ms", type=int, default=20, help="time between sends")
    p.add_argument("--pin", action="store_true", help="hold the xmin horizon through each run")
    p.add_argument("--database-url", default=None,
                   help="server to create the bench database on (default $DATABASE_URL, else local)")
    args = p.parse_args(argv)
    with bench_database(server_url(args.database_url)) as url:
        import supervisor

        supervisor.setup_broker(url)
        from bench import bench_actors as actors

        say(code_state())
        interval = args.interval_ms / 1000
        say(f"D1: {args.jobs} sends with delay={args.delay_ms} ms, {args.interval_ms} ms apart"
            f"{', horizon pinned' if args.pin else ''}")
        report("D1 delayed", run(url, lambda: actors.delayed.send_with_options(delay=args.delay_ms),
                                 jobs=args.jobs, interval=interval, pin=args.pin))
        say(f"D2: {args.jobs} jobs raising Retry(delay={args.delay_ms}) once, {args.interval_ms} ms apart")
        report("D2 retried", run(url, lambda: actors.retried.send(args.delay_ms), jobs=args.jobs, interval=interval,
                                 pin=args.pin))
    return 0


if __name__ == "__main__":
    sys.exit(main())
