"""Progress benchmark: W1 (no-op throughput) and W2 (enqueue-to-start latency)
with ``supervisor.progress`` called ten times per job, against the plain runs.

Plain and progress runs alternate (plain, progress, plain, ...) so both see the
same machine load; the table shows each figure for both and the change. W1 also
prints the CPU time the run cost per 1,000 jobs, in the two worker processes and
in their PostgreSQL backends (read from /proc through psutil): on a shared
machine that drifts far less than jobs/s, and it is what progress adds.

    python bench/bench_progress.py                 # W1 and W2, 3 runs each
    python bench/bench_progress.py --only W1 --repeat 5 --jobs 50000
    python bench/bench_progress.py --repeat 5 --control   # + a second plain run per round (noise)
"""

from __future__ import annotations

import argparse
import sys
import time
import types
from pathlib import Path

import psutil
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_broker import BATCHES, _bulk_enqueue, _drain, _warm_up, load, w2
from bench.common import (
    Figure,
    WorkerPool,
    bench_database,
    code_state,
    percentile,
    print_table,
    reset,
    say,
    server_url,
)

# The PostgreSQL backends of the bench database's other sessions (the workers' pools).
BACKENDS = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"


def _cpu(pids: list[int]) -> float:
    """User + system CPU seconds of these processes so far (gone ones count 0)."""
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def _settled_count(conn: psycopg.Connection) -> int:
    """job_progress rows once the workers' last progress writes (every 0.5 s) landed."""
    before = -1
    while True:
        rows = conn.execute("SELECT count(*) FROM job_progress").fetchone()[0]
        if rows == before:
            return rows
        before = rows
        time.sleep(0.6)


def w1(url: str, broker, actors, *, jobs: int, threads: int) -> dict[str, float]:
    """bench_broker's W1 (bulk enqueue, drain by 2 processes), plus the CPU the
    drain cost in the workers and in the database backends serving them."""
    with psycopg.connect(url, autocommit=True) as conn:
        reset(conn)
        conn.execute("TRUNCATE job_progress")
        with WorkerPool(url, count=2, threads=threads) as pool:
            _warm_up(url, conn, broker, actors.noop)
            workers = [p.pid for p in pool.procs]
            backends = [r[0] for r in conn.execute(BACKENDS).fetchall()]
            cpu0 = _cpu(workers), _cpu(backends)
            committed = _bulk_enqueue(url, [actors.noop.message() for _ in range(jobs)], broker, 0)
            seconds = _drain(conn, jobs, committed, timeout=300)
            worker_cpu, db_cpu = _cpu(workers) - cpu0[0], _cpu(backends) - cpu0[1]
            shape = conn.execute(BATCHES).fetchone()
            rows = _settled_count(conn)
    rate = jobs / seconds
    say(f"    drained {jobs:,} in {seconds:.3f}s -> {rate:,.0f} jobs/s; CPU per 1k jobs: workers "
        f"{worker_cpu * 1e6 / jobs:.0f} ms, db {db_cpu * 1e6 / jobs:.0f} ms; {rows:,} progress rows "
        f"({shape[0]:,} claims of {shape[1]:.1f}, {shape[2]:,} ack batches of {shape[3]:.1f}; {load()})")
    return {"drain": rate, "worker_cpu": worker_cpu * 1e6 / jobs, "db_cpu": db_cpu * 1e6 / jobs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="W1,W2", help="comma-separated workloads to run")
    p.add_argument("--jobs", type=int, default=20_000, help="W1 job count")
    p.add_argument("--w1-threads", type=int, default=32, help="threads per process in W1")
    p.add_argument("--w2-jobs", type=int, default=1_000)
    p.add_argument("--w2-threads", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--database-url", default=None)
    p.add_argument("--control", action="store_true",
                   help="also a second plain run per round ('plain again': how far identical runs differ here)")
    args = p.parse_args(argv)
    only = {w.strip().upper() for w in args.only.split(",") if w.strip()}

    figures: list[Figure] = []
    with bench_database(server_url(args.database_url)) as url:
        import supervisor

        broker = supervisor.setup_broker(url)
        from bench import bench_actors as actors

        variants = {
            "plain": actors,
            "progress x10": types.SimpleNamespace(noop=actors.noop_progress, latency=actors.latency_progress),
            **({"plain again": actors} if args.control else {}),
        }
        say(code_state())
        if "W1" in only:
            keys = ("drain", "worker_cpu", "db_cpu")
            got: dict[str, dict[str, list[float]]] = {name: {k: [] for k in keys} for name in variants}
            for run in range(args.repeat):
                for name, chosen in variants.items():
                    say(f"W1 {name} run {run + 1}/{args.repeat}: {args.jobs:,} jobs, 2 x {args.w1_threads} threads")
                    r = w1(url, broker, chosen, jobs=args.jobs, threads=args.w1_threads)
                    for k in keys:
                        got[name][k].append(r[k])
            cfg = f"2 proc x {args.w1_threads} thr"
            for name, values in got.items():
                figures.append(Figure(f"W1 drain, {name}", "jobs/s", tuple(values["drain"]), config=cfg))
                figures.append(Figure(f"W1 worker CPU, {name}", "ms/1k jobs", tuple(values["worker_cpu"]),
                                      higher_is_better=False, config=cfg))
                figures.append(Figure(f"W1 db CPU, {name}", "ms/1k jobs", tuple(values["db_cpu"]),
                                      higher_is_better=False, config=cfg))
        if "W2" in only:
            p50s: dict[str, list[float]] = {name: [] for name in variants}
            p99s: dict[str, list[float]] = {name: [] for name in variants}
            for run in range(args.repeat):
                for name, chosen in variants.items():
                    say(f"W2 {name} run {run + 1}/{args.repeat}: {args.w2_jobs:,} sends 10 ms apart")
                    r = w2(url, chosen, jobs=args.w2_jobs, threads=args.w2_threads, interval=0.01)
                    p50s[name].append(percentile(r["start"], 50))
                    p99s[name].append(percentile(r["start"], 99))
            for name in variants:
                cfg = f"2 proc x {args.w2_threads} thr"
                figures.append(Figure(f"W2 send->start p50, {name}", "ms", tuple(p50s[name]),
                                      higher_is_better=False, config=cfg))
                figures.append(Figure(f"W2 send->start p99, {name}", "ms", tuple(p99s[name]),
                                      higher_is_better=False, config=cfg))
        broker.close()

    say("")
    say(f"summary (best of {args.repeat} runs; spread = min..max)")
    print_table(figures)
    by_name = {f.name: f for f in figures}
    for f in figures:
        for other in (", progress x10", ", plain again"):
            if f.name.endswith(other):
                plain = by_name[f.name.replace(other, ", plain")]
                say(f"{f.name}: {(f.median / plain.median - 1):+.1%} vs plain (medians)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
