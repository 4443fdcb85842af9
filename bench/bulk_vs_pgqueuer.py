"""Bulk enqueue as a producer does it, against pgqueuer in the same run: N no-op jobs sent
in batches (default 1,000), each batch one call and one transaction of its own, through
each project's public API (ours: ``PostgresBroker.enqueue_many`` at the defaults; pgqueuer:
``Queries.enqueue`` on its asyncpg driver, what its docs show). Each side runs in a
subprocess of its own, on a fresh database, alternated run by run; jobs/s from the first
call to the last commit (messages built before the clock starts, as a producer has them).

    python bench/bulk_vs_pgqueuer.py [--jobs 20000] [--batch 1000] [--repeat 5]
        [--pgqueuer-python /work/benchvenv/bin/python] [--database-url URL]

pgqueuer runs in a venv of its own (this project need not be installed in it):

    python3 -m venv /work/benchvenv && /work/benchvenv/bin/pip install pgqueuer asyncpg 'psycopg[binary]'

Without that interpreter only our side runs (and says so).

A before/after in one run: ``BENCH_BASE_TREE=/tmp/base`` (e.g. ``git archive`` of an older
commit, as bench_broker.py takes it) adds a side "base", our code from that tree (its own
copy of this script, run with this interpreter), alternated with the other two.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"
PGQUEUER_PYTHON = "/work/benchvenv/bin/python"


def backend_cpu(pid: int) -> float:
    """CPU seconds a server process has used (NaN when the server is not on this host)."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return float("nan")


def ours(url: str, jobs: int, batch: int) -> tuple[float, float]:
    """Seconds to enqueue ``jobs`` in calls of ``batch`` through PostgresBroker at its defaults,
    and the server's CPU seconds for them (the pool holds one connection for a lone producer)."""
    import dramatiq

    from supervisor.broker import PostgresBroker
    from supervisor.testing import ThrowawayDatabase

    database = ThrowawayDatabase(url, "bulk_ours")
    broker = PostgresBroker(database.create(owners=()))
    try:
        dramatiq.set_broker(broker)

        @dramatiq.actor(queue_name="bulk")
        def noop() -> None:
            pass

        broker.enqueue_many([noop.message() for _ in range(batch)])  # warm: pool open, statements planned
        calls = [[noop.message() for _ in range(batch)] for _ in range(jobs // batch)]
        with broker.pool.connection() as conn:
            backends = [r[0] for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s",
                [conn.info.parameter_status("application_name")])]
        cpu = sum(backend_cpu(pid) for pid in backends)
        started = time.perf_counter()
        for messages in calls:
            broker.enqueue_many(messages)
        return time.perf_counter() - started, sum(backend_cpu(pid) for pid in backends) - cpu
    finally:
        broker.close()
        database.drop()


def pgqueuer(url: str, jobs: int, batch: int) -> tuple[float, float]:
    """The same through pgqueuer's Queries.enqueue (asyncpg)."""
    import asyncio
    import secrets

    import asyncpg
    import psycopg
    from pgqueuer.adapters.persistence.qb import QueryBuilderEnvironment
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    name = f"bulk_pgq_{os.getpid()}_{secrets.token_hex(3)}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    target = make_conninfo(url, dbname=name)
    try:
        with psycopg.connect(target, autocommit=True) as conn:
            conn.execute(QueryBuilderEnvironment().build_install_query())

        async def run() -> tuple[float, float]:
            parts = conninfo_to_dict(target)
            conn = await asyncpg.connect(host=parts.get("host"), port=int(parts.get("port") or 5432),
                                         user=parts.get("user"), password=parts.get("password"), database=name)
            queries = Queries(AsyncpgDriver(conn))
            await queries.enqueue(["noop"] * batch, [None] * batch, [0] * batch)  # warm
            pid = await conn.fetchval("SELECT pg_backend_pid()")
            cpu = backend_cpu(pid)
            started = time.perf_counter()
            for _ in range(jobs // batch):
                await queries.enqueue(["noop"] * batch, [None] * batch, [0] * batch)
            took = time.perf_counter() - started
            cpu = backend_cpu(pid) - cpu
            await conn.close()
            return took, cpu

        return asyncio.run(run())
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def side(python: str, which: str, args: argparse.Namespace) -> tuple[float, float]:
    script, root = __file__, ROOT
    if which == "base":  # our side, from the base tree (its script puts that tree first on sys.path)
        root = Path(os.environ["BENCH_BASE_TREE"])
        script, which = str(root / "bench" / Path(__file__).name), "ours"
    out = subprocess.run([python, script, "--side", which, "--jobs", str(args.jobs), "--batch", str(args.batch),
                          "--database-url", args.database_url], cwd=root, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"bulk_vs_pgqueuer: the {which} side failed: {out.stderr.strip().splitlines()[-1:]}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return float(got["seconds"]), float(got["server_cpu"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--batch", type=int, default=1_000, help="messages per call (each call its own transaction)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--pgqueuer-python", default=PGQUEUER_PYTHON, help="a python with pgqueuer and asyncpg")
    p.add_argument("--database-url", default=os.environ.get("DATABASE_URL") or DEFAULT_SERVER)
    p.add_argument("--side", choices=("ours", "pgqueuer"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.side:
        sys.path.insert(0, str(ROOT))
        took, cpu = (ours if args.side == "ours" else pgqueuer)(args.database_url, args.jobs, args.batch)
        print(json.dumps({"seconds": took, "server_cpu": cpu}))
        return
    has_peer = Path(args.pgqueuer_python).exists()
    if not has_peer:
        print(f"no pgqueuer interpreter at {args.pgqueuer_python}: our side only (see --help)", flush=True)
    order = ["ours", "pgqueuer"] + (["base"] if os.environ.get("BENCH_BASE_TREE") else [])
    rates: dict[str, list[float]] = {which: [] for which in order}
    cpus: dict[str, list[float]] = {which: [] for which in order}
    sent = args.jobs // args.batch * args.batch
    for run in range(args.repeat):
        for which in order if run % 2 == 0 else order[::-1]:
            if which == "pgqueuer" and not has_peer:
                continue
            took, cpu = side(args.pgqueuer_python if which == "pgqueuer" else sys.executable, which, args)
            rates[which].append(sent / took)
            cpus[which].append(cpu / sent * 1e6)
            print(f"run {run + 1}/{args.repeat} {which:9s} {sent / took:10,.0f} jobs/s"
                  f"  server CPU {cpu / sent * 1e6:5.1f} us/job", flush=True)
    print(f"\n{sent:,} jobs in calls of {args.batch:,}, median of {args.repeat} (jobs/s; server CPU per job):")
    for which, got in rates.items():
        if got:
            print(f"  {which:9s} {statistics.median(got):10,.0f}  {statistics.median(cpus[which]):5.1f} us")
    if rates["pgqueuer"]:
        for which in ("ours", "base") if rates.get("base") else ("ours",):
            # and the median of each run's own ratio: a run's sides ran back to back, so a
            # load that comes and goes on this shared machine weighs on both alike
            paired = statistics.median(a / b for a, b in zip(rates[which], rates["pgqueuer"], strict=True))
            print(f"  {which} / pgqueuer: {statistics.median(rates[which]) / statistics.median(rates['pgqueuer']):.2f}x"
                  f" (median of the runs' own: {paired:.2f}x)")


if __name__ == "__main__":
    main()
