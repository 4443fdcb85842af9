"""Where a worker's time goes on the W1 drain: CPU per job of the worker
processes and of their PostgreSQL backends, and optionally a yappi profile.

    python bench/profile_worker.py [--jobs 20000] [--threads 8] [--prefetch N]
                                   [--repeat 3] [--executors own,dramatiq] [--profile cpu|wall] [--top 40]

CPU figures come from /proc (utime + stime of each worker process and of every
backend connected to the bench database), sampled just before the enqueue's
commit and just after the drain: the drain's CPU, divided by the jobs. They
drift less than jobs/s on a shared machine, since they do not count the time
other programs hold the cores.

--executors runs each executor (the role key `executor`) in turn, run by run (A B A B
...), and prints each one's medians: a before/after on the same machine at the same time.

--profile runs every worker under yappi (pip install yappi; all threads) and
prints each process's top functions by total time when it exits.

Where the server loads pg_stat_statements (shared_preload_libraries, and
pg_stat_statements.track_planning = on for the planning column), each run also
prints the drain's costliest statements: server time per job and per call, and
planning. It resets the server's statistics at each run's start.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.basics import cpu_seconds, cpu_split
from bench.bench_broker import _bulk_enqueue, _drain, _warm_up, load
from bench.common import ROOT, WorkerPool, bench_database, code_state, reset, say, server_url
from bench.stub_worker import TARGET_US, YARDSTICK_US


def backend_pids(conn: psycopg.Connection, dbname: str) -> list[int]:
    rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                        (dbname,)).fetchall()
    return [r[0] for r in rows]


STATEMENTS = """
SELECT calls, plans, total_plan_time, total_exec_time, rows, regexp_replace(left(query, 400), '\\s+', ' ', 'g')
  FROM pg_stat_statements
 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
 ORDER BY total_plan_time + total_exec_time DESC
 LIMIT %s
