"""Bulk enqueue benchmark: ``enqueue_many`` of N messages in one transaction,
INSERT_MANY (the one-statement path, ``copy=False``) against COPY (``copy=True``,
what a batch of this size takes), alternating, medians over the runs.

    python bench/bench_enqueue.py [--jobs 20000] [--repeat 5] [--variants plain,keyed,delayed]
                                  [--database-url URL]

plain    no-op messages (``actor.message()``), due now: bench_broker.py's W1 enqueue
keyed    each message with its own dedupe key (none live yet): the key lookup comes first
delayed  ``delay=60_000``: run_at = now() + 60 s, the same for the whole batch

Each run empties ``jobs``, builds N messages with ``actor.message()`` (timed: "build"),
then writes them with ``supervisor.broker.bulk.enqueue_many`` on one connection
inside ``conn.transaction()`` and commits ("insert": rows, statements and the
durable commit). Both paths share the row building, so "insert" compares the
statements; "build + insert" is what a producer sees. When the server runs on
this host, the CPU time its backend spent on the batch is printed too (from
/proc/PID/schedstat): on a shared machine it moves far less with the load than
the wall clock does. Nothing asserts; a run that does not leave exactly N
pending rows stops the benchmark.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_database, code_state, empty_jobs, say, server_url
from supervisor.broker import bulk

PATHS = {"INSERT_MANY": False, "COPY": True}


def load() -> float:
    return os.getloadavg()[0]


def backend_cpu(conn: psycopg.Connection) -> float:
    """CPU seconds the connection's server process has used; NaN if it is not on this host."""
    try:
        with open(f"/proc/{conn.info.backend_pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return math.nan


def one_run(conn: psycopg.Connection, broker, actor, *, jobs: int, variant: str,
            copy: bool) -> tuple[float, float, float]:
    """Seconds for (build, insert + commit, the server's CPU) of one batch."""
    empty_jobs(conn)
    t0 = time.perf_counter()
    if variant == "keyed":
        messages = [actor.message_with_options(dedupe_key=f"k{i}") for i in range(jobs)]
    else:
        messages = [actor.message() for _ in range(jobs)]
    built = time.perf_counter()
    cpu = backend_cpu(conn)
    with conn.transaction():
        bulk.enqueue_many(conn, messages, actors=broker.actors, retries=broker._retries(),
                          delay=60_000 if variant == "delayed" else 0, copy=copy)
    committed = time.perf_counter()
    cpu = backend_cpu(conn) - cpu
    pending = conn.execute("SELECT count(*) FROM jobs WHERE status = 'pending'").fetchone()[0]
    if pending != jobs:
        raise RuntimeError(f"{variant} via {'COPY' if copy else 'INSERT_MANY'}: {pending} pending rows, not {jobs}")
    return built - t0, committed - built, cpu


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=20_000, help="messages per batch")
    p.add_argument("--repeat", type=int, default=5, help="runs of each path per variant (medians reported)")
    p.add_argument("--variants", default="plain,keyed,delayed", help="comma-separated: plain, keyed, delayed")
    p.add_argument("--database-url", default=None,
                   help="server to create the bench database on (default $DATABASE_URL, else local)")
    args = p.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]

    with bench_database(server_url(args.database_url)) as url:
        import supervisor

        broker = supervisor.setup_broker(url)
        from bench import bench_actors as actors

        say(code_state())
        summary = []
        with psycopg.connect(url, autocommit=True) as conn:
            one_run(conn, broker, actors.noop, jobs=1_000, variant="plain", copy=True)  # warm-up
            for variant in variants:
                times: dict[str, list[tuple[float, float, float]]] = {name: [] for name in PATHS}
                loads = []
                for run in range(args.repeat):
                    for name, copy in PATHS.items():
                        build, insert, cpu = one_run(conn, broker, actors.noop, jobs=args.jobs, variant=variant,
                                                     copy=copy)
                        times[name].append((build, insert, cpu))
                        loads.append(load())
                        say(f"{variant} run {run + 1}/{args.repeat} {name:<11}: build {build:.3f}s, insert + commit "
                            f"{insert:.3f}s (server CPU {cpu:.3f}s) -> {args.jobs / (build + insert):,.0f} jobs/s "
                            f"build + insert, {args.jobs / insert:,.0f} jobs/s insert (load avg {load():.1f})")
                for name in PATHS:
                    total = statistics.median(args.jobs / (b + i) for b, i, _ in times[name])
                    insert = statistics.median(args.jobs / i for _, i, _ in times[name])
                    cpu_ms = statistics.median(c for _, _, c in times[name]) * 1000
                    summary.append(f"{variant:<8} {name:<11} {total:>10,.0f} {insert:>10,.0f} {cpu_ms:>12,.0f}   "
                                   f"load avg {min(loads):.1f}..{max(loads):.1f}")
        say(f"\nenqueue_many x {args.jobs:,}, medians of {args.repeat} runs (jobs/s; server CPU per batch):")
        say(f"{'variant':<8} {'path':<11} {'build+ins':>10} {'insert':>10} {'server ms':>12}")
        for line in summary:
            say(line)
    broker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
