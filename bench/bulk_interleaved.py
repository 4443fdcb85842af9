"""Bulk enqueue, interleaved finely: bulk_vs_pgqueuer.py's calls (1,000 no-op messages a
call, each its own transaction, ``enqueue_many`` at the defaults against pgqueuer's
``Queries.enqueue``), but each side a process that stays up, on its own fresh database,
asked for ``--calls`` calls at a time, the sides taking turns for ``--rounds`` rounds: a
load that comes and goes on a shared machine (seconds) weighs on every side alike, where
bulk_vs_pgqueuer.py's runs (a database each, ~0.5 s of calls) fall into different moments.
Prints each side's median jobs/s and server CPU per job, and the median of the rounds' own
ratios.

    python bench/bulk_interleaved.py [--rounds 30] [--calls 4] [--base-tree /tmp/base]
        [--pgqueuer-python /work/benchvenv/bin/python] [--database-url URL]

``--base-tree``: a second "ours" side from another checkout (``git archive`` of an older
commit), a before/after in the same rounds. Tables grow through the run (rounds x calls x
1,000 rows a side), as a producer's day of log does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"
PGQUEUER_PYTHON = "/work/benchvenv/bin/python"
BATCH = 1_000

# One side: set up, say "ready", then for each line N on stdin make N calls and print
# [seconds, server CPU seconds]. Run with ``python -c`` so a base tree's code is imported
# (its root first on sys.path), not this checkout's.
SIDE = r'''
import json, os, sys, time
root, which, url, batch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
sys.path.insert(0, root)

def cpu(pid):
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9

if which == "pgqueuer":
    import asyncio, secrets
    import asyncpg, psycopg
    from pgqueuer.adapters.persistence.qb import QueryBuilderEnvironment
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries
    from psycopg.conninfo import conninfo_to_dict, make_conninfo
    name = f"bulk_il_pgq_{os.getpid()}_{secrets.token_hex(3)}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    target = make_conninfo(url, dbname=name)

    async def run():
        with psycopg.connect(target, autocommit=True) as c:
            c.execute(QueryBuilderEnvironment().build_install_query())
        parts = conninfo_to_dict(target)
        conn = await asyncpg.connect(host=parts.get("host"), port=int(parts.get("port") or 5432),
                                     user=parts.get("user"), password=parts.get("password"), database=name)
        queries = Queries(AsyncpgDriver(conn))
        await queries.enqueue(["noop"] * batch, [None] * batch, [0] * batch)  # warm
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        print("ready", flush=True)
        for line in sys.stdin:
            c0, t0 = cpu(pid), time.perf_counter()
            for _ in range(int(line)):
                await queries.enqueue(["noop"] * batch, [None] * batch, [0] * batch)
            print(json.dumps([time.perf_counter() - t0, cpu(pid) - c0]), flush=True)
        await conn.close()
    try:
        asyncio.run(run())
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
else:
    import dramatiq
    from supervisor.broker import PostgresBroker
    from supervisor.testing import ThrowawayDatabase
    database = ThrowawayDatabase(url, "bulk_il")
    broker = PostgresBroker(database.create(owners=()))
    try:
        dramatiq.set_broker(broker)

        @dramatiq.actor(queue_name="bulk")
        def noop():
            pass

        broker.enqueue_many([noop.message() for _ in range(batch)])  # warm: pool open, statements planned
        with broker.pool.connection() as conn:
            pids = [r[0] for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s",
                [conn.info.parameter_status("application_name")])]
        print("ready", flush=True)
        for line in sys.stdin:
            calls = [[noop.message() for _ in range(batch)] for _ in range(int(line))]  # built before the clock
            c0, t0 = sum(cpu(p) for p in pids), time.perf_counter()
            for messages in calls:
                broker.enqueue_many(messages)
            print(json.dumps([time.perf_counter() - t0, sum(cpu(p) for p in pids) - c0]), flush=True)
    finally:
        broker.close()
        database.drop()
'''


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--calls", type=int, default=4, help="calls of 1,000 a side makes in its turn")
    p.add_argument("--base-tree", help="a checkout whose code is the side 'base'")
    p.add_argument("--pgqueuer-python", default=PGQUEUER_PYTHON, help="a python with pgqueuer and asyncpg")
    p.add_argument("--database-url", default=os.environ.get("DATABASE_URL") or DEFAULT_SERVER)
    args = p.parse_args()
    sides = {"ours": (sys.executable, str(ROOT))}
    if args.base_tree:
        sides["base"] = (sys.executable, str(Path(args.base_tree).resolve()))
    if Path(args.pgqueuer_python).exists():
        sides["pgqueuer"] = (args.pgqueuer_python, str(ROOT))
    else:
        print(f"no pgqueuer interpreter at {args.pgqueuer_python}: our side(s) only", flush=True)
    procs = {}
    try:
        for name, (python, root) in sides.items():
            procs[name] = subprocess.Popen([python, "-c", SIDE, root, name, args.database_url, str(BATCH)],
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=root)
            ready = procs[name].stdout.readline().strip()  # type: ignore[union-attr]
            if ready != "ready":
                sys.exit(f"bulk_interleaved: the {name} side did not start")
        got: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
        order = list(sides)
        sent = args.calls * BATCH
        for r in range(args.rounds):
            for name in order if r % 2 == 0 else order[::-1]:
                proc = procs[name]
                proc.stdin.write(f"{args.calls}\n")  # type: ignore[union-attr]
                proc.stdin.flush()  # type: ignore[union-attr]
                took, cpu = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
                got[name].append((sent / took, cpu / sent * 1e6))
    finally:
        for proc in procs.values():
            if proc.stdin:
                proc.stdin.close()
            proc.wait(timeout=60)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"{args.rounds} rounds of {args.calls} calls of {BATCH:,} a side, alternated; load average after: {load}")
    for name, rows in got.items():
        print(f"  {name:9s} {statistics.median(r[0] for r in rows):10,.0f} jobs/s"
              f"  server CPU {statistics.median(r[1] for r in rows):5.1f} us/job")
    pairs = [(a, b) for a in ("ours", "base") for b in ("pgqueuer", "base") if a != b and a in got and b in got]
    for a, b in pairs:
        own = statistics.median(x[0] / y[0] for x, y in zip(got[a], got[b], strict=True))
        print(f"  {a} / {b}: {statistics.median(r[0] for r in got[a]) / statistics.median(r[0] for r in got[b]):.2f}x"
              f" (median of the rounds' own: {own:.2f}x)")


if __name__ == "__main__":
    main()
