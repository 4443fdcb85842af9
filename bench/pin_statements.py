"""What each job-path statement costs the server under a pinned xmin horizon, over time,
with no worker around them (issue 18 item 3): which statement grows, and by how much.

    python bench/pin_statements.py [--rate 6000] [--batch 60] [--before 30] [--pin 60]
                                   [--window 10] [--vacuum 10]

A steady stream, as pressure.py's at --rate jobs/s but statement by statement: every
round enqueues --batch rows (``sql.INSERT_MANY``, one connection), claims up to the same
number plus a few (``sql.claim``, a second connection) and finishes what it claimed
(``sql.FINISH``, a third), paced to --rate; the live table is vacuumed every --vacuum s as
the workers' upkeep does (a fourth connection), and the claim floors' StragglerProbe runs
every 2 s (a fifth). After --before s a session opens
``BEGIN; SELECT txid_current()`` and holds it for --pin s. Per --window s: rounds/s, each
statement's backend CPU per row (/proc), the claim's and FINISH's p50 / p99 wall time, and
the live table's dead tuples and size, the vacuums' wall time; at the end of each phase, the buffers one claim and
one FINISH touch (``EXPLAIN (ANALYZE, BUFFERS)``, rolled back).

``--jobs keyed``: each row a dedupe key of its own and one of 50 concurrency keys (limit 1,
as pressure.py's keyed shape): the rows wait for their key and the claim is the keyed one
(sql/flow.py), its turn cursor kept between claims as a worker's gates keep it.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.basics import cpu_seconds
from bench.common import bench_database, code_state, percentile, say, server_url
from bench.db_floor import QUEUE, build_rows, claim_params, enqueue_rows, finish_rows
from supervisor import db
from supervisor.broker import sql
from supervisor.broker.consuming.floors import (
    HELD_SLACK_SECONDS,
    SLACK_SECONDS,
    SWEEP,
    SWEEP_SECONDS,
    ClaimFloors,
    StragglerProbe,
    SweepSignal,
)

# --jobs keyed: concurrency keys taken in turn, one running each (pressure.py's CONCURRENCY_KEYS).
KEYS = 50


def build_keyed(n: int, turn: list[int]) -> list[Any]:
    """build_rows' parameters with a dedupe key per row and a concurrency key each (limit 1)."""
    params = build_rows(n)
    params[10] = [f"once:{uuid.uuid4()}" for _ in range(n)]  # dedupe_key (sql.BULK_COLUMNS' 10th)
    keys = [f"account:{(turn[0] + i) % KEYS}" for i in range(n)]
    turn[0] += n
    params[-2], params[-1] = keys, [json.dumps({"c": 1})] * n  # sql.FLOW_COLUMNS
    return params


GAUGE = "SELECT n_dead_tup, pg_total_relation_size('job_queue') FROM pg_stat_user_tables WHERE relname = 'job_queue'"


class Window:
    def __init__(self, pids: dict[str, int]) -> None:
        self.pids, self.at = pids, time.monotonic()
        self.cpu = {k: cpu_seconds(p) for k, p in pids.items()}
        self.rows = self.rounds = 0
        self.claim_s: list[float] = []
        self.finish_s: list[float] = []
        self.vacuum_s = 0.0  # the upkeep's vacuums in the window, wall time
        self.probe_s: list[float] = []  # the probe's rounds (horizon and stragglers)

    def line(self, label: str, gauge: tuple[Any, ...]) -> str:
        seconds = time.monotonic() - self.at

        def ms(values: list[float], p: float) -> float:
            return percentile(values, p) * 1e3 if values else 0.0

        per_row = {k: (cpu_seconds(p) - self.cpu[k]) / max(self.rows, 1) * 1e6 for k, p in self.pids.items()}
        return (f"{label:<8} {self.rounds / seconds:>8,.0f} {self.rows / seconds:>8,.0f} "
                f"{per_row['enqueue']:>8.1f} {per_row['claim']:>8.1f} {per_row['finish']:>8.1f} "
                f"{ms(self.claim_s, 50):>7.2f} {ms(self.claim_s, 99):>7.2f} "
                f"{ms(self.finish_s, 50):>7.2f} {ms(self.finish_s, 99):>7.2f} "
                f"{gauge[0]:>10,} {gauge[1] / 1e6:>7.1f} {self.vacuum_s * 1e3:>8.0f} {ms(self.probe_s, 100):>8.1f}")


HEADER = (f"{'phase':<8} {'rounds/s':>8} {'rows/s':>8} {'enq us':>8} {'claim us':>8} {'fin us':>8} "
          f"{'cl p50':>7} {'cl p99':>7} {'fin p50':>7} {'fin p99':>7} {'dead':>10} {'MB':>7} {'vac ms':>8} {'probe ms':>8}"
          "  (us: backend CPU per row; p, vac, the longest probe: ms)")


