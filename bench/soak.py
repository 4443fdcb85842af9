"""A soak: a steady stream of no-op jobs for a long time, retention on; a timeline per 10 s.

    python bench/soak.py [--minutes 30] [--rate JOBS_PER_S] [--processes 2] [--threads 8]
                         [--window 10] [--retention 60] [--warmup SECONDS] [--database-url URL]

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
     0.1 ms histogram so each window's p99 is exact;
   - the backlog: runnable rows not yet claimed (read through the claim index);
   - claim p99: a probe, 5 CLAIMs of 16 rows a second on the live queue, each rolled
     back (it holds rows for about a millisecond; the workers skip them), timed by the
     client. It has no claim floors (broker/consuming/floors.py): a sweep, stepping over every
     dead index entry a worker's floored claims skip. The workers' own claims are
     timed too (soak_trace's BENCH_CLAIM_TRACE): "worker claim p99" in the comparison;
   - n_dead_tup of job_queue, its size and its indexes', history's size (it grows
     with the retention, by design: a day goes as a whole), and what ran meanwhile:
     vacuums of job_queue, rows deleted from it (finished), checkpoints (pg_stat_bgwriter).
4. Prints one line per --window seconds (a spike shows beside what ran in its window),
   the windows whose p99 is over 3 x the median window's, and the first-5 vs last-5
   minute comparison against the target: last 5 within 10 % of the first 5 on
   throughput and both p99s, sizes flat. (With under 10 minutes, the halves.)
5. The workers run as `python -m bench.soak_trace worker ...`: the worker CLI plus a tracer
   that logs what could stall a claim, each with its wall-clock span: the upkeep's
   tasks (beat, reap, prune, vacuum/analyze), Python's garbage collections over 5 ms,
   the process's own stalls (a thread that sleeps 5 ms and wakes 20 ms late or more:
   the GIL held, or no CPU), pace changes, and the broker pool's waits per second.
   Each spike window is printed with the worst job's wait and the traced events that
   overlap it.
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

from bench import soak_trace
from bench.bench_broker import w1
from bench.common import WorkerPool, bench_database, code_state, reset, say, server_url
from supervisor.broker import sql
from supervisor.broker.consuming.floors import SWEEP
from supervisor.broker.consuming.gates import first_turn
from supervisor.config import load

TICK = 0.02
LAG_S = 2.0
PROBES_PER_SECOND = 5
# The probe's claim: 16 rows (a worker's batch) of the live queue, as owner soak-probe.
PROBE = {"queue": "bench", "n": 16, "owner": "soak-probe", "lease_s": 30.0, "relaxed": False, **SWEEP, **first_turn(16), "actors": [], "actor_max_attempts": [],
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
SELECT s.n_dead_tup + (SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables
                         WHERE relname IN ('job_lease', 'job_cursor'))::bigint,
       -- the live tables (job_queue; with storage "log", also the leases and cursors its
       -- claims read); their indexes; all of history (every day's partition, with its
       -- indexes, and the job log's days: they grow with the retention, by design)
       pg_table_size('job_queue') + pg_table_size('job_lease') + pg_table_size('job_cursor'),
       pg_indexes_size('job_queue') + pg_indexes_size('job_lease') + pg_indexes_size('job_cursor'),
       (SELECT coalesce(sum(pg_total_relation_size(t.relid)), 0)
          FROM (SELECT relid, isleaf FROM pg_partition_tree('job_history')
                UNION ALL SELECT relid, isleaf FROM pg_partition_tree('job_log')
                UNION ALL SELECT relid, isleaf FROM pg_partition_tree('job_done')) t
         WHERE t.isleaf)::bigint,
       s.vacuum_count, s.autovacuum_count,
       s.n_tup_del, now() - %(lag)s * interval '1 second',
       ({checkpoints}),
       (SELECT count(*) FROM jobs WHERE queue = 'bench' AND status IN ('pending', 'retryable') AND run_at <= now()),
       (SELECT coalesce(max(extract(epoch FROM now() - a.xact_start)), 0) * 1000 FROM pg_stat_activity a
         WHERE a.datname = current_database() AND a.pid <> pg_backend_pid() AND a.backend_xmin IS NOT NULL),
       (SELECT left(a.query, 60) FROM pg_stat_activity a
         WHERE a.datname = current_database() AND a.pid <> pg_backend_pid() AND a.backend_xmin IS NOT NULL
         ORDER BY a.xact_start LIMIT 1)
  FROM pg_stat_user_tables s WHERE s.relid = 'job_queue'::regclass
"""


