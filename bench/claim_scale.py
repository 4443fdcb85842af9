"""The claim at scale: an empty table, 1M queued, + 2M finished, after a churn.

    python bench/claim_scale.py [--queued 1000000] [--finished 2000000] [--churn 200000]
                                [--n 16] [--rounds 15] [--per-round 10] [--variants old,new]
                                [--plans] [--locks] [--database-url URL]

Each variant gets two databases: a reference holding a near-empty table
(--empty-queued runnable rows) and a main one that goes through the states

  1. --queued pending jobs (INSERT ... SELECT generate_series, then VACUUM ANALYZE);
  2. + --finished 'succeeded' jobs (VACUUM ANALYZE again);
  3. a churn: --churn jobs drained by the CLAIM / FINISH loop the workers run
     (one autocommit statement each, --churn-batch rows per claim), measured at
     once, before any vacuum: the claim index holds the drained rows' dead entries;
  4. after the vacuum that follows a churn: "old" runs a plain VACUUM (what
     autovacuum does, a minute later at most), "new" runs the upkeep's own
     trigger (supervisor/worker/upkeep.py: n_dead_tup past the threshold);
  5. a steady stream: --slices x --slice jobs churned, each slice followed by
     that vacuum (autovacuum's skips the indexes when few heap pages changed).

Variant "old" is the schema without sql/runtime/025_jobs_bloat.sql (the bench
undoes it after migrating), "new" the schema with it. At every state the claim
(sql.claim(n), n rows, each run a transaction rolled back) is timed in rounds that
alternate between all four databases, so the machine's load drift hits every
figure alike; each figure is a median over rounds x per-round runs, reported
next to its variant's empty-table reference from the same rounds. Table and
index sizes, n_dead_tup, the claim's plan summary (index pages read) and, with
pgstattuple, the claim index's leaf pages and density are printed per state.

--locks adds the former lock phase on the last main database: locks held by an
open claim, and pg_locks sampled while 2 worker processes drain the queue.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import WorkerPool, bench_database, code_state, percentile, say, server_url
from supervisor import defaults
from supervisor.broker import PostgresBroker, sql
from supervisor.broker.consuming.completer import Finish, finish_params
from supervisor.broker.consuming.floors import SWEEP
from supervisor.broker.consuming.gates import first_turn
from supervisor.registry import Registration
from supervisor.worker.upkeep import Upkeep, UpkeepSettings

CHUNK = 250_000

# Queued jobs with a spread of run_at in the past, in claim order by insertion.
INSERT_QUEUED = """
INSERT INTO job_queue (queue, actor, run_at, created_at, max_attempts)
SELECT 'bench', 'noop', now() - interval '1 day' + g * interval '1 ms',
       now() - interval '1 day' + g * interval '1 ms', 1
  FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g
"""

# Finished jobs are older than the queued ones, as they would be in production (in
# job_history since 035: the claim no longer shares a table with them).
INSERT_FINISHED = """
INSERT INTO job_history (queue, actor, status, attempts, max_attempts, run_at, created_at, started_at,
                  finished_at, lease_owner)
SELECT 'bench', 'noop', 'succeeded', 1, 1, t, t, t, t + interval '5 ms', 'bench-history'
  FROM (SELECT now() - interval '9 days' + g * interval '1 ms' AS t
          FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g) AS s
"""

# The schema as it was before 025_jobs_bloat.sql (variant "old"): keep in step with it.
UNDO_025 = "ALTER TABLE job_queue RESET (vacuum_index_cleanup, vacuum_truncate)"

SIZES = """
SELECT c.relname, pg_relation_size(c.oid)
  FROM pg_class c
 WHERE c.relname = 'job_queue'
    OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'job_queue'::regclass)
 ORDER BY pg_relation_size(c.oid) DESC
"""

TABLE_STATS = """
SELECT n_live_tup, n_dead_tup, n_tup_upd, n_tup_hot_upd, vacuum_count, autovacuum_count
  FROM pg_stat_user_tables WHERE relid = 'job_queue'::regclass
"""

# One snapshot of the server's lock table, split into locks held by the other
# backends of this database (the workers) and everything else on the server
# (shared with other users). The sampling backend's own locks are left out.
LOCKS = """
WITH mine AS (SELECT pid FROM pg_stat_activity
               WHERE datname = current_database() AND pid <> pg_backend_pid())
