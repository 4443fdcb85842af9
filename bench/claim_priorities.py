"""The claim beside rows due later at a higher priority, and its cost per claim.

    python bench/claim_priorities.py [--delayed 0,10000,100000,1000000] [--levels 1] [--n 32]
                                     [--runs 200] [--database-url URL]

For each --delayed count, a fresh table holds that many rows due in a day, spread over
--levels priorities from 10 up (one level: all at 10), and enough rows of priority 0 due
now (VACUUM ANALYZE). The claim (sql.claim(n); a power of two keeps a generic plan) then
runs --runs times, committed as a worker's, on two connections: one that prepares
statements (psycopg's default, so the server keeps a generic plan; a rolled-back claim
would not do: psycopg forgets its prepared statements at a ROLLBACK) and one that never
does (a PgBouncer-pooled URL, which plans every claim). Prints the median client-side
time of each. A claim that walked the delayed rows grew with their number
(tests/test_table_health.py counts the index pages it reads).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Figure, bench_database, code_state, print_table, reset, say, server_url
from supervisor.broker import sql
from supervisor.broker.consuming.floors import SWEEP
from supervisor.broker.consuming.gates import first_turn
from supervisor.broker.middleware import claim_budgets

PARAMS = {"queue": "bench", "owner": "claim-priorities", "lease_s": 30.0, "relaxed": False, **first_turn(2048),
          **claim_budgets({}, None), **SWEEP}


def fill(conn: psycopg.Connection, delayed: int, levels: int, due: int) -> None:
    """``delayed`` rows due in a day over ``levels`` priorities from 10 up, ``due`` rows of
    priority 0 due now."""
    reset(conn)
    conn.execute("INSERT INTO job_queue (queue, actor, max_attempts, priority, run_at) SELECT 'bench', 'noop', 1,"
                 " 10 + g %% %s, now() + interval '1 day' FROM generate_series(1, %s) AS g", (levels, delayed))
    conn.execute("INSERT INTO job_queue (queue, actor, max_attempts, priority) SELECT 'bench', 'noop', 1, 0"
                 " FROM generate_series(1, %s)", (due,))
    conn.execute("VACUUM ANALYZE job_queue")


def time_claims(conns: dict[str, psycopg.Connection], statement: str, runs: int) -> dict[str, list[float]]:
    """Milliseconds per claim (execute + fetch) on each connection, each committed;
    the connections take turns, so the index's dead entries grow alike for both."""
    out: dict[str, list[float]] = {name: [] for name in conns}
    for _ in range(runs):
        for name, conn in conns.items():
            t0 = time.perf_counter()
            if not conn.execute(statement, PARAMS).fetchall():
                raise SystemExit("the claim found no row: the due rows ran out")
            out[name].append((time.perf_counter() - t0) * 1e3)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--delayed", default="0,10000,100000,1000000", help="comma-separated counts of delayed rows")
    p.add_argument("--levels", type=int, default=1, help="priority levels the delayed rows spread over")
    p.add_argument("--n", type=int, default=32, help="rows per claim")
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--database-url", default=None)
    args = p.parse_args(argv)
    statement = sql.claim(args.n)
    PARAMS["n"] = args.n
    figures: list[Figure] = []
    with bench_database(server_url(args.database_url)) as url:
        say(code_state())
        with psycopg.connect(url, autocommit=True) as prepared, \
                psycopg.connect(url, autocommit=True, prepare_threshold=None) as pooled:
            for delayed in (int(d) for d in args.delayed.split(",")):
                fill(prepared, delayed, args.levels, due=2 * args.runs * args.n + 1000)
                config = f"{delayed:,} delayed" + (f" over {args.levels:,} levels" if args.levels > 1 else "")
                timed = time_claims({"prepared": prepared, "pooled": pooled}, statement, args.runs)
                for name, times in timed.items():
                    figures.append(Figure(f"claim of {args.n}, {name}", "ms", tuple(times),
                                          higher_is_better=False, config=config))
                    say(f"{config}, {name}: median {statistics.median(times):.3f} ms")
    say("")
    print_table(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