# The job of the window that waited longest: when it was enqueued and claimed (epoch).
WORST = """
SELECT extract(epoch FROM created_at)::float8, extract(epoch FROM started_at)::float8
  FROM jobs
 WHERE status IN ('succeeded', 'failed', 'cancelled') AND finished_at >= %(lo)s AND finished_at < %(hi)s
 ORDER BY started_at - created_at DESC LIMIT 1
"""

TRACE = soak_trace.TRACE


@dataclass
class Window:
    seconds: int
    worst: tuple[float, float] = (0.0, 0.0)  # the longest-waiting job: enqueued, claimed (epoch)
    worst_wait: float = 0.0
    jobs: int = 0
    latency: collections.Counter = field(default_factory=collections.Counter)  # 0.1 ms bucket -> jobs
    probes: list[float] = field(default_factory=list)
    dead: list[int] = field(default_factory=list)
    backlog: list[int] = field(default_factory=list)
    table: int = 0
    indexes: int = 0
    history: int = 0
    lo: float = 0.0  # wall clock: the window's bounds (the worker's traced claims in it)
    hi: float = 0.0
    vacuums: int = 0  # in this window
    deleted: int = 0
    checkpoints: int = 0
    oldest_xact: float = 0.0  # ms: the longest-open transaction seen in the bench database
    oldest_query: str = ""
    claim_buffers: int = 0  # pages one probe claim touched (EXPLAIN BUFFERS), at the window's end


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
    """Enqueues ``rate`` no-op jobs a second, a batch every TICK, on a fixed schedule
    (``make``: builds each message; default ``actor.message()``)."""

    def __init__(self, broker, actor, rate: float, make=None) -> None:
        super().__init__(name="producer", daemon=True)
        self.broker, self.actor, self.rate = broker, actor, rate
        self.make = make or actor.message
        self.halt = threading.Event()
        self.sent = 0
        self.late = 0  # ticks that started behind schedule

    def run(self) -> None:
        started = time.monotonic()
        tick = 0
        while not self.halt.is_set():
            due = int(self.rate * (tick + 1) * TICK) - self.sent
            if due > 0:
                self.broker.enqueue_many([self.make() for _ in range(due)])
                self.sent += due
            tick += 1
            wait = started + tick * TICK - time.monotonic()
            if wait > 0:
                self.halt.wait(wait)
            else:
                self.late += 1


def health_statement(conn: psycopg.Connection) -> str:
    """HEALTH for this server: PostgreSQL 17 moved the checkpoint counts from
    pg_stat_bgwriter to pg_stat_checkpointer (the embedded server is 17, Debian's 15)."""
    if conn.info.server_version >= 170000:
        checkpoints = "SELECT num_timed + num_requested FROM pg_stat_checkpointer"
    else:
        checkpoints = "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"
    return HEALTH.replace("{checkpoints}", checkpoints)


class Sampler:
    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn
        self.health = health_statement(conn)
        self.last = conn.execute(self.health, {"lag": LAG_S}).fetchone()
        self.mark = self.last[7]  # now() - lag: where the first second starts
        # Each second's jobs (by when they finished, wall clock): (from, to, histogram).
        self.seconds: list[tuple[float, float, collections.Counter]] = []

    def buffers(self) -> int:
        """Pages the probe claim touches (hit or read), from EXPLAIN (ANALYZE, BUFFERS)."""
        with self.conn.transaction():
            plan = self.conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql.claim(PROBE["n"]),
                                     PROBE).fetchone()[0][0]["Plan"]
            raise psycopg.Rollback()
        return int(plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0))

    def probe(self) -> float:
        with self.conn.transaction():
            started = time.perf_counter()
            self.conn.execute(sql.claim(PROBE["n"]), PROBE).fetchall()
            took = (time.perf_counter() - started) * 1000
            raise psycopg.Rollback()
        return took

    def second(self, window: Window) -> None:
        for _ in range(PROBES_PER_SECOND):
            window.probes.append(self.probe())
        row = self.conn.execute(self.health, {"lag": LAG_S}).fetchone()
        dead, table, indexes, history, vacs, autovacs, deleted, hi, checkpoints, backlog, oldest, query = row
        if oldest > window.oldest_xact:
            window.oldest_xact, window.oldest_query = oldest, query or ""
        this: collections.Counter = collections.Counter()
        for bucket, n in self.conn.execute(FINISHED, {"lo": self.mark, "hi": hi}).fetchall():
            window.latency[bucket] += n
            window.jobs += n
            this[bucket] += n
        self.seconds.append((self.mark.timestamp(), hi.timestamp(), this))
        worst = self.conn.execute(WORST, {"lo": self.mark, "hi": hi}).fetchone()
        if worst is not None and worst[1] - worst[0] > window.worst_wait:
            window.worst, window.worst_wait = (worst[0], worst[1]), worst[1] - worst[0]
        self.mark = hi
        window.dead.append(dead)
        window.backlog.append(backlog)
        window.table, window.indexes, window.history = table, indexes, history
        window.vacuums += vacs + autovacs - self.last[4] - self.last[5]
        window.deleted += deleted - self.last[6]
        window.checkpoints += checkpoints - self.last[8]
        self.last = row