SELECT count(*) FILTER (WHERE l.pid IN (SELECT pid FROM mine)),
       count(*) FILTER (WHERE l.pid <> pg_backend_pid()),
       coalesce(string_agg(DISTINCT l.locktype || '/' || l.mode, ', ')
                FILTER (WHERE l.pid IN (SELECT pid FROM mine)), '-')
  FROM pg_locks l
"""


def mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def fill(conn: psycopg.Connection, statement: str, total: int, what: str) -> None:
    started = time.monotonic()
    for lo in range(1, total + 1, CHUNK):
        hi = min(total, lo + CHUNK - 1)
        conn.execute(statement, {"lo": lo, "hi": hi})
    say(f"  {total:,} {what} rows in {time.monotonic() - started:.1f}s")


def vacuum(conn: psycopg.Connection, options: str = "ANALYZE") -> float:
    started = time.monotonic()
    conn.execute(f"VACUUM ({options}) job_queue")
    return time.monotonic() - started


def claim_params(n: int, owner: str = "claim-scale-probe") -> dict:
    return {"queue": "bench", "n": n, "owner": owner, "lease_s": 30.0, "relaxed": False, **SWEEP, **first_turn(n), "actors": [],
            "actor_max_attempts": [], "actor_max_losses": [], "default_max_attempts": 21, "default_max_losses": 3}


def plan(conn: psycopg.Connection, n: int) -> list[str]:
    with conn.transaction():
        lines = [r[0] for r in conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql.claim(n), claim_params(n)).fetchall()]
        raise psycopg.Rollback()
    return lines


def plan_summary(lines: list[str]) -> str:
    """The claim index scan's buffers and the execution time: what dead entries cost."""
    out = []
    for i, line in enumerate(lines):
        if "Index Scan using jobs_claim" in line:
            rows = line.split("actual time=")[-1].rstrip(")")
            buffers = next((x.strip() for x in lines[i + 1:i + 5] if "Buffers:" in x), "Buffers: ?")
            out.append(f"jobs_claim scan {rows}, {buffers}")
        if "Execution Time" in line or "Planning Time" in line:
            out.append(line.strip())
    return "; ".join(out) or "(no jobs_claim index scan in the plan)"


def time_claims(conn: psycopg.Connection, n: int, runs: int) -> list[float]:
    """Client-side time of the CLAIM (execute + fetch) in ms, each run rolled back."""
    times = []
    for _ in range(runs):
        with conn.transaction():
            started = time.perf_counter()
            rows = conn.execute(sql.claim(n), claim_params(n)).fetchall()
            times.append((time.perf_counter() - started) * 1000)
            if len(rows) != n:
                raise RuntimeError(f"claim returned {len(rows)} rows, expected {n}")
            raise psycopg.Rollback()
    return times


def churn(conn: psycopg.Connection, total: int, batch: int, *, quiet: bool = False) -> float:
    """Drain ``total`` jobs as the workers do: a committed CLAIM, then a committed FINISH."""
    started = time.monotonic()
    done = 0
    while done < total:
        size = min(batch, total - done)
        rows = conn.execute(sql.claim(size), claim_params(size, owner="churn")).fetchall()
        if not rows:
            break
        conn.execute(sql.FINISH, finish_params("churn", [Finish(str(r[0]), r[4], "succeeded") for r in rows]))
        done += len(rows)
    elapsed = time.monotonic() - started
    if not quiet:
        say(f"  churn: {done:,} jobs claimed and acked in {elapsed:.1f}s ({done / elapsed:,.0f} jobs/s)")
    return elapsed


@dataclass
class Db:
    """One bench database: a variant's empty reference or its main table."""

    variant: str
    role: str  # "empty" or "main"
    url: str
    conn: psycopg.Connection
    times: list[float] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.variant}/{self.role}"

    def sizes(self) -> str:
        rows = self.conn.execute(SIZES).fetchall()
        total = sum(size for _, size in rows)
        live, dead, upd, hot, vacs, autovacs = self.conn.execute(TABLE_STATS).fetchone()
        parts = ", ".join(f"{name} {mb(size)}" for name, size in rows)
        hot_pct = f"{100 * hot / upd:.0f} %" if upd else "-"
        return (f"total {mb(total)} ({parts}); n_live_tup {live:,}, n_dead_tup {dead:,}, "
                f"HOT updates {hot_pct} of {upd:,}, vacuums {vacs} + autovacuums {autovacs}")

    def claim_index(self) -> str:
        try:
            leaf, empty, deleted, density = self.conn.execute(
                "SELECT leaf_pages, empty_pages, deleted_pages, avg_leaf_density FROM pgstatindex('jobs_claim')"
            ).fetchone()
        except psycopg.Error:
            return "pgstattuple not available"
        return f"jobs_claim: {leaf:,} leaf pages ({density:.0f} % full), {empty} empty, {deleted} deleted"


