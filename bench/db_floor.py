"""The database's own ceiling for W1: PostgreSQL running the product's claim and ack
statements with no worker at all, so no worker design can drain faster on this machine.

    python bench/db_floor.py [--jobs 20000] [--batch 32,100] [--connections 1,2] [--repeat 3]

For each batch size and connection count: N no-op rows are inserted, then each
connection loops `sql.claim(BATCH)` (up to BATCH rows) and `sql.ACK_MANY` (those rows), each in
its own autocommitted, durable statement, as a worker process does, until no row is
left. Prints rows/s and the backends' CPU per row (from /proc, as profile_worker.py).

Compare with W1 (bench_broker.py): W1's jobs/s over this figure is the share of the
database's ceiling the workers reach; the rest is the workers' own CPU on shared cores.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Figure, bench_database, code_state, print_table, reset, say, server_url  # noqa: E402
from bench.profile_worker import cpu_seconds  # noqa: E402
from supervisor import db  # noqa: E402
from supervisor.broker import sql  # noqa: E402
from supervisor.broker.middleware import claim_budgets  # noqa: E402

NO_BUDGETS = claim_budgets({}, None)  # no actors known: the rows carry their own budget


def drain(conn: psycopg.Connection, batch: int, owner: str, done: list[int]) -> None:
    """Claim and ack until a claim comes back empty; count the rows in ``done``."""
    params = {"queue": "floor", "n": batch, "owner": owner, "lease_s": 30.0, "relaxed": False, **NO_BUDGETS}
    while rows := conn.execute(sql.claim(batch), params).fetchall():
        conn.execute(sql.ACK_MANY, {"ids": db.array_text([str(r[0]) for r in rows]),
                                    "attempts": db.array_text([r[4] for r in rows]),
                                    # as a worker sends them: each attempt ran 1 ms and ended 0.5 ms ago
                                    "started_us": db.array_text([1500] * len(rows)),
                                    "ended_us": db.array_text([500] * len(rows)),
                                    "owner": owner, "progress": None})
        done.append(len(rows))


def run_once(url: str, jobs: int, batch: int, connections: int) -> tuple[float, float]:
    """(rows/s, backend CPU us per row)."""
    with psycopg.connect(url, autocommit=True) as conn:
        reset(conn)
        conn.execute("INSERT INTO job_queue (queue, actor, max_attempts) SELECT 'floor', 'noop', 1 "
                     "FROM generate_series(1, %s)", (jobs,))
        conn.execute("ANALYZE job_queue")
        drainers = [psycopg.connect(url, autocommit=True) for _ in range(connections)]
        try:
            pids = [c.info.backend_pid for c in drainers]
            done: list[int] = []
            threads = [threading.Thread(target=drain, args=(c, batch, f"floor:{i}", done))
                       for i, c in enumerate(drainers)]
            cpu0 = sum(cpu_seconds(p) for p in pids)
            t0 = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            seconds = time.monotonic() - t0
            cpu = sum(cpu_seconds(p) for p in pids) - cpu0
        finally:
            for c in drainers:
                c.close()
        left = conn.execute("SELECT count(*) FROM job_queue").fetchone()[0]
    if left or sum(done) != jobs:
        raise SystemExit(f"the drain left {left} rows and acked {sum(done)} of {jobs}")
    return jobs / seconds, cpu / jobs * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--batch", default="32,100", help="comma-separated claim sizes")
    p.add_argument("--connections", default="1,2", help="comma-separated connection counts")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--database-url", default=None)
    args = p.parse_args(argv)
    figures: list[Figure] = []
    with bench_database(server_url(args.database_url)) as url:
        say(code_state())
        for batch in (int(b) for b in args.batch.split(",")):
            for connections in (int(c) for c in args.connections.split(",")):
                rates, cpus = [], []
                for run in range(args.repeat):
                    rate, cpu = run_once(url, args.jobs, batch, connections)
                    rates.append(rate)
                    cpus.append(cpu)
                    say(f"batch {batch}, {connections} connection(s), run {run + 1}: {rate:,.0f} rows/s, "
                        f"backend CPU {cpu:.0f} us/row")
                config = f"batch {batch} x {connections} conn"
                figures.append(Figure("claim + ack, no worker", "rows/s", tuple(rates), config=config))
                figures.append(Figure("backend CPU per row", "us", tuple(cpus), higher_is_better=False,
                                      config=config))
                say(f"  median {statistics.median(rates):,.0f} rows/s")
    say("")
    print_table(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
