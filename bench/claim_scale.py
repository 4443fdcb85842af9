"""The claim at scale: 1,000,000 queued jobs (and ~1,000,000 finished ones).

    python bench/claim_scale.py [--queued 1000000] [--finished 1000000] [--n 16]
                                [--runs 50] [--database-url URL]

1. Fills a fresh database with --queued pending jobs (INSERT ... SELECT
   generate_series), then prints EXPLAIN (ANALYZE, BUFFERS) of the CLAIM
   statement of supervisor/queries/jobs.py and its median time over --runs runs.
   Each run is a transaction that is rolled back, so the queue stays as it was.
2. Adds --finished 'succeeded' rows and does the same again: the plan and the
   time should not change, because finished rows are not in the claim index.
3. Starts 2 worker processes that drain the queue through real claims while
   1M jobs wait, and samples pg_locks a few times: the count stays small and
   constant (a relation lock or two per open transaction), never one per job.
4. Measures the claim again after the workers' drain, then drops the database.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import WorkerPool, bench_database, code_state, percentile, say, server_url  # noqa: E402
from supervisor.broker import sql  # noqa: E402

CHUNK = 250_000

# Queued jobs with a spread of run_at in the past, in claim order by insertion.
INSERT_QUEUED = """
INSERT INTO jobs (queue, actor, run_at, created_at, max_attempts)
SELECT 'bench', 'noop', now() - interval '1 day' + g * interval '1 ms',
       now() - interval '1 day' + g * interval '1 ms', 1
  FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g
"""

INSERT_FINISHED = """
INSERT INTO jobs (queue, actor, status, attempts, max_attempts, run_at, created_at, started_at,
                  finished_at, lease_owner)
SELECT 'bench', 'noop', 'succeeded', 1, 1, t, t, t, t + interval '5 ms', 'bench-history'
  FROM (SELECT now() - interval '2 days' + g * interval '1 ms' AS t
          FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g) AS s
"""

SIZES = """
SELECT c.relname, pg_size_pretty(pg_relation_size(c.oid))
  FROM pg_class c
 WHERE c.relname = 'jobs'
    OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'jobs'::regclass)
 ORDER BY pg_relation_size(c.oid) DESC
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


def fill(conn: psycopg.Connection, statement: str, total: int, what: str) -> None:
    started = time.monotonic()
    for lo in range(1, total + 1, CHUNK):
        hi = min(total, lo + CHUNK - 1)
        conn.execute(statement, {"lo": lo, "hi": hi})
        say(f"  ... {hi:,}/{total:,} {what} rows ({time.monotonic() - started:.1f}s)")


def vacuum(conn: psycopg.Connection) -> None:
    started = time.monotonic()
    conn.execute("VACUUM (ANALYZE) jobs")
    say(f"  VACUUM (ANALYZE) jobs in {time.monotonic() - started:.1f}s")


def claim_params(n: int) -> dict:
    return {"queue": "bench", "n": n, "owner": "claim-scale-probe", "lease_s": 30.0, "actors": [],
            "actor_max_attempts": [], "actor_max_losses": [], "default_max_attempts": 21, "default_max_losses": 3}


def explain(conn: psycopg.Connection, n: int) -> None:
    with conn.transaction():
        plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql.CLAIM, claim_params(n)).fetchall()
        raise psycopg.Rollback()
    for (line,) in plan:
        say(f"    {line}")


def time_claims(conn: psycopg.Connection, n: int, runs: int) -> list[float]:
    """Client-side time of the CLAIM (execute + fetch) in ms, each run rolled back."""
    times = []
    for _ in range(runs):
        with conn.transaction():
            started = time.perf_counter()
            rows = conn.execute(sql.CLAIM, claim_params(n)).fetchall()
            times.append((time.perf_counter() - started) * 1000)
            if len(rows) != n:
                raise RuntimeError(f"claim returned {len(rows)} rows, expected {n}")
            raise psycopg.Rollback()
    return times


def report_claim(conn: psycopg.Connection, label: str, n: int, runs: int) -> float:
    say(f"EXPLAIN (ANALYZE, BUFFERS) of CLAIM (n={n}) — {label}:")
    explain(conn, n)
    times = time_claims(conn, n, runs)
    median = statistics.median(times)
    say(f"CLAIM n={n} over {runs} runs ({label}): median {median:.3f} ms, "
        f"p90 {percentile(times, 90):.3f} ms, min {min(times):.3f} ms, max {max(times):.3f} ms")
    return median


def counts(conn: psycopg.Connection) -> str:
    rows = conn.execute("SELECT status, count(*) FROM jobs GROUP BY status ORDER BY status").fetchall()
    return ", ".join(f"{s} {c:,}" for s, c in rows)


