"""The database's floor of a job path, measured alike for any job store: what a job costs
PostgreSQL itself (enqueue + claim + finish) with no worker and no producer code around
the statements. ``db_floor.py`` runs it on our statements, ``floor_pgqueuer.py`` on
pgqueuer's; both print the same table.

Per batch size and connection count, each run:

1. empties the store's tables;
2. enqueues N rows on one connection, in batches of the claim size, one autocommitted
   statement a batch, as a producer sends them (the batches' parameters are built before
   the clock starts: what is timed is the statement, psycopg's adaptation included);
3. settles the table (ANALYZE, not timed), as the store's upkeep or autovacuum would;
4. drains on ``connections`` connections at once, each looping claim (up to the batch
   size) and finish (those rows), each statement autocommitted and durable, as a worker
   sends them, until a claim comes back empty;
5. checks that every row was finished exactly once.

Rows/s are wall-clock; CPU is that of the PostgreSQL backends serving the timed
connections (utime + stime from /proc, so the server must run on this machine),
divided by N. The total per job is enqueue + drain CPU of the same run.

Only the standard library, psycopg and ``bench.basics``: floor_pgqueuer.py imports this
from a venv without this project installed.
"""

from __future__ import annotations

if __name__ == "__main__":  # imported by the scripts as bench.<name>; nothing to run
    raise SystemExit(f"{__file__}: a module the scripts in bench/ import, not a script (bench/README.md lists them)")

import argparse
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import psycopg

from bench.basics import Figure, cpu_seconds, print_table, say, server_url

Conn = psycopg.Connection[Any]


@dataclass(frozen=True)
class JobPath:
    """A job store's statements as the floor runs them; each callable sends one statement
    (``reset`` and ``settle`` may send a few: they are not timed)."""

    name: str
    reset: Callable[[Conn], None]  # empty the store's tables
    build: Callable[[int], Any]  # the parameters of one enqueue batch of n rows
    enqueue: Callable[[Conn, Any], None]  # send one batch built by ``build``
    settle: Callable[[Conn], None]  # between enqueue and drain
    claim: Callable[[Conn, int, str], list[Any]]  # (conn, batch, owner) -> claimed rows
    finish: Callable[[Conn, str, list[Any]], None]  # (conn, owner, rows): mark them done
    unfinished: Callable[[Conn], int]  # rows left unfinished after the drain


@dataclass(frozen=True)
class Run:
    enqueue_rate: float  # rows/s
    enqueue_cpu: float  # backend us per row
    drain_rate: float
    drain_cpu: float

    @property
    def total_cpu(self) -> float:
        return self.enqueue_cpu + self.drain_cpu


def drain(path: JobPath, conn: Conn, batch: int, owner: str, done: list[int]) -> None:
    """Claim and finish until a claim comes back empty; count the rows in ``done``."""
    while rows := path.claim(conn, batch, owner):
        path.finish(conn, owner, rows)
        done.append(len(rows))


def run_once(url: str, path: JobPath, jobs: int, batch: int, connections: int) -> Run:
    with psycopg.connect(url, autocommit=True) as conn:
        path.reset(conn)
        batches = [path.build(min(batch, jobs - start)) for start in range(0, jobs, batch)]
        with psycopg.connect(url, autocommit=True) as producer:
            pid = producer.info.backend_pid
            cpu0, t0 = cpu_seconds(pid), time.monotonic()
            for params in batches:
                path.enqueue(producer, params)
            enqueue_s, enqueue_cpu = time.monotonic() - t0, cpu_seconds(pid) - cpu0
        path.settle(conn)
        drainers = [psycopg.connect(url, autocommit=True) for _ in range(connections)]
        try:
            pids = [c.info.backend_pid for c in drainers]
            done: list[int] = []
            threads = [threading.Thread(target=drain, args=(path, c, batch, str(uuid.uuid4()), done))
                       for c in drainers]
            cpu0, t0 = sum(cpu_seconds(p) for p in pids), time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            drain_s, drain_cpu = time.monotonic() - t0, sum(cpu_seconds(p) for p in pids) - cpu0
        finally:
            for c in drainers:
                c.close()
        left = path.unfinished(conn)
    if left or sum(done) != jobs:
        raise SystemExit(f"the drain left {left} rows and finished {sum(done)} of {jobs}")
    return Run(jobs / enqueue_s, enqueue_cpu / jobs * 1e6, jobs / drain_s, drain_cpu / jobs * 1e6)


def figures(runs: list[Run], config: str) -> list[Figure]:
    def values(of: Callable[[Run], float]) -> tuple[float, ...]:
        return tuple(of(r) for r in runs)

    return [
        Figure("enqueue, one connection", "rows/s", values(lambda r: r.enqueue_rate), config=config),
        Figure("enqueue backend CPU per row", "us", values(lambda r: r.enqueue_cpu),
               higher_is_better=False, config=config),
        Figure("claim + finish, no worker", "rows/s", values(lambda r: r.drain_rate), config=config),
        Figure("drain backend CPU per row", "us", values(lambda r: r.drain_cpu),
               higher_is_better=False, config=config),
        Figure("backend CPU per job (enqueue + claim + finish)", "us", values(lambda r: r.total_cpu),
               higher_is_better=False, config=config),
    ]


def main(path: JobPath, database: Callable[[str], AbstractContextManager[str]], *, doc: str | None,
         argv: list[str] | None = None, preamble: tuple[str, ...] = ()) -> int:
    """Parse the options every floor script shares, run each configuration, print the table.
    ``database(server)`` yields the URL of a fresh database holding the store's schema."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--batch", default="32,100", help="comma-separated claim (and enqueue) batch sizes")
    p.add_argument("--connections", default="1,2", help="comma-separated drain connection counts")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--database-url", default=None)
    args = p.parse_args(argv)
    table: list[Figure] = []
    with database(server_url(args.database_url)) as url:
        for line in (*preamble, f"job path: {path.name}"):
            say(line)
        for batch in (int(b) for b in args.batch.split(",")):
            for connections in (int(c) for c in args.connections.split(",")):
                runs = []
                for n in range(args.repeat):
                    run = run_once(url, path, args.jobs, batch, connections)
                    runs.append(run)
                    say(f"batch {batch}, {connections} connection(s), run {n + 1}: "
                        f"enqueue {run.enqueue_rate:,.0f} rows/s, {run.enqueue_cpu:.0f} us/row; "
                        f"drain {run.drain_rate:,.0f} rows/s, {run.drain_cpu:.0f} us/row; "
                        f"backend CPU {run.total_cpu:.0f} us/job")
                table += figures(runs, f"batch {batch} x {connections} conn")
                say(f"  median {statistics.median(r.drain_rate for r in runs):,.0f} rows/s drained, "
                    f"{statistics.median(r.total_cpu for r in runs):.0f} us/job")
    say("")
    print_table(table)
    return 0