def summarise(windows: list[Window], events: list[tuple[float, float, str]]) -> dict[str, float]:
    merged: collections.Counter = collections.Counter()
    for w in windows:
        merged.update(w.latency)
    claims = [int(what.split()[2]) / 1000 for start, _, what in events
              if what.startswith("claim ") and windows[0].lo <= start < windows[-1].hi]
    return {"jobs/s": sum(w.jobs for w in windows) / sum(w.seconds for w in windows),
            "enqueue->start p99 ms": hist_pct(merged, 99),
            "worker claim p99 ms": pct(claims, 99),
            "claim probe p99 ms": pct([p for w in windows for p in w.probes], 99),
            "live table + indexes MB": sum(w.table + w.indexes for w in windows) / len(windows) / 1e6,
            "n_dead_tup (mean)": sum(sum(w.dead) / len(w.dead) for w in windows) / len(windows),
            "history MB (grows)": windows[-1].history / 1e6}


HEADER = (f"{'t s':>5} {'jobs/s':>7} {'e2s p50':>8} {'e2s p99':>8} {'e2s max':>8} {'backlog':>7} "
          f"{'claim p99':>9} {'dead tup':>9} {'queue MB':>8} {'index MB':>8} {'hist MB':>8} {'vac':>3} {'ckpt':>4} "
          f"{'deleted':>8} {'old xact':>8} {'claim pg':>8} {'load':>5}")


def line(at: int, w: Window) -> str:
    return (f"{at:>5} {w.jobs / w.seconds:>7,.0f} {hist_pct(w.latency, 50):>8.1f} {hist_pct(w.latency, 99):>8.1f} "
            f"{hist_pct(w.latency, 100):>8.1f} {max(w.backlog):>7,} {pct(w.probes, 99):>9.2f} {max(w.dead):>9,} "
            f"{w.table / 1e6:>8.1f} {w.indexes / 1e6:>8.1f} {w.history / 1e6:>8.1f} {w.vacuums:>3} {w.checkpoints:>4} {w.deleted:>8,} "
            f"{w.oldest_xact:>8,.0f} {w.claim_buffers:>8,} {os.getloadavg()[0]:>5.1f}")


def traced(logs: list[Path]) -> list[tuple[float, float, str]]:
    """The tracer's events of every worker: (start, end, what), wall clock."""
    out = []
    for path in logs:
        for text in path.read_text(errors="replace").splitlines():
            if TRACE in text:
                _, rest = text.split(TRACE, 1)
                start, end, what = rest.split(None, 2)
                out.append((float(start), float(end), what))
    return out