def upkeep_of(url: str, stack: contextlib.ExitStack) -> Upkeep:
    """A worker's upkeep on ``url`` (not started): its vacuum is the "new" variant's, with
    no minimum time since the last."""
    broker = PostgresBroker(url, pool_size=1, listen_url="")
    stack.callback(broker.close)
    registration = Registration(broker.pool, broker.owner, role="bench", queues=[])
    return Upkeep(broker, registration, settings=UpkeepSettings(vacuum_min_seconds=0), state=lambda: "running")


def open_db(url: str, variant: str, role: str) -> Db:
    conn = psycopg.connect(url, autocommit=True)
    if variant == "old":
        conn.execute(UNDO_025)
    with contextlib.suppress(psycopg.Error):
        conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
    return Db(variant, role, url, conn)


def measure(dbs: list[Db], state: str, args: argparse.Namespace, results: list[tuple[str, str]]) -> None:
    """Alternating rounds over every database, then one line per variant."""
    say(f"== {state} (load average {os.getloadavg()[0]:.1f})")
    for db in dbs:
        db.times = []
        time_claims(db.conn, args.n, 5)  # warm: prepared statement, cache
    for r in range(args.rounds):
        order = dbs[r % len(dbs):] + dbs[:r % len(dbs)]
        for db in order:
            db.times += time_claims(db.conn, args.n, args.per_round)
    for variant in sorted({db.variant for db in dbs}):
        empty, main = (next(d for d in dbs if d.variant == variant and d.role == role) for role in ("empty", "main"))
        e, m = statistics.median(empty.times), statistics.median(main.times)
        say(f"  {variant}: CLAIM n={args.n} median {m:.3f} ms (p90 {percentile(main.times, 90):.3f}), "
            f"empty table {e:.3f} ms -> {100 * (m / e - 1):+.0f} %")
        say(f"    {main.sizes()}")
        say(f"    {main.claim_index()}")
        lines = plan(main.conn, args.n)
        say(f"    plan: {plan_summary(lines)}; empty table: {plan_summary(plan(empty.conn, args.n))}")
        if args.plans:
            for line in lines:
                say(f"      {line}")
        results.append((f"{state} [{variant}]", f"{m:.3f} ms vs empty {e:.3f} ms ({100 * (m / e - 1):+.0f} %)"))


