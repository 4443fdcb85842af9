"""A soak: a steady stream of no-op jobs for a long time, retention on; a minute-by-minute timeline.

    python bench/soak.py [--minutes 30] [--rate JOBS_PER_S] [--processes 2] [--threads 8]
                         [--retention 60] [--warmup SECONDS] [--database-url URL]

1. Without --rate, measures W1 first (bench_broker.w1: 20,000 no-op jobs, 2 x 8 threads)
   and streams at half its drain rate.
2. Starts --processes real `supervisor worker` processes with a config file whose
   `retention:` keeps finished jobs, events and results --retention seconds, so the
   upkeep prunes for real (every retention / 4 seconds) and vacuums jobs when its
   dead tuples pile up.
3. A producer thread enqueues the stream with `broker.enqueue_many` every 20 ms (on a
   fixed schedule: a slow call does not shift the rest). After --warmup seconds (the
   first retention period plus a prune: the table reaches its steady size), the
   timeline runs for --minutes. Each second the sampler records:
   - throughput: jobs finished in the last second (finished_at, read 2 s behind so
     every ack of that second has committed, long before retention prunes it);
   - enqueue-to-start: started_at - created_at of those jobs (created_at is the
     producer's INSERT, started_at the claim; both the database clock), kept as a
     0.1 ms histogram so each minute's p99 is exact;
   - claim p99: no pg_stat_statements here, so a probe: 5 CLAIMs of 16 rows a
     second on the live queue, each rolled back (it holds rows for about a
     millisecond; the workers skip them), timed by the client. It steps over the
     same dead index entries the workers' claims do;
   - n_dead_tup of jobs, the table's and its indexes' size, vacuum counts.
4. Prints the timeline and the first-5 vs last-5 minute comparison against the
   target: last 5 within 10 % of the first 5 on throughput and both p99s, sizes flat.
   (With under 10 minutes, the windows are minutes // 2 long.)
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_broker import w1  # noqa: E402
from bench.common import WorkerPool, bench_database, code_state, reset, say, server_url  # noqa: E402
from supervisor.broker import sql  # noqa: E402
from supervisor.config import load  # noqa: E402

TICK = 0.02
LAG_S = 2.0
PROBES_PER_SECOND = 5
# The probe's claim: 16 rows (a worker's batch) of the live queue, as owner soak-probe.
PROBE = {"queue": "bench", "n": 16, "owner": "soak-probe", "lease_s": 30.0, "relaxed": False, "actors": [], "actor_max_attempts": [],
         "actor_max_losses": [], "default_max_attempts": 1, "default_max_losses": 3}

CONFIG = """\
roles:
  bench:
    queues: [bench]
    actors: [bench.bench_actors]
retention:
  succeeded: {r}s
  failed: {r}s
  cancelled: {r}s
  events: {r}s
  runs: {r}s
  results: {r}s
"""

# Jobs finished in [lo, hi): a histogram of enqueue-to-start in 0.1 ms buckets.
FINISHED = """
SELECT round(extract(epoch FROM started_at - created_at) * 10000)::bigint, count(*)
  FROM jobs
 WHERE status IN ('succeeded', 'failed', 'cancelled') AND finished_at >= %(lo)s AND finished_at < %(hi)s
 GROUP BY 1
"""

HEALTH = """
SELECT s.n_dead_tup, pg_table_size('jobs'), pg_indexes_size('jobs'), s.vacuum_count, s.autovacuum_count,
       s.n_tup_del, now() - %(lag)s * interval '1 second'
  FROM pg_stat_user_tables s WHERE s.relid = 'jobs'::regclass