def spikes(windows: list[Window], window_s: int, events: list[tuple[float, float, str]]) -> None:
    """The windows whose p99 is over 3 x the median window's, with what ran in them."""
    p99s = [hist_pct(w.latency, 99) for w in windows]
    median = sorted(p99s)[len(p99s) // 2]
    hits = [(i, w) for i, (w, p) in enumerate(zip(windows, p99s, strict=True)) if p > 3 * median]
    say("")
    say(f"spikes (window p99 > 3 x the median window's {median:.1f} ms): {len(hits)} of {len(windows)} windows")
    for i, w in hits:
        say(line((i + 1) * window_s, w))
    worst = sorted(range(len(windows)), key=lambda i: -windows[i].worst_wait)[:max(3, len(hits))]
    say(f"the {len(worst)} longest single waits, with what the tracer saw while each job waited:")
    for i in sorted(worst):
        w = windows[i]
        lo, hi = w.worst
        say(f"  window {(i + 1) * window_s}s: a job waited {w.worst_wait * 1000:.0f} ms; longest transaction"
            f" {w.oldest_xact:,.0f} ms ({w.oldest_query!r}); meanwhile (from its enqueue):")
        for start, end, what in events:
            if start <= hi + 0.05 and end >= lo - 0.05 and not what.startswith("pool "):
                say(f"    {start - lo:+7.3f}s {(end - start) * 1000:7.1f} ms  {what}")
        for start, _, what in events:
            if what.startswith("pool ") and lo - 0.5 <= start <= hi + 1:
                say(f"    {start - lo:+7.3f}s  {what} (the second before)")
    quiet = [w for w in windows if w not in [h[1] for h in hits]]
    for name, pick in (("with a vacuum", lambda w: w.vacuums > 0), ("with a checkpoint", lambda w: w.checkpoints > 0)):
        say(f"  windows {name}: {sum(pick(w) for _, w in hits)} of the {len(hits)} spikes, "
            f"{sum(pick(w) for w in quiet)} of the {len(quiet)} others")


def attribute(seconds: list[tuple[float, float, collections.Counter]],
              events: list[tuple[float, float, str]]) -> None:
    """Enqueue-to-start p99 of the seconds during which each traced kind of event ran,
    against the seconds during which none of them did; and the broker pool's waits."""
    kinds = ("prune", "maintain", "stall", "gc", "gave back", "pace limit")
    spans = {k: [(a, b) for a, b, what in events if what.startswith(k)] for k in kinds}
    say("")
    say("enqueue-to-start by what ran in the same second (jobs finishing then; vacuum = maintain):")
    quiet: collections.Counter = collections.Counter()
    quiet_n = 0
    for lo, hi, hist in seconds:
        if not any(a <= hi and b >= lo - 1 for k in kinds for a, b in spans[k]):
            quiet.update(hist)
            quiet_n += 1
    say(f"  {'nothing traced':<14} {quiet_n:>4} s  p99 {hist_pct(quiet, 99):8.1f} ms  max {hist_pct(quiet, 100):8.1f} ms")
    for k in kinds:
        merged: collections.Counter = collections.Counter()
        n = 0
        for lo, hi, hist in seconds:
            if any(a <= hi and b >= lo - 1 for a, b in spans[k]):
                merged.update(hist)
                n += 1
        if n:
            say(f"  {k:<14} {n:>4} s  p99 {hist_pct(merged, 99):8.1f} ms  max {hist_pct(merged, 100):8.1f} ms"
                f"  ({len(spans[k])} events, {sum(b - a for a, b in spans[k]):.1f} s in all)")
    waits = [what for _, _, what in events if what.startswith("pool ")]
    total = sum(int(w.split(" waited ")[1].split(" ms")[0]) for w in waits)
    worst = max((int(w.split(" waited ")[1].split(" ms")[0]) for w in waits), default=0)
    say(f"  broker pool: requests waited {total:,} ms in all over the run, {worst:,} ms in the worst second")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=30, help="the timeline's length (a fraction for a short run)")
    p.add_argument("--rate", type=float, default=None, help="jobs/s (default: half of a W1 measured first)")
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--window", type=int, default=10, help="seconds per timeline line")
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
        with WorkerPool(url, count=args.processes, threads=args.threads, module="bench.soak_trace",
                        env={"SUPERVISOR_CONFIG": str(config), "BENCH_CLAIM_TRACE": "1"}) as pool:
            producer = Producer(broker, actors.noop, rate)
            producer.start()
            time.sleep(warmup)  # the table fills to its retention's size
            sampler = Sampler(conn)
            windows: list[Window] = []
            say(HEADER)
            started = time.monotonic()
            for i in range(max(1, round(args.minutes * 60) // args.window)):
                w = Window(args.window, lo=time.time())
                for sec in range(args.window):
                    sampler.second(w)
                    wait = started + i * args.window + sec + 1 - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                w.claim_buffers = sampler.buffers()
                w.hi = time.time()
                windows.append(w)
                say(line((i + 1) * args.window, w))
            producer.halt.set()
            producer.join()
            say(f"producer: {producer.sent:,} jobs sent, {producer.late:,} of its ticks started late")
            events = traced(pool.logs)

    spikes(windows, args.window, events)
    attribute(sampler.seconds, events)
    per_minute = 60 // args.window
    span = min(5 * per_minute, max(1, len(windows) // 2))
    first, last = summarise(windows[:span], events), summarise(windows[-span:], events)
    say("")
    say(f"first {span * args.window}s vs last {span * args.window}s (target: last within 10 % of first; sizes flat)")
    say(f"  {'figure':<24} {'first':>10} {'last':>10} {'change':>8}  met")
    for key in first:
        a, b = first[key], last[key]
        change = (b / a - 1) * 100 if a else float("nan")
        better_if_higher = key == "jobs/s"
        met = ("" if key.startswith(("n_dead", "history", "claim probe")) else
               "yes" if (change >= -10 if better_if_higher else change <= 10) else "NO")
        say(f"  {key:<24} {a:>10,.2f} {b:>10,.2f} {change:>+7.1f}%  {met}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