"""


def statements_reset(conn: psycopg.Connection) -> bool:
    """Empty pg_stat_statements (the whole server's: a bench server) if the server loads it."""
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset()")
        return True
    except psycopg.Error as exc:
        say(f"    no per-statement split: {str(exc).splitlines()[0]}")
        return False


def statements_split(conn: psycopg.Connection, jobs: int, top: int = 4) -> None:
    """The drain's costliest statements: server time per job, per call, and planning."""
    for calls, plans, plan_ms, exec_ms, rows, query in conn.execute(STATEMENTS, (top,)).fetchall():
        words = query.split()
        head = " ".join(words[:6]) if not query.startswith("WITH") else f"WITH {words[1]} {words[2]} ..."
        say(f"      {(plan_ms + exec_ms) * 1e3 / jobs:6.1f} us/job  {calls:6,} calls  "
            f"{(plan_ms + exec_ms) / max(calls, 1):.3f} ms/call (planning {plan_ms / max(calls, 1):.3f} ms, "
            f"{plans:,} plans)  {rows / max(calls, 1):5.1f} rows/call  {head[:60]}")


def run_once(url: str, broker, actors, *, jobs: int, threads: int, prefetch: int | None,
             env: dict[str, str], executor: str | None = None) -> dict[str, float]:
    dbname = conninfo_to_dict(url)["dbname"]
    with psycopg.connect(url, autocommit=True) as conn:
        reset(conn)
        module = "bench.profiled_cli" if env.get("BENCH_PROFILE") else "supervisor.cli"
        with WorkerPool(url, count=2, threads=threads, prefetch=prefetch, module=module, env=env,
                        executor=executor) as pool:
            _warm_up(url, conn, broker, actors.noop)
            messages = [actors.noop.message() for _ in range(jobs)]
            backends = backend_pids(conn, dbname)
            split0 = [cpu_split(p) for p in pool.pids()]
            backends0 = {p: cpu_seconds(p) for p in backends}
            statements = statements_reset(conn)
            committed = _bulk_enqueue(url, messages, broker, 0)
            seconds = _drain(conn, jobs, committed, timeout=300)
            split1 = [cpu_split(p) for p in pool.pids()]
            # Backends opened during the drain started after the first sample: count them whole.
            backends1 = {p: cpu_seconds(p) for p in backend_pids(conn, dbname)}
    backend_cpu = sum(v - backends0.get(p, 0.0) for p, v in backends1.items())
    user, system, switches = (sum(b[i] - a[i] for a, b in zip(split0, split1, strict=True)) for i in range(3))
    out = {"rate": jobs / seconds, "worker_us": (user + system) / jobs * 1e6,
           "backend_us": backend_cpu / jobs * 1e6, "worker_sys_us": system / jobs * 1e6,
           "switches": switches / jobs}
    say(f"    {out['rate']:,.0f} jobs/s; CPU per job: workers {out['worker_us']:.0f} us "
        f"(of it in the kernel {out['worker_sys_us']:.0f} us; {out['switches']:.1f} context switches), "
        f"their backends {out['backend_us']:.0f} us ({load()})")
    if statements:
        with psycopg.connect(url, autocommit=True) as conn:
            statements_split(conn, jobs)
    return out


def yardstick(jobs: int, threads: int) -> float:
    """bench/stub_worker.py once, in a process of its own: its CPU us per job."""
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "stub_worker.py"), "--repeat", "1", "--jobs", str(jobs),
                          "--threads", str(threads)], capture_output=True, text=True, check=True, timeout=600).stdout
    match = re.search(r"StubBroker: ([\d.]+) us CPU per job", out)
    if match is None:
        raise RuntimeError(f"bench/stub_worker.py printed no figure: {out!r}")
    return float(match.group(1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--prefetch", type=int, default=None, help="rows a process may hold (default: threads)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--executors", default="own", help="comma-separated executors (own, dramatiq), alternated")
    p.add_argument("--profile", choices=("cpu", "wall"), default=None, help="run the workers under yappi")
    p.add_argument("--top", type=int, default=40, help="functions printed per profiled process")
    p.add_argument("--database-url", default=None)
    p.add_argument("--yardstick", action="store_true",
                   help="after each run, dramatiq.Worker on StubBroker (bench/stub_worker.py) in a process of its"
                        " own: our worker CPU per job against it, and issue 24's target scaled to this machine")
    args = p.parse_args(argv)
    env = {}
    if args.profile:
        env = {"BENCH_PROFILE": args.profile, "BENCH_PROFILE_TOP": str(args.top),
               "BENCH_PROFILE_DIR": os.environ.get("BENCH_PROFILE_DIR", "/tmp"),
               # yappi may be installed apart (pip install --target DIR yappi; PYTHONPATH=DIR)
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with bench_database(server_url(args.database_url)) as url:
        import supervisor

        broker = supervisor.setup_broker(url)
        from bench import bench_actors as actors

        say(code_state())
        executors = [e.strip() for e in args.executors.split(",") if e.strip()]
        results: dict[str, list[dict[str, float]]] = {e: [] for e in executors}
        for run in range(args.repeat):
            for executor in executors:
                say(f"run {run + 1}/{args.repeat}: {args.jobs:,} no-op jobs, 2 processes x {args.threads} threads"
                    + (f", prefetch {args.prefetch}" if args.prefetch else "") + f", executor {executor}")
                results[executor].append(run_once(url, broker, actors, jobs=args.jobs, threads=args.threads,
                                                  prefetch=args.prefetch, env=env, executor=executor))
                if args.yardstick:
                    results[executor][-1]["stub_us"] = stub_us = yardstick(args.jobs, args.threads)
                    ours = results[executor][-1]["worker_us"]
                    say(f"    yardstick: dramatiq.Worker on StubBroker {stub_us:.0f} us CPU per job; ours"
                        f" {ours / stub_us:.2f}x it (issue 24's target: {TARGET_US / YARDSTICK_US:.2f}x, i.e."
                        f" {TARGET_US * stub_us / YARDSTICK_US:.0f} us here)")
        broker.close()
    for executor, runs in results.items():
        say(f"executor {executor}:")
        for key, label in (("rate", "jobs/s"), ("worker_us", "worker CPU us/job"),
                           ("worker_sys_us", "worker kernel CPU us/job"),
                           ("switches", "worker context switches/job"), ("backend_us", "backend CPU us/job"),
                           ("stub_us", "StubBroker dramatiq.Worker CPU us/job (yardstick)")):
            values = [r[key] for r in runs if key in r]
            if not values:
                continue
            digits = 1 if key == "switches" else 0
            say(f"  median {label}: {statistics.median(values):,.{digits}f} "
                f"(runs: {', '.join(f'{v:,.{digits}f}' for v in values)})")
        if args.yardstick:
            ratios = [r["worker_us"] / r["stub_us"] for r in runs]
            say(f"  median worker CPU against the yardstick: {statistics.median(ratios):.2f}x "
                f"(runs: {', '.join(f'{v:.2f}' for v in ratios)}; target <= {TARGET_US / YARDSTICK_US:.2f}x)")
    if args.profile:
        say(f"profiles: {env['BENCH_PROFILE_DIR']}/as-profile-<pid>.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
