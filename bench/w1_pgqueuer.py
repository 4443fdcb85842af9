"""bench_broker.py's W1 on pgqueuer: N no-op jobs bulk-enqueued in one transaction, then
drained by worker processes running pgqueuer's own QueueManager; jobs/s from the enqueue's
commit until pgqueuer's queue table is empty (polled every 10 ms: pgqueuer deletes a row
when it logs the job's end, so an empty table means every completion is written).

Runs in a venv of its own (this project need not be installed in it):

    python3 -m venv /work/benchvenv && /work/benchvenv/bin/pip install pgqueuer asyncpg 'psycopg[binary]'
    /work/benchvenv/bin/python bench/w1_pgqueuer.py [--jobs 20000] [--repeat 3]
        [--configs 2x8/4,1x16/8,1x100/50] [--driver asyncpg|psycopg] [--database-url URL]

A config is PROCESSESxCONCURRENCY/BATCH: that many worker processes, each a QueueManager
run with ``max_concurrent_tasks=CONCURRENCY`` and ``batch_size=BATCH`` (pgqueuer requires
the first to be at least twice the second; 0: no cap, so with no-op jobs about a batch is in
flight), under uvloop when it is installed. Our W1 at
the defaults is 2 processes x 8 threads: 16 jobs in flight, as ``2x8/4`` or ``1x16/8``
here. Configs are alternated run by run. As in W1: 200 warm-up jobs first (each process
must have run one: connections open, statements prepared), the jobs enqueued by pgqueuer's
own enqueue statement (``Queries.enqueue``'s, built by its query builder: floor_pgqueuer.py)
in one transaction. Also printed: the worker processes' CPU per job (utime + stime from
/proc), comparable with profile_worker.py's.

The database is a fresh one on the server (--database-url, else DATABASE_URL, else the
local one), with pgqueuer's schema; dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.basics import code_state, cpu_seconds, say, server_url
from bench.floor_pgqueuer import ENTRYPOINT, build_rows, enqueue_rows, pgqueuer_database

QUEUE_TABLE = "pgqueuer"


def serve(url: str, concurrency: int, batch: int, driver: str, warm_file: str) -> None:
    """One worker process: a QueueManager running no-op jobs until SIGTERM."""
    from pgqueuer import Queries, QueueManager
    from pgqueuer.models import Job

    async def main() -> None:
        if driver == "asyncpg":
            import asyncpg
            from pgqueuer import AsyncpgDriver
            conn = await asyncpg.connect(**asyncpg_params(url))
            db = AsyncpgDriver(conn)
        else:
            from pgqueuer import PsycopgDriver
            conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
            db = PsycopgDriver(conn)
        qm = QueueManager(Queries(db))
        warm = False

        @qm.entrypoint(ENTRYPOINT)
        async def noop(job: Job) -> None:
            nonlocal warm
            if not warm:  # the harness waits until every process has run a job
                warm = True
                Path(warm_file).write_text("warm")

        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, qm.shutdown.set)
        await qm.run(batch_size=batch, max_concurrent_tasks=concurrency or None)

    try:
        import uvloop
        uvloop.run(main())
    except ImportError:
        asyncio.run(main())


def asyncpg_params(url: str) -> dict[str, object]:
    """A psycopg conninfo (URL or key=value) as asyncpg.connect's keywords."""
    from psycopg.conninfo import conninfo_to_dict
    info = conninfo_to_dict(url)
    return {"host": info.get("host"), "port": int(info.get("port") or 5432), "user": info.get("user"),
            "password": info.get("password"), "database": info.get("dbname")}


def parse(config: str) -> tuple[int, int, int]:
    procs, rest = config.split("x")
    concurrency, batch = rest.split("/")
    return int(procs), int(concurrency), int(batch)


def empty(conn: psycopg.Connection) -> bool:
    return not conn.execute(f"SELECT EXISTS (SELECT 1 FROM {QUEUE_TABLE})").fetchone()[0]


def wait(condition, timeout: float, what: str, workers: list[subprocess.Popen]) -> float:
    deadline = time.monotonic() + timeout
    while not condition():
        for p in workers:
            if p.poll() is not None:
                raise RuntimeError(f"a pgqueuer worker exited with {p.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)
    return time.monotonic()


def run_once(url: str, config: str, jobs: int, driver: str) -> tuple[float, float]:
    """One drain; returns (jobs/s, worker CPU us per job)."""
    procs, concurrency, batch = parse(config)
    with psycopg.connect(url, autocommit=True) as conn, tempfile.TemporaryDirectory(prefix="w1-pgq-") as tmp:
        conn.execute(f"TRUNCATE {QUEUE_TABLE}, pgqueuer_log")
        warm = [Path(tmp) / f"warm{i}" for i in range(procs)]
        workers = [subprocess.Popen([sys.executable, __file__, "--serve", url, "--concurrency", str(concurrency),
                                     "--batch", str(batch), "--driver", driver, "--warm-file", str(w)])
                   for w in warm]
        try:
            for _ in range(50):  # warm-up: until every process has run a job
                enqueue_rows(conn, build_rows(200))
                wait(lambda: empty(conn), 60, "warm-up jobs", workers)
                if all(w.exists() for w in warm):
                    break
            else:
                raise RuntimeError("not every worker process ran a warm-up job")
            args = build_rows(jobs)
            cpu0 = sum(cpu_seconds(p.pid) for p in workers)
            with conn.transaction():
                enqueue_rows(conn, args)
            committed = time.monotonic()
            ended = wait(lambda: empty(conn), 300, "the queue to drain", workers)
            cpu = sum(cpu_seconds(p.pid) for p in workers) - cpu0
        finally:
            for p in workers:
                p.send_signal(signal.SIGTERM)
            for p in workers:
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
    rate = jobs / (ended - committed)
    return rate, cpu / jobs * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--configs", default="2x8/4,1x16/8,1x100/50",
                   help="comma-separated PROCESSESxCONCURRENCY/BATCH, alternated run by run")
    p.add_argument("--driver", choices=("asyncpg", "psycopg"), default="asyncpg")
    p.add_argument("--database-url", default=None)
    p.add_argument("--serve", help=argparse.SUPPRESS)
    p.add_argument("--concurrency", type=int, help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    p.add_argument("--warm-file", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(args.serve, args.concurrency, args.batch, args.driver, args.warm_file)
        return 0
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    results: dict[str, list[tuple[float, float]]] = {c: [] for c in configs}
    say(f"pgqueuer {version('pgqueuer')}, driver {args.driver}; repository {code_state()}")
    with pgqueuer_database(server_url(args.database_url)) as url:
        for run in range(args.repeat):
            for config in configs:
                rate, cpu = run_once(url, config, args.jobs, args.driver)
                results[config].append((rate, cpu))
                say(f"W1 pgqueuer run {run + 1}/{args.repeat}, {config}: {args.jobs:,} no-op jobs drained at "
                    f"{rate:,.0f} jobs/s; worker CPU {cpu:.0f} us/job; load avg {os.getloadavg()[0]:.1f}")
    say("")
    say(f"summary ({args.repeat} runs each): config (processes x concurrency / batch): median, best jobs/s;"
        " median worker CPU us/job")
    for config, values in results.items():
        rates = [r for r, _ in values]
        say(f"  {config:>10}: median {statistics.median(rates):,.0f}, best {max(rates):,.0f} jobs/s; "
            f"{statistics.median(c for _, c in values):.0f} us/job")
    return 0


if __name__ == "__main__":
    sys.exit(main())