"""


@dataclass
class Minute:
    jobs: int = 0
    latency: collections.Counter = field(default_factory=collections.Counter)  # 0.1 ms bucket -> jobs
    probes: list[float] = field(default_factory=list)
    dead: list[int] = field(default_factory=list)
    table: int = 0
    indexes: int = 0
    vacuums: int = 0
    deleted: int = 0


def hist_pct(hist: collections.Counter, p: float) -> float:
    """The p-th percentile (ms) of a 0.1 ms histogram."""
    total = sum(hist.values())
    if not total:
        return float("nan")
    rank, seen = p / 100 * total, 0
    for bucket in sorted(hist):
        seen += hist[bucket]
        if seen >= rank:
            return bucket / 10
    return max(hist) / 10


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


class Producer(threading.Thread):
    """Enqueues ``rate`` no-op jobs a second, a batch every TICK, on a fixed schedule."""

    def __init__(self, broker, actor, rate: float) -> None:
        super().__init__(name="producer", daemon=True)
        self.broker, self.actor, self.rate = broker, actor, rate
        self.halt = threading.Event()
        self.sent = 0
        self.late = 0  # ticks that started behind schedule

    def run(self) -> None:
        started = time.monotonic()
        tick = 0
        while not self.halt.is_set():
            due = int(self.rate * (tick + 1) * TICK) - self.sent
            if due > 0:
                self.broker.enqueue_many([self.actor.message() for _ in range(due)])
                self.sent += due
            tick += 1
            wait = started + tick * TICK - time.monotonic()
            if wait > 0:
                self.halt.wait(wait)
            else:
                self.late += 1


class Sampler:
    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn
        self.mark = conn.execute(HEALTH, {"lag": LAG_S}).fetchone()[6]
        self.base = conn.execute(HEALTH, {"lag": LAG_S}).fetchone()

    def probe(self) -> float:
        with self.conn.transaction():
            started = time.perf_counter()
            self.conn.execute(sql.claim(PROBE["n"]), PROBE).fetchall()
            took = (time.perf_counter() - started) * 1000
            raise psycopg.Rollback()
        return took

    def second(self, minute: Minute) -> None:
        for _ in range(PROBES_PER_SECOND):
            minute.probes.append(self.probe())
        dead, table, indexes, vacs, autovacs, deleted, hi = self.conn.execute(HEALTH, {"lag": LAG_S}).fetchone()
        for bucket, n in self.conn.execute(FINISHED, {"lo": self.mark, "hi": hi}).fetchall():
            minute.latency[bucket] += n
            minute.jobs += n
        self.mark = hi
        minute.dead.append(dead)
        minute.table, minute.indexes = table, indexes
        minute.vacuums = vacs + autovacs - self.base[3] - self.base[4]
        minute.deleted = deleted - self.base[5]


def summarise(minutes: list[Minute]) -> dict[str, float]:
    merged: collections.Counter = collections.Counter()
    for m in minutes:
        merged.update(m.latency)
    return {"jobs/s": sum(m.jobs for m in minutes) / (60 * len(minutes)),
            "enqueue->start p99 ms": hist_pct(merged, 99),
            "claim probe p99 ms": pct([p for m in minutes for p in m.probes], 99),
            "table + indexes MB": sum(m.table + m.indexes for m in minutes) / len(minutes) / 1e6,
            "n_dead_tup (mean)": sum(sum(m.dead) / len(m.dead) for m in minutes) / len(minutes)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=int, default=30)
    p.add_argument("--rate", type=float, default=None, help="jobs/s (default: half of a W1 measured first)")
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--retention", type=int, default=60, help="seconds finished jobs (and events) are kept")
    p.add_argument("--warmup", type=float, default=None, help="seconds before the timeline (default retention x 1.5)")
    p.add_argument("--database-url", default=None)
    args = p.parse_args(argv)
    warmup = args.warmup if args.warmup is not None else args.retention * 1.5

    say(code_state())
    with bench_database(server_url(args.database_url)) as url, tempfile.TemporaryDirectory() as tmp, \
            psycopg.connect(url, autocommit=True) as conn:
        import supervisor

        broker = supervisor.setup_broker(url)
        from bench import bench_actors as actors  # binds to the broker set up just above

        rate = args.rate
        if rate is None:
            say("measuring W1 (20,000 no-op jobs, 2 x 8 threads) for the stream's rate")
            rate = w1(url, broker, actors, jobs=20_000, threads=8, chunk=0)["drain"] / 2
            reset(conn)
        config = Path(tmp) / "soak.yaml"
        config.write_text(CONFIG.format(r=args.retention))
        load(config)  # a bad config fails here, not in the workers
        say(f"stream {rate:,.0f} jobs/s for {warmup:.0f}s warm-up + {args.minutes} min, "
            f"{args.processes} x {args.threads} threads, retention {args.retention}s (load {os.getloadavg()[0]:.1f})")
        with WorkerPool(url, count=args.processes, threads=args.threads, env={"SUPERVISOR_CONFIG": str(config)}):
            producer = Producer(broker, actors.noop, rate)
            producer.start()
            time.sleep(warmup)  # the table fills to its retention's size
            sampler = Sampler(conn)
            minutes: list[Minute] = []
            header = (f"{'min':>3} {'jobs/s':>7} {'e2s p50':>8} {'e2s p99':>8} {'claim p50':>9} {'claim p99':>9} "
                      f"{'dead tup':>9} {'max dead':>9} {'table MB':>8} {'index MB':>8} {'vacuums':>7} "
                      f"{'deleted':>9} {'load':>5}")
            say(header)
            started = time.monotonic()
            for i in range(args.minutes):
                m = Minute()
                for s in range(60):
                    sampler.second(m)
                    wait = started + i * 60 + s + 1 - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                minutes.append(m)
                say(f"{i + 1:>3} {m.jobs / 60:>7,.0f} {hist_pct(m.latency, 50):>8.1f} {hist_pct(m.latency, 99):>8.1f} "
                    f"{pct(m.probes, 50):>9.2f} {pct(m.probes, 99):>9.2f} {m.dead[-1]:>9,} {max(m.dead):>9,} "
                    f"{m.table / 1e6:>8.1f} {m.indexes / 1e6:>8.1f} {m.vacuums:>7} {m.deleted:>9,} "
                    f"{os.getloadavg()[0]:>5.1f}")
            producer.halt.set()
            producer.join()
            say(f"producer: {producer.sent:,} jobs sent, {producer.late:,} of its ticks started late")

    window = min(5, max(1, len(minutes) // 2))
    first, last = summarise(minutes[:window]), summarise(minutes[-window:])
    say("")
    say(f"first {window} vs last {window} minutes (target: last within 10 % of first; sizes flat)")
    say(f"  {'figure':<24} {'first':>10} {'last':>10} {'change':>8}  met")
    for key in first:
        a, b = first[key], last[key]
        change = (b / a - 1) * 100 if a else float("nan")
        better_if_higher = key == "jobs/s"
        met = ("" if key.startswith("n_dead") else
               "yes" if (change >= -10 if better_if_higher else change <= 10) else "NO")
        say(f"  {key:<24} {a:>10,.2f} {b:>10,.2f} {change:>+7.1f}%  {met}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