class Claims:
    """The worker's claim: sql.claim with the process's floors (broker/consuming/floors.py), and the
    process's own StragglerProbe every SWEEP_SECONDS (here on a connection of its own, in
    line): the horizon's age, which sets the floors' slack, and whether a row waits behind
    a floor (then the next claim sweeps), as in a worker.
    ``floors=False``: every claim reads each level from its start."""

    def __init__(self, url: str, owner: str, floors: bool, slack: float, held_slack: float,
                 keyed: bool = False) -> None:
        self.owner = owner
        self.keyed = keyed
        self.cursor = ""  # the keyed claim's turn cursor (broker/consuming/gates.py)
        self.floors = ClaimFloors(slack=slack, held_slack=held_slack) if floors else None
        self.pool = db.make_pool(url, min_size=1, max_size=1, name="probe")
        self.pool.open()
        self.probe = StragglerProbe(self.pool, self.floors) if self.floors is not None else None
        if self.probe is not None and self.floors is not None:
            self.probe.watch(QUEUE, SweepSignal(self.floors, QUEUE, threading.Event()))
        self.probed_at = 0.0
        self.sweeps = 0

    def params(self, batch: int) -> tuple[dict[str, Any], bool]:
        floors, sweep = self.floors.params(QUEUE) if self.floors is not None else (SWEEP, True)
        params = claim_params(batch, self.owner)
        return {**params, "cursor": self.cursor, **floors}, sweep

    def claim(self, conn: psycopg.Connection, batch: int) -> list[Any]:
        params, sweep = self.params(batch)
        began = time.monotonic()
        rows = conn.execute(sql.claim(batch, keyed=self.keyed), params).fetchall()
        if rows and rows[0][0] is None:  # the keyed claim's META row
            self.cursor = rows.pop(0)[sql.CURSOR_COLUMN] or self.cursor
        if self.floors is not None:
            self.floors.claimed(QUEUE, rows, sweep, time.monotonic() - began)
        self.sweeps += sweep
        return rows

    def due_probe(self) -> bool:
        """The probe's round, if it is time; whether it was."""
        if self.probe is None or time.monotonic() - self.probed_at < SWEEP_SECONDS:
            return False
        self.probed_at = time.monotonic()
        self.probe.check()
        return True

    def close(self) -> None:
        self.pool.close()


def explain(conn: psycopg.Connection, claims: Claims, batch: int) -> str:
    """Buffers one claim touches, inside a transaction rolled back."""
    with conn.transaction(force_rollback=True):
        params, sweep = claims.params(batch)
        plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql.claim(batch, keyed=claims.keyed), params)
        top = plan.fetchone()[0][0]
        return (f"claim{' (sweep)' if sweep else ''}: {top['Execution Time']:.2f} ms, shared hit "
                f"{top['Plan'].get('Shared Hit Blocks', 0):,} read {top['Plan'].get('Shared Read Blocks', 0):,}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=6000)
    p.add_argument("--batch", type=int, default=60)
    p.add_argument("--before", type=float, default=30)
    p.add_argument("--pin", type=float, default=60)
    p.add_argument("--window", type=float, default=10)
    p.add_argument("--vacuum", type=float, default=10)
    p.add_argument("--no-floors", action="store_true", help="claims read every level from its start")
    p.add_argument("--jobs", choices=("plain", "keyed"), default="plain",
                   help="keyed: a dedupe key each and one of 50 concurrency keys (limit 1)")
    p.add_argument("--slack", type=float, default=SLACK_SECONDS, help="the floors' slack while the horizon moves (s)")
    p.add_argument("--held-slack", type=float, default=HELD_SLACK_SECONDS, help="... and while it is held (s)")
    p.add_argument("--database-url", default=None)
    args = p.parse_args(argv)
    say(code_state())
    with bench_database(server_url(args.database_url)) as url:
        conns = {k: psycopg.connect(url, autocommit=True) for k in ("enqueue", "claim", "finish", "upkeep", "pin")}
        pids = {k: c.info.backend_pid for k, c in conns.items() if k in ("enqueue", "claim", "finish")}
        owner = str(uuid.uuid4())
        keyed = args.jobs == "keyed"
        claims = Claims(url, owner, floors=not args.no_floors, slack=args.slack, held_slack=args.held_slack,
                        keyed=keyed)
        turn = [0]
        period = args.batch / args.rate
        say(f"{args.rate:,.0f} rows/s in rounds of {args.batch}; {args.before:.0f} s, then {args.pin:.0f} s pinned")
        say(HEADER)
        t0 = time.monotonic()
        next_round = next_vacuum = t0
        window = Window(pids)
        phase = "before"
        while (now := time.monotonic()) < t0 + args.before + args.pin:
            if phase == "before" and now >= t0 + args.before:
                if window.rounds:  # none when the last window ended just now
                    say(window.line(phase, conns["upkeep"].execute(GAUGE).fetchone()))
                conns["upkeep"].execute("ANALYZE job_queue")
                say("  " + explain(conns["upkeep"], claims, args.batch + 4) + f"; {claims.sweeps} sweeps so far")
                xid = conns["pin"].execute("BEGIN").execute("SELECT txid_current()").fetchone()[0]
                say(f"pin: transaction {xid} open")
                phase, window = "pinned", Window(pids)
            if now >= next_vacuum:
                began = time.monotonic()
                conns["upkeep"].execute(sql.VACUUM_JOBS)
                window.vacuum_s += time.monotonic() - began
                next_vacuum = now + args.vacuum
            enqueue_rows(conns["enqueue"], build_keyed(args.batch, turn) if keyed else build_rows(args.batch))
            began = time.monotonic()
            if claims.due_probe():
                window.probe_s.append(time.monotonic() - began)
            began = time.monotonic()
            rows = claims.claim(conns["claim"], args.batch + 4)
            window.claim_s.append(time.monotonic() - began)
            if rows:
                began = time.monotonic()
                finish_rows(conns["finish"], owner, rows)
                window.finish_s.append(time.monotonic() - began)
            window.rows += len(rows)
            window.rounds += 1
            if time.monotonic() - window.at >= args.window:
                say(window.line(phase, conns["upkeep"].execute(GAUGE).fetchone()))
                window = Window(pids)
            next_round += period
            time.sleep(max(0.0, next_round - time.monotonic()))
        say(window.line(phase, conns["upkeep"].execute(GAUGE).fetchone()))
        say("  " + explain(conns["upkeep"], claims, args.batch + 4) + f"; {claims.sweeps} sweeps so far")
        conns["pin"].rollback()
        claims.close()
        for c in conns.values():
            c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