def explain_prune(db: Db) -> None:
    """The row-wise prune (sql.PRUNE_ROWS: what no whole day's drop covers) must stop at
    its batch, never scan the history."""
    with db.conn.transaction():
        lines = [r[0] for r in db.conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS) " + sql.PRUNE_ROWS,
            {"status": "succeeded", "older_than_s": 0, "limit": defaults.PRUNE_BATCH}).fetchall()]
        raise psycopg.Rollback()
    scans = [x.strip() for x in lines if "Scan" in x and " on job_history" in x]
    took = next((x.strip() for x in lines if "Execution Time" in x), "?")
    say(f"  PRUNE_ROWS of {defaults.PRUNE_BATCH:,} succeeded rows ({db.variant}): {took};"
        f" history scans: {'; '.join(scans)}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--queued", type=int, default=1_000_000)
    p.add_argument("--finished", type=int, default=2_000_000)
    p.add_argument("--empty-queued", type=int, default=1_000, help="runnable rows of the empty-table reference")
    p.add_argument("--churn", type=int, default=200_000, help="jobs drained by the claim/ack loop")
    p.add_argument("--slices", type=int, default=10, help="stream phase: churn slices, each then vacuumed")
    p.add_argument("--slice", type=int, default=20_000, help="stream phase: jobs per slice")
    p.add_argument("--churn-batch", type=int, default=16, help="rows per claim of the churn")
    p.add_argument("--n", type=int, default=16, help="rows per timed claim (a worker's thread count)")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--per-round", type=int, default=10)
    p.add_argument("--variants", default="old,new", help="old (without 025_jobs_bloat.sql), new, or both")
    p.add_argument("--plans", action="store_true", help="print every claim plan in full")
    p.add_argument("--locks", action="store_true", help="also sample pg_locks while 2 workers drain")
    p.add_argument("--threads", type=int, default=16, help="threads per worker process in the lock phase")
    p.add_argument("--database-url", default=None,
                   help="server to create the bench databases on (default $DATABASE_URL, else local)")
    args = p.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]

    results: list[tuple[str, str]] = []
    say(code_state())
    with contextlib.ExitStack() as stack:
        dbs: list[Db] = []
        for variant in variants:
            for role in ("empty", "main"):
                url = stack.enter_context(bench_database(server_url(args.database_url), prefix="as_scale"))
                db = open_db(url, variant, role)
                stack.callback(db.conn.close)
                dbs.append(db)
        mains = [d for d in dbs if d.role == "main"]
        for db in dbs:
            fill(db.conn, INSERT_QUEUED, args.empty_queued if db.role == "empty" else args.queued,
                 f"{db.label} queued")
            vacuum(db.conn)

        measure(dbs, f"{args.queued:,} queued", args, results)
        for db in mains:
            fill(db.conn, INSERT_FINISHED, args.finished, f"{db.label} finished")
            say(f"  {db.label}: VACUUM (ANALYZE) in {vacuum(db.conn):.1f}s")
        measure(dbs, f"{args.queued:,} queued + {args.finished:,} finished", args, results)
        for db in mains:
            explain_prune(db)

        for db in mains:
            say(f"{db.label}:")
            churn(db.conn, args.churn, args.churn_batch)
        measure(dbs, f"after a churn of {args.churn:,}, no vacuum yet", args, results)

        upkeeps = {db.label: upkeep_of(db.url, stack) for db in mains if db.variant == "new"}
        for db in mains:
            started = time.monotonic()
            if db.variant == "new":
                dead = upkeeps[db.label].vacuum()
                what = "upkeep vacuum " + (f"of {dead:,} dead tuples" if dead is not None
                                           else "did not run (below the threshold, or locked)")
            else:
                vacuum(db.conn, "ANALYZE")
                what = "plain VACUUM (ANALYZE), as autovacuum would"
            say(f"  {db.label}: {what} in {time.monotonic() - started:.1f}s")
        measure(dbs, "after the churn and its vacuum", args, results)

        # A steady stream: slices of churn, each followed by the vacuum that would follow
        # it (old: autovacuum's, which skips the indexes when few heap pages changed).
        for db in mains:
            for _ in range(args.slices):
                churn(db.conn, args.slice, args.churn_batch, quiet=True)
                if db.variant == "new":
                    upkeeps[db.label].vacuum()
                else:
                    vacuum(db.conn, "ANALYZE")
            say(f"  {db.label}: {args.slices} x ({args.slice:,} jobs churned, then vacuumed)")
        measure(dbs, f"a stream: {args.slices} x {args.slice:,} churned and vacuumed", args, results)

        if args.locks:
            lock_phase(mains[-1], args, results)

    say("")
    say(f"summary (CLAIM n={args.n}, median of {args.rounds} x {args.per_round} runs, alternating databases)")
    width = max(len(k) for k, _ in results)
    for key, value in results:
        say(f"  {key.ljust(width)}  {value}")
    return 0


def queued(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT count(*) FROM jobs WHERE status IN ('pending', 'retryable')").fetchone()[0]


def held_claim(url: str, conn: psycopg.Connection, n: int) -> int:
    """Claim n rows in a transaction left open, count that backend's locks from
    another connection, then roll back: FOR UPDATE row locks live in the rows
    themselves, so the count does not grow with n."""
    with psycopg.connect(url) as holder:
        holder.execute(sql.claim(n), claim_params(n)).fetchall()
        count = conn.execute("SELECT count(*) FROM pg_locks WHERE pid = %s", (holder.info.backend_pid,)).fetchone()[0]
        holder.rollback()
    return count


def lock_phase(db: Db, args: argparse.Namespace, results: list[tuple[str, str]]) -> None:
    small, large = held_claim(db.url, db.conn, args.n), held_claim(db.url, db.conn, 10_000)
    results.append((f"locks held by an open claim of {args.n} / 10,000 rows", f"{small} / {large}"))
    say(f"starting 2 worker processes x {args.threads} threads on the queue of {queued(db.conn):,}")
    seen: list[int] = []
    with WorkerPool(db.url, count=2, threads=args.threads):
        time.sleep(1.0)  # let the drain reach its steady state
        for _ in range(100):
            seen.append(db.conn.execute(LOCKS).fetchone()[0])
            time.sleep(0.05)
    results.append(("pg_locks of 2 claiming workers (min..max)", f"{min(seen)}..{max(seen)} over {len(seen)} samples"))


if __name__ == "__main__":
    sys.exit(main())
