"""What the days kept cost a claim of the job log: a steady stream claimed with only the
days the upkeep makes ahead, and with a week of past days more (the default retention of
succeeded jobs keeps seven), alternated round by round in one database.

    python bench/claim_days.py [--days 8] [--rounds 4] [--batches 100] [--batch 100]
                               [--database-url URL]

Each round empties the log, makes (or drops) the past days, then --batches times: a
producer connection appends --batch rows (joblog.LOG_INSERT, as db_floor.py builds them)
and a claimer takes them (joblog.LOG_CLAIM): each claim opens a new window, as claims do
under a stream, so its cursor knows when its snapshots were taken and reads only their
days (migration 041). Prints the claim's wall time and its backend's CPU a row, per side
(medians of the rounds); the two sides should be alike: a claim's cost must not grow with
the days kept.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.basics import Figure, cpu_seconds, print_table, say
from bench.common import bench_database, code_state, reset, server_url
from bench.db_floor import build_rows, log_claim, log_enqueue

# The past days' partitions (job_log's and job_done's), dropped between rounds.
DROP_PAST = """
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
              WHERE i.inhparent IN ('job_log'::regclass, 'job_done'::regclass) AND c.relname ~ '_d[0-9]{8}$'
                AND to_date(right(c.relname, 8), 'YYYYMMDD') < job_log_today() - 1 LOOP
        EXECUTE format('DROP TABLE %I', r.relname);
    END LOOP;
END $$
"""
ADD_PAST = "SELECT job_log_add_day(job_log_today() - k) FROM generate_series(2, %s + 1) AS k"


def one_round(url: str, past_days: int, batches: int, batch: int) -> tuple[float, float]:
    """(claim wall us a row, claim backend CPU us a row) of one stream."""
    with psycopg.connect(url, autocommit=True) as claimer, psycopg.connect(url, autocommit=True) as producer:
        claimer.execute(DROP_PAST)
        if past_days:
            claimer.execute(ADD_PAST, [past_days])
        reset(claimer)
        owner = str(uuid.uuid4())
        params = [build_rows(batch) for _ in range(batches + 1)]
        log_enqueue(producer, params[0])
        log_claim(claimer, batch, owner)  # the level's first window (no times yet), not timed
        pid = claimer.info.backend_pid
        cpu0, wall, rows = cpu_seconds(pid), 0.0, 0
        for p in params[1:]:
            log_enqueue(producer, p)
            t0 = time.perf_counter()
            rows += len(log_claim(claimer, batch, owner))
            wall += time.perf_counter() - t0
        cpu = cpu_seconds(pid) - cpu0
    if rows != batches * batch:
        raise SystemExit(f"claimed {rows} rows of {batches * batch}")
    return wall / rows * 1e6, cpu / rows * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--days", type=int, default=8, help="past days made on the 'week' side")
    p.add_argument("--rounds", type=int, default=4, help="rounds a side, alternated")
    p.add_argument("--batches", type=int, default=100)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--database-url", default=None)
    args = p.parse_args(argv)
    say(code_state())
    sides = {"today": 0, "week": args.days}
    runs: dict[str, list[tuple[float, float]]] = {s: [] for s in sides}
    with bench_database(server_url(args.database_url)) as url:
        for n in range(args.rounds):
            for side, days in sides.items():
                wall, cpu = one_round(url, days, args.batches, args.batch)
                runs[side].append((wall, cpu))
                say(f"round {n + 1} {side:>5} ({days} past days): claim {wall:.1f} us a row, backend CPU {cpu:.1f}")
    table = []
    for side, days in sides.items():
        config = f"{days} past days, claims of {args.batch}"
        table.append(Figure("claim wall a row", "us", tuple(r[0] for r in runs[side]), higher_is_better=False,
                            config=config))
        table.append(Figure("claim backend CPU a row", "us", tuple(r[1] for r in runs[side]),
                            higher_is_better=False, config=config))
    say("")
    print_table(table)
    week, today = (statistics.median(r[1] for r in runs[side]) for side in ("week", "today"))
    # a run too short for the kernel's CPU accounting reads 0 (a small smoke run): no ratio then
    ratio = f"{week / today:.2f}x" if today > 0 else "n/a (no CPU measured without past days: run longer)"
    say(f"\nbackend CPU with {args.days} past days over without (medians): {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
