"""Progress benchmark: W1 (no-op throughput) and W2 (enqueue-to-start latency)
with ``supervisor.progress`` called ten times per job, against the plain runs.

Plain and progress runs alternate (plain, progress, plain, ...) so both see the
same machine load; the table shows each figure for both and the change.

    python bench/bench_progress.py                 # W1 and W2, 3 runs each
    python bench/bench_progress.py --only W1 --repeat 5 --jobs 50000
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_broker import w1, w2  # noqa: E402
from bench.common import Figure, bench_database, code_state, percentile, print_table, say, server_url  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="W1,W2", help="comma-separated workloads to run")
    p.add_argument("--jobs", type=int, default=20_000, help="W1 job count")
    p.add_argument("--w1-threads", type=int, default=32, help="threads per process in W1")
    p.add_argument("--w2-jobs", type=int, default=1_000)
    p.add_argument("--w2-threads", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--database-url", default=None)
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
        }
        say(code_state())
        if "W1" in only:
            drains: dict[str, list[float]] = {name: [] for name in variants}
            for run in range(args.repeat):
                for name, chosen in variants.items():
                    say(f"W1 {name} run {run + 1}/{args.repeat}: {args.jobs:,} jobs, 2 x {args.w1_threads} threads")
                    r = w1(url, broker, chosen, jobs=args.jobs, threads=args.w1_threads, chunk=0)
                    drains[name].append(r["drain"])
            with psycopg.connect(url) as conn:
                reports = conn.execute("SELECT count(*) FROM job_progress").fetchone()
            say(f"    progress rows written by the last progress run: {reports[0] if reports else 0:,}")
            for name, values in drains.items():
                figures.append(Figure(f"W1 drain, {name}", "jobs/s", tuple(values),
                                      config=f"2 proc x {args.w1_threads} thr"))
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
        if f.name.endswith(", progress x10"):
            plain = by_name[f.name.replace(", progress x10", ", plain")]
            say(f"{f.name}: {(f.median / plain.median - 1):+.1%} vs plain (medians)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
