"""What migration 049's workflow triggers cost a plain job's end: rows inserted into job_done
and job_history as the acks and archives write them, with the triggers on and off.

    python bench/trigger_cost.py [--rows 100000] [--batch 1024] [--rounds 5] [--database-url URL]

Each case inserts --rows rows in statements of --batch rows (one transaction per statement,
as an ack batch commits), then the tables are emptied; on and off alternate within each of
--rounds rounds (a shared machine's drift hits both), and the best round of each counts.
"Off" disables only 049's triggers (048's stay, as they are on in both). Last, the statement
trigger alone: --statements one-row inserts of a plain success, looped in the server (no round
trip's noise), with job_done's statement trigger on and off.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

from bench.common import bench_database, code_state, say, server_url

# job_done's rows: a plain success (no result), a plain job's stored result, a failure.
DONE = """
INSERT INTO job_done (seq, day, id, queue, actor, created_at, status, attempt, result, last_error)
SELECT g, current_date, gen_random_uuid(), 'q', 'a', now(), %(status)s, 1, %(result)s::jsonb, %(error)s
  FROM generate_series(%(first)s::bigint, %(first)s::bigint + %(n)s - 1) AS g
"""
# job_history's (an archive of job_queue's row): a plain job's options name no workflow.
HISTORY = """
INSERT INTO job_history (id, queue, actor, args, kwargs, options, status, finished_at, last_error)
SELECT gen_random_uuid(), 'q', 'a', '[]', '{}', '{"max_retries": 0}', %(status)s, now(), %(error)s
  FROM generate_series(1, %(n)s)
"""
CASES: dict[str, tuple[str, dict[str, object]]] = {
    "job_done succeeded": (DONE, {"status": "succeeded", "result": None, "error": None}),
    "job_done succeeded, a stored result": (DONE, {"status": "succeeded", "result": "1", "error": None}),
    "job_done failed": (DONE, {"status": "failed", "result": None, "error": "E: x"}),
    "job_history succeeded": (HISTORY, {"status": "succeeded", "error": None}),
    "job_history failed": (HISTORY, {"status": "failed", "error": "E: x"}),
}
TRIGGERS = ("job_done", "job_history", "job_history_succeeded", "job_history_failed", "job_history_cancelled")


def switch(conn: psycopg.Connection, on: bool) -> None:
    verb = "ENABLE" if on else "DISABLE"
    for table in TRIGGERS:
        for name in ("workflow_step_end", "workflow_ends_flush"):
            if conn.execute("SELECT 1 FROM pg_trigger WHERE tgrelid = %s::regclass AND tgname = %s",
                            (table, name)).fetchone():
                conn.execute(f"ALTER TABLE {table} {verb} TRIGGER {name}")


def run(conn: psycopg.Connection, statement: str, params: dict[str, object], rows: int, batch: int) -> float:
    """Microseconds per row."""
    began = time.perf_counter()
    done = 0
    while done < rows:
        n = min(batch, rows - done)
        conn.execute(statement, {**params, "n": n, "first": done + 1})  # autocommit: a transaction each
        done += n
    took = time.perf_counter() - began
    conn.execute("TRUNCATE job_done, job_history")
    return took / rows * 1e6


# One-row statements in a server-side loop: what the statement trigger costs each statement.
LOOP = """
DO $$ BEGIN FOR i IN 1..%s LOOP
    INSERT INTO job_done (seq, day, id, queue, actor, created_at, status, attempt)
    VALUES (i, current_date, gen_random_uuid(), 'q', 'a', now(), 'succeeded', 1);
END LOOP; END $$
"""


def statements(conn: psycopg.Connection, n: int) -> float:
    """Microseconds per one-row statement."""
    began = time.perf_counter()
    conn.execute(LOOP % int(n))
    took = time.perf_counter() - began
    conn.execute("TRUNCATE job_done")
    return took / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--statements", type=int, default=5000)
    parser.add_argument("--database-url")
    args = parser.parse_args()
    say(code_state())
    with bench_database(server_url(args.database_url)) as url, psycopg.connect(url, autocommit=True) as conn:
        best: dict[tuple[str, bool], float] = {}
        for _ in range(args.rounds):
            for name, (statement, params) in CASES.items():
                for on in (True, False):
                    switch(conn, on)
                    us = run(conn, statement, params, args.rows, args.batch)
                    best[name, on] = min(best.get((name, on), us), us)
        loop: dict[bool, float] = {}
        for _ in range(args.rounds):
            for on in (True, False):
                conn.execute(f"ALTER TABLE job_done {'ENABLE' if on else 'DISABLE'} TRIGGER workflow_ends_flush")
                us = statements(conn, args.statements)
                loop[on] = min(loop.get(on, us), us)
        switch(conn, True)
        say(f"{args.rows} rows in statements of {args.batch}, best of {args.rounds}, us per row")
        for name in CASES:
            with_, without = best[name, True], best[name, False]
            say(f"{name}: triggers on {with_:.2f}, off {without:.2f}, difference {with_ - without:+.2f}")
        say(f"{args.statements} one-row statements of a plain success, us each: statement trigger on"
            f" {loop[True]:.2f}, off {loop[False]:.2f}, difference {loop[True] - loop[False]:+.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