def queued(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT count(*) FROM jobs WHERE status IN ('pending', 'retryable')").fetchone()[0]


def sample_locks(conn: psycopg.Connection, samples: int, every: float) -> list[int]:
    """Sample the lock table while the workers claim; return the workers' counts."""
    seen: list[int] = []
    before = queued(conn)
    started = time.monotonic()
    show = max(1, samples // 8)
    for i in range(samples):
        ours, server, kinds = conn.execute(LOCKS).fetchone()
        new_high = ours > max(seen, default=-1)
        seen.append(ours)
        if i % show == 0 or new_high:
            running = conn.execute("SELECT count(*) FROM jobs WHERE status = 'running'").fetchone()[0]
            say(f"  sample {i + 1:3d}: pg_locks held by the workers' backends = {ours:3d} "
                f"(whole server, other users included: {server:3d}); running jobs {running}; kinds: {kinds}")
        time.sleep(every)
    elapsed = time.monotonic() - started
    after = queued(conn)
    histogram = ", ".join(f"{v} locks x{seen.count(v)}" for v in sorted(set(seen)))
    say(f"  {samples} samples over {elapsed:.1f}s: {histogram}")
    say(f"  the workers claimed {before - after:,} jobs meanwhile ({(before - after) / elapsed:,.0f} jobs/s) "
        f"with {after:,} still queued")
    return seen


def held_claim(url: str, conn: psycopg.Connection, n: int) -> int:
    """Claim n rows in a transaction left open, count that backend's locks
    from another connection, then roll back: FOR UPDATE row locks live in the
    rows themselves, so the count does not grow with n."""
    with psycopg.connect(url) as holder:
        holder.execute(sql.CLAIM, claim_params(n)).fetchall()
        pid = holder.info.backend_pid
        count, kinds = conn.execute(
            "SELECT sum(n), string_agg(kind || ' x' || n, ', ' ORDER BY kind) FROM "
            "(SELECT locktype || '/' || mode AS kind, count(*) AS n FROM pg_locks WHERE pid = %s GROUP BY 1) k",
            (pid,),
        ).fetchone()
        holder.rollback()
    say(f"  an open claim of {n:,} rows holds {count} locks: {kinds}")
    return count


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--queued", type=int, default=1_000_000)
    p.add_argument("--finished", type=int, default=1_000_000)
    p.add_argument("--n", type=int, default=16, help="rows per claim (a worker's thread count)")
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--threads", type=int, default=16, help="threads per worker process in the lock phase")
    p.add_argument("--samples", type=int, default=100, help="pg_locks samples, 50 ms apart")
    p.add_argument("--database-url", default=None,
                   help="server to create the bench database on (default $DATABASE_URL, else local)")
    args = p.parse_args(argv)

    results: list[tuple[str, str]] = []
    with bench_database(server_url(args.database_url), prefix="as_scale") as url, \
            psycopg.connect(url, autocommit=True) as conn:
        limit = conn.execute(
            "SELECT current_setting('max_locks_per_transaction')::int * "
            "(current_setting('max_connections')::int + current_setting('max_prepared_transactions')::int)"
        ).fetchone()[0]
        say(f"server lock table: {limit:,} slots (max_locks_per_transaction x connections)")
        say(code_state())

        say(f"inserting {args.queued:,} queued jobs")
        fill(conn, INSERT_QUEUED, args.queued, "queued")
        vacuum(conn)
        say(f"jobs: {counts(conn)}")
        median_a = report_claim(conn, f"{args.queued:,} queued", args.n, args.runs)
        results.append((f"CLAIM median, {args.queued:,} queued", f"{median_a:.3f} ms"))

        say(f"inserting {args.finished:,} finished (succeeded) jobs")
        fill(conn, INSERT_FINISHED, args.finished, "finished")
        vacuum(conn)
        say(f"jobs: {counts(conn)}")
        say("sizes: " + ", ".join(f"{name} {size}" for name, size in conn.execute(SIZES).fetchall()))
        median_b = report_claim(conn, f"{args.queued:,} queued + {args.finished:,} finished", args.n, args.runs)
        results.append((f"CLAIM median, + {args.finished:,} finished", f"{median_b:.3f} ms"))

        say("locks of one claim transaction held open (1 claim = a fixed set of relation locks):")
        small = held_claim(url, conn, args.n)
        large = held_claim(url, conn, 10_000)
        results.append((f"locks held by an open claim of {args.n} / 10,000 rows", f"{small} / {large}"))

        say(f"starting 2 worker processes x {args.threads} threads on the queue of {queued(conn):,}")
        idle = conn.execute(LOCKS).fetchone()[0]
        with WorkerPool(url, count=2, threads=args.threads):
            time.sleep(1.0)  # let the drain reach its steady state
            seen = sample_locks(conn, args.samples, every=0.05)
            busy = statistics.median(time_claims(conn, args.n, args.runs))
            say(f"  CLAIM n={args.n} median {busy:.3f} ms over {args.runs} runs with the 2 workers claiming alongside")
        say(f"jobs after the workers stopped: {counts(conn)}")
        results.append(("pg_locks of the workers, before they start", str(idle)))
        results.append(("pg_locks of 2 claiming workers (min..max)",
                        f"{min(seen)}..{max(seen)} over {len(seen)} samples, ~1M queued"))
        results.append(("CLAIM median, during the drain", f"{busy:.3f} ms"))
        median_c = report_claim(conn, "after the drain (dead index entries, before autovacuum)", args.n, args.runs)
        results.append(("CLAIM median, after the drain", f"{median_c:.3f} ms"))

    say("")
    say("summary")
    width = max(len(k) for k, _ in results)
    for key, value in results:
        say(f"  {key.ljust(width)}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
