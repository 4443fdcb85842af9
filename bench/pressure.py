"""Pressure: a steady stream of no-op jobs while the xmin horizon is held back (issue 18 item 3).

    python bench/pressure.py [--mode pin|readers|both|scans] [--jobs plain|keyed|deduped|concurrency|rated|weighted] [--rate JOBS_PER_S] [--baseline 60]
                             [--pin 90] [--after 60] [--interval 60] [--threads 16]
                             [--reader-xact 30] [--reader-pause 0.5] [--server-log PATH]
                             [--database-url URL]

1. One worker process of --threads (16) threads on a fresh migrated database. Without
   --rate, a warm-up drains 10,000 no-op jobs first and the stream runs at half that
   drain rate; with --rate, 500 jobs warm it up.
2. A producer enqueues --rate jobs/s (bench/soak.py's Producer, a batch every 20 ms on a
   fixed schedule); after --settle s, three phases: baseline for --baseline s, pressure for --pin s,
   after for --after s. The pressure is
   - pin: one session holds `BEGIN; SELECT txid_current();` open, then commits;
   - readers: 4 REPEATABLE READ sessions, each scanning the tables (count(*) of jobs
     and job_events, jobs by status) every --reader-pause s in transactions of
     --reader-xact s, started a quarter of that apart, so they overlap and one of them
     always holds the horizon;
   - both: the two at once;
   - scans: the readers' scans, at the same pace, each in a transaction of its own (READ
     COMMITTED): their CPU without the horizon they hold, to tell the two costs apart.
3. Each second: dead tuples and size (table + indexes + toast) of the live table
   (job_queue; jobs on the old storage, which holds finished rows too), job_history (all
   its partitions) and job_events, vacuums of the live table (the workers' upkeep vacuums
   it; autovacuum may too), the backlog (runnable rows not yet claimed), the age of
   the oldest transaction holding a snapshot or an xid. Throughput and enqueue-to-start (started_at -
   created_at of the jobs that finished in the interval: the claim stamps started_at, both
   are the database's clock) are read through the `jobs` name, which both storages have,
   LAG seconds after an interval ends so every ack in it has committed. The claim's own
   latency: the worker runs under bench/soak_trace.py, which times every
   `PostgresBroker.claim` call (the statement, its round trip and decoding the rows).
4. A line per --interval s, a summary per phase (with where its CPU went, in cores: the
   worker process, the database's backends other than the readers', every PostgreSQL
   process, parallel workers included, and the machine), and the checks of the issue: claim p99
   under pressure within 2x of the baseline's (and enqueue-to-start p99 the same), throughput held (within 10 %), and back within 2x
   of the baseline p99 (10 s in a row) within 60 s of the release; and when the backlog
   was back to the baseline's.

To measure another checkout (its supervisor, migrations and bench helpers), put it first
on PYTHONPATH: `PYTHONPATH=/work/wt/old python bench/pressure.py`.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import psycopg

# --jobs keyed: this many concurrency keys, taken in turn ("one sync per account at a time").
CONCURRENCY_KEYS = 50


def _keyed(actor: Any) -> Any:
    """Messages with a dedupe key of their own and one of CONCURRENCY_KEYS concurrency keys."""
    import itertools
    import uuid
    turn = itertools.count()
    return lambda: actor.message_with_options(dedupe_key=f"once:{uuid.uuid4()}",
                                              concurrency_key=f"account:{next(turn) % CONCURRENCY_KEYS}")


def _deduped(actor: Any) -> Any:
    """Messages with a dedupe key of their own ("one welcome mail per user")."""
    import uuid
    return lambda: actor.message_with_options(dedupe_key=f"once:{uuid.uuid4()}")


def _concurrency(actor: Any) -> Any:
    """Messages with one of CONCURRENCY_KEYS concurrency keys, taken in turn, no dedupe key."""
    import itertools
    turn = itertools.count()
    return lambda: actor.message_with_options(concurrency_key=f"account:{next(turn) % CONCURRENCY_KEYS}")


# --jobs rated: each key's rate, well above what the stream sends it (800/s over 50 keys is
# 16/s a key), so a start waits for a token only where the stream's batches bunch up.
KEY_RATE = "40/s burst 5"


def _rated(actor: Any) -> Any:
    """Messages with one of CONCURRENCY_KEYS rate-limited keys, taken in turn ("30 calls a
    second per shop's API")."""
    import itertools
    turn = itertools.count()
    return lambda: actor.message_with_options(rate_limit_key=f"shop:{next(turn) % CONCURRENCY_KEYS}",
                                              rate_limit=KEY_RATE)


def _weighted(actor: Any) -> Any:
    """Messages with one of CONCURRENCY_KEYS fairness keys, weights 1 to 3, taken in turn
    ("tenants share the workers")."""
    import itertools
    turn = itertools.count()

    def make() -> Any:
        i = next(turn) % CONCURRENCY_KEYS
        return actor.message_with_options(fairness_key=f"tenant:{i}", fairness_weight=1 + i % 3)
    return make


# What the stream sends (--jobs): a maker of messages for an actor.
JOB_SHAPES: dict[str, Any] = {"plain": lambda actor: actor.message, "keyed": _keyed, "deduped": _deduped,
                              "concurrency": _concurrency, "rated": _rated, "weighted": _weighted}

# The checkout measured: PYTHONPATH's when given, else this one.
if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import server_log
from bench.basics import cpu_seconds, runq_seconds
from bench.common import LIVE, WorkerPool, bench_database, code_state, say, server_url
from bench.soak import Producer, traced

LAG_S = 2.0
READERS = 4
WITHIN = 2.0  # the bound: p99 under pressure at most this times the baseline's
HELD = 0.9  # throughput under pressure at least this share of the baseline's
STEADY = 10  # seconds in a row within WITHIN x the baseline p99: recovered

# Dead tuples and bytes of the live tables, history (every partition) and events, on any
# storage: before migration 035 `jobs` is the table that holds every row; after, a view;
# with storage "log" (039, SUPERVISOR_STORAGE=log) the log, its leases and cursors count
# as live, its done rows as history. The vacuum count is job_queue's (the upkeep's).
GAUGES = """
SELECT CASE WHEN s.relname IN ('job_queue', 'jobs', 'job_lease', 'job_cursor', 'job_log_cancel')
                 OR s.relid IN (SELECT relid FROM pg_partition_tree(to_regclass('job_log')) WHERE isleaf) THEN 'queue'
            WHEN s.relname = 'job_events' THEN 'events' ELSE 'history' END,
       sum(s.n_dead_tup)::bigint, sum(pg_total_relation_size(s.relid))::bigint,
       sum(s.vacuum_count + s.autovacuum_count) FILTER (WHERE s.relname IN ('job_queue', 'jobs'))::bigint
  FROM pg_stat_user_tables s
 WHERE s.relname IN ('job_queue', 'jobs', 'job_events', 'job_lease', 'job_cursor', 'job_log_cancel')
    OR s.relid IN (SELECT relid FROM pg_partition_tree(to_regclass('job_history')) WHERE isleaf)
    OR s.relid IN (SELECT relid FROM pg_partition_tree(to_regclass('job_log')) WHERE isleaf)
    OR s.relid IN (SELECT relid FROM pg_partition_tree(to_regclass('job_done')) WHERE isleaf)
 GROUP BY 1
"""
BACKLOG = "SELECT count(*) FROM jobs WHERE status IN ('pending', 'retryable') AND run_at <= now()"
OLDEST = """
SELECT coalesce(max(extract(epoch FROM now() - xact_start)), 0) FROM pg_stat_activity
 WHERE datname = current_database() AND pid <> pg_backend_pid()
   AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)  -- the pin holds an xid, no snapshot
"""
FINISHED = "status IN ('succeeded', 'failed', 'cancelled') AND finished_at >= to_timestamp(%(lo)s) AND finished_at < to_timestamp(%(hi)s)"
# Jobs finished in [lo, hi): how many, enqueue-to-start p50 / p99 / max in ms.
WAITS = f"""
SELECT count(*), percentile_disc(0.5) WITHIN GROUP (ORDER BY w), percentile_disc(0.99) WITHIN GROUP (ORDER BY w), max(w)
  FROM (SELECT extract(epoch FROM started_at - created_at) * 1000 AS w FROM jobs WHERE {FINISHED}) j
"""
# The same p99 for each second since lo.
P99_BY_SECOND = f"""
SELECT floor(extract(epoch FROM finished_at) - %(lo)s)::int,
       percentile_disc(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at) * 1000)
  FROM jobs WHERE {FINISHED} GROUP BY 1
"""
# The backends of this database other than the sampler's (the job path's, the readers', the pin's).
BACKENDS = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
SCANS = ("SELECT count(*) FROM jobs", "SELECT count(*) FROM job_events",
         "SELECT status, count(*) FROM jobs GROUP BY status")


def one(conn: psycopg.Connection, query: str, params: dict[str, float] | None = None) -> tuple[Any, ...]:
    row = conn.execute(query, params).fetchone()
    assert row is not None  # an aggregate always returns its row
    return row


@dataclass
class Span:
    """An interval or a phase: wall-clock bounds and what the per-second gauges saw."""

    phase: str
    lo: float
    hi: float = 0.0
    dead: dict[str, int] = field(default_factory=dict)  # max over the span, per table
    size: dict[str, int] = field(default_factory=dict)  # the last seen
    backlog: int = 0
    samples: list[tuple[float, int]] = field(default_factory=list)  # (when, backlog) each second
    oldest: float = 0.0  # s: the oldest transaction holding the horizon
    vacuums: int = 0  # of the live table, finished in the span

    def add(self, gauges: dict[str, tuple[int, int]], backlog: int, oldest: float, vacuums: int) -> None:
        self.samples.append((time.time(), backlog))
        self.vacuums += vacuums
        for what, (dead, size) in gauges.items():
            self.dead[what] = max(self.dead.get(what, 0), dead)
            self.size[what] = size
        self.backlog, self.oldest = max(self.backlog, backlog), max(self.oldest, oldest)

    def waits(self, conn: psycopg.Connection) -> tuple[float, float, float, float]:
        """jobs/s, enqueue-to-start p50, p99, max (ms)."""
        n, p50, p99, top = one(conn, WAITS, {"lo": self.lo, "hi": self.hi})
        return n / (self.hi - self.lo), float(p50 or 0), float(p99 or 0), float(top or 0)


def machine_busy() -> float:
    """CPU seconds the whole machine spent busy (not idle or waiting on I/O) since boot."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def server_cpu(postmaster: psutil.Process) -> float:
    """CPU seconds of every PostgreSQL process: the live ones, and those that ended (a
    parallel query's workers, which the readers' scans start), which the postmaster's
    children's times hold once it has reaped them."""
    live = sum(cpu_seconds(child.pid) for child in postmaster.children())
    times = postmaster.cpu_times()
    return live + cpu_seconds(postmaster.pid) + times.children_user + times.children_system


@dataclass
class Cores:
    """Where a phase's CPU went, in cores (CPU seconds per second): the worker process, the
    database's backends other than the readers' (the job path's, the producer's), every
    PostgreSQL process (the readers with their parallel workers are most of the rest), and
    the machine as a whole."""

    worker: float
    backends: float
    server: float
    machine: float
    # ms per second the worker's threads, and the job path's backends, were runnable but
    # waited for a CPU: the part of a claim's time the scheduler, not the database, adds.
    worker_runq: float = 0.0
    backends_runq: float = 0.0


class CpuClock:
    """CPU seconds per process at a phase's start; ``cores`` at its end (taken before the
    readers stop, so their backends are still there to be left out)."""

    def __init__(self, conn: psycopg.Connection, workers: list[int]) -> None:
        self.workers, self.at = workers, time.monotonic()
        self.postmaster = psutil.Process(psutil.Process(conn.info.backend_pid).ppid())
        self.pids = [r[0] for r in conn.execute(BACKENDS).fetchall()]
        self.start = {pid: cpu_seconds(pid) for pid in {*self.pids, *workers}}
        self.runq = {pid: runq_seconds(pid) for pid in {*self.pids, *workers}}
        self.server, self.busy = server_cpu(self.postmaster), machine_busy()

    def cores(self, conn: psycopg.Connection, readers: list[int]) -> Cores:
        pids = {r[0] for r in conn.execute(BACKENDS).fetchall()} | set(self.pids)
        # A backend gone since (a pool's connection replaced) counts for nothing, not less.
        used = {pid: max(0.0, cpu_seconds(pid) - self.start.get(pid, 0.0)) for pid in pids | set(self.workers)}
        seconds = time.monotonic() - self.at
        worker_s = sum(used[pid] for pid in self.workers)
        backend_s = sum(v for pid, v in used.items() if pid not in readers and pid not in self.workers)
        waited = {pid: max(0.0, runq_seconds(pid) - self.runq.get(pid, 0.0)) for pid in pids | set(self.workers)}
        worker_q = sum(waited[pid] for pid in self.workers)
        backend_q = sum(v for pid, v in waited.items() if pid not in readers and pid not in self.workers)
        return Cores(worker_s / seconds, backend_s / seconds, (server_cpu(self.postmaster) - self.server) / seconds,
                     (machine_busy() - self.busy) / seconds, 1000 * worker_q / seconds, 1000 * backend_q / seconds)


class Reader(threading.Thread):
    """A REPEATABLE READ session scanning the tables in transactions of ``xact_s``; with
    ``hold`` False, the same scans each in a transaction of its own (READ COMMITTED,
    autocommit): their CPU without the horizon they hold."""

    def __init__(self, url: str, xact_s: float, pause_s: float, delay_s: float, *, hold: bool = True) -> None:
        super().__init__(name="reader", daemon=True)
        self.url, self.xact_s, self.pause_s, self.delay_s = url, xact_s, pause_s, delay_s
        self.hold = hold
        self.halt = threading.Event()
        self.scans = 0
        self.pid = 0  # its backend's (its parallel workers come and go)

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=not self.hold) as conn:
            self.pid = conn.info.backend_pid
            if self.hold:
                conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            self.halt.wait(self.delay_s)
            while not self.halt.is_set():
                began = time.monotonic()
                while not self.halt.is_set() and time.monotonic() - began < self.xact_s:
                    for scan in SCANS:
                        conn.execute(scan).fetchall()
                    self.scans += 1
                    self.halt.wait(self.pause_s)
                conn.commit()


class Pressure:
    """The pin and/or the readers, started and stopped with the pressure phase."""

    def __init__(self, url: str, mode: str, args: argparse.Namespace, t0: float) -> None:
        self.url, self.mode, self.args, self.t0 = url, mode, args, t0
        self.pin: psycopg.Connection | None = None
        self.readers: list[Reader] = []

    def say(self, what: str) -> None:
        say(f"{time.time() - self.t0:>5.0f} {what}")

    def start(self) -> None:
        if self.mode in ("pin", "both"):
            self.pin = psycopg.connect(self.url)
            xid = one(self.pin, "SELECT txid_current()")[0]  # BEGIN is implicit
            self.say(f"pin: transaction {xid} open")
        if self.mode in ("readers", "both", "scans"):
            step = self.args.reader_xact / READERS
            self.readers = [Reader(self.url, self.args.reader_xact, self.args.reader_pause, i * step,
                                   hold=self.mode != "scans")
                            for i in range(READERS)]
            for reader in self.readers:
                reader.start()

    def stop(self) -> None:
        if self.pin is not None:
            self.pin.commit()
            self.pin.close()
            self.say("pin: released")
        for reader in self.readers:
            reader.halt.set()
        for reader in self.readers:
            reader.join()
        if self.readers:
            self.say(f"readers: {sum(r.scans for r in self.readers):,} rounds of scans, released")


def sample(conn: psycopg.Connection) -> tuple[dict[str, tuple[int, int]], int, float, int]:
    """The gauges, the backlog, the oldest transaction's age, and the live table's vacuum count."""
    rows = conn.execute(GAUGES).fetchall()
    vacuums = next(v for what, _, _, v in rows if what == "queue")
    return {what: (dead, size) for what, dead, size, _ in rows}, one(conn, BACKLOG)[0], float(one(conn, OLDEST)[0]), vacuums


HEADER = (f"{'t s':>5} {'phase':<11} {'jobs/s':>7} {'e2s p50':>8} {'e2s p99':>8} {'e2s max':>8} {'claim p50':>9} "
          f"{'claim p99':>9} {'backlog':>8} "
          f"{'queue dead':>10} {'queue MB':>8} {'hist dead':>9} {'hist MB':>8} {'ev dead':>8} {'ev MB':>6} {'vac':>3} "
          f"{'oldest s':>8} {'load':>5}")


def claim_ms(logs: list[Path], lo: float, hi: float, *, sweeps: bool = False) -> list[float]:
    """How long (ms) each of the worker's claims that started in [lo, hi) took, sorted;
    ``sweeps``: only those that read every level from its start (broker/consuming/floors.py)."""
    return sorted(int(what.split()[2]) / 1000 for start, _, what in traced(logs)
                  if what.startswith("claim ") and lo <= start < hi and (not sweeps or what.endswith(" sweep")))


def claims(logs: list[Path], lo: float, hi: float) -> tuple[float, float]:
    """p50 and p99 (ms) of the worker's claims that started in [lo, hi)."""
    took = claim_ms(logs, lo, hi)
    if not took:
        return 0.0, 0.0
    return took[len(took) // 2], took[min(len(took) - 1, int(len(took) * 0.99))]


def sweeps(logs: list[Path], lo: float, hi: float) -> tuple[int, float]:
    """How many of the worker's claims in [lo, hi) were sweeps, and the longest one (ms)."""
    took = claim_ms(logs, lo, hi, sweeps=True)
    return len(took), max(took, default=0.0)


def line(t0: float, span: Span, conn: psycopg.Connection, logs: list[Path]) -> str:
    rate, p50, p99, top = span.waits(conn)
    c50, c99 = claims(logs, span.lo, span.hi)
    d, s = span.dead, span.size
    return (f"{span.hi - t0:>5.0f} {span.phase:<11} {rate:>7,.0f} {p50:>8.1f} {p99:>8.1f} {top:>8.1f} {c50:>9.2f} "
            f"{c99:>9.2f} {span.backlog:>8,} "
            f"{d.get('queue', 0):>10,} {s.get('queue', 0) / 1e6:>8.1f} {d.get('history', 0):>9,} "
            f"{s.get('history', 0) / 1e6:>8.1f} {d.get('events', 0):>8,} {s.get('events', 0) / 1e6:>6.1f} {span.vacuums:>3} "
            f"{span.oldest:>8.0f} {os.getloadavg()[0]:>5.1f}")


def warm_up(conn: psycopg.Connection, broker, actor, jobs: int) -> float:
    """Enqueue ``jobs`` at once; the worker's drain rate (jobs/s)."""
    broker.enqueue_many([actor.message() for _ in range(jobs)])
    started = time.monotonic()
    while one(conn, LIVE)[0]:
        if time.monotonic() - started > 600:
            raise RuntimeError("warm-up jobs did not finish in 600 s")
        time.sleep(0.01)
    return jobs / (time.monotonic() - started)


def recovery(conn: psycopg.Connection, after: Span, bound: float) -> tuple[int | None, int]:
    """The first second after the release that starts STEADY seconds in a row whose p99 is
    within ``bound`` (a second with no job finished counts as over), or None; and how many
    seconds from then on are over (one slow second on a shared machine is not a relapse)."""
    by_second: dict[int, Any] = dict(conn.execute(P99_BY_SECOND, {"lo": after.lo, "hi": after.hi}).fetchall())
    ok = [by_second.get(s) is not None and float(by_second[s]) <= bound for s in range(int(after.hi - after.lo))]
    back = next((s for s in range(len(ok) - STEADY + 1) if all(ok[s:s + STEADY])), None)
    return back, 0 if back is None else ok[back:].count(False)


def run(url: str, args: argparse.Namespace) -> int:
    import supervisor

    broker = supervisor.setup_broker(url)
    from bench import bench_actors as actors  # binds to the broker set up just above

    traced = {"BENCH_CLAIM_TRACE": "1"}
    if args.server_log:  # the server logs every statement of the worker's, with its duration
        traced["PGOPTIONS"] = server_log.WORKER_PGOPTIONS
    with psycopg.connect(url, autocommit=True) as conn, \
            WorkerPool(url, count=1, threads=args.threads, module="bench.soak_trace", env=traced) as pool:
        rate = args.rate
        if rate is None:
            drain = warm_up(conn, broker, actors.noop, 10_000)
            rate = drain / 2
            say(f"warm-up: 1 x {args.threads} threads drained 10,000 no-op jobs at {drain:,.0f} jobs/s")
        else:
            warm_up(conn, broker, actors.noop, 500)
        pressure_name = {"pin": "pinned", "readers": "readers", "both": "pin+readers", "scans": "scans"}[args.mode]
        phases = [("baseline", args.baseline), (pressure_name, args.pin), ("after", args.after)]
        say(f"stream {rate:,.0f} jobs/s; {' / '.join(f'{n} {s:.0f} s' for n, s in phases)}; "
            f"1 x {args.threads} threads (load {os.getloadavg()[0]:.1f})")
        producer = Producer(broker, actors.noop, rate, make=JOB_SHAPES[args.jobs](actors.noop))
        producer.start()
        time.sleep(args.settle)  # the worker catches up with the stream's start before the baseline
        say(HEADER)
        logged_from = server_log.size(args.server_log) if args.server_log else 0
        t0 = time.time()
        vacuumed = sample(conn)[3]
        pressure = Pressure(url, args.mode, args, t0)
        spans: list[Span] = []  # closed intervals not printed yet (waiting LAG_S)
        done: list[Span] = []
        cores: dict[str, Cores] = {}
        for name, seconds in phases:
            lo = time.time()
            clock = CpuClock(conn, [p.pid for p in pool.procs])
            if name == pressure_name:
                pressure.start()
            phase = Span(name, lo)
            interval = Span(name, lo)
            while (now := time.time()) < lo + seconds:
                gauges, backlog, oldest, vacuums = sample(conn)
                vacuums, vacuumed = vacuums - vacuumed, vacuums
                phase.add(gauges, backlog, oldest, vacuums)
                interval.add(gauges, backlog, oldest, vacuums)
                time.sleep(max(0.0, min(1.0 - (time.time() - now), lo + seconds - time.time())))
                if (end := time.time()) >= interval.lo + args.interval or end >= lo + seconds:
                    interval.hi = end
                    spans.append(interval)
                    interval = Span(name, end)
                while spans and spans[0].hi + LAG_S <= time.time():
                    say(line(t0, spans.pop(0), conn, pool.logs))
            phase.hi = time.time()
            cores[name] = clock.cores(conn, [r.pid for r in pressure.readers])
            if name == pressure_name:
                pressure.stop()
            done.append(phase)
        producer.halt.set()
        producer.join()
        time.sleep(LAG_S)
        for span in spans:
            say(line(t0, span, conn, pool.logs))
        say(f"producer: {producer.sent:,} jobs sent, {producer.late:,} of its ticks started late")

        say("")
        say(f"{'phase':<11} {'s':>4} {'jobs/s':>7} {'e2s p50 ms':>10} {'e2s p99 ms':>10} {'claim p50':>9} "
            f"{'claim p99':>9} {'max backlog':>11} "
            f"{'queue dead max':>14} {'queue MB':>8} {'hist MB':>8}  cores: {'worker':>6} {'backends':>8} "
            f"{'server':>6} {'machine':>7}  {'sweeps':>6} {'longest ms':>9}  runq ms/s: {'worker':>6} {'backends':>8}")
        figures = {}
        claim = {}
        for phase in done:
            figures[phase.phase] = phase.waits(conn)
            claim[phase.phase] = claims(pool.logs, phase.lo, phase.hi)
            rate_, p50, p99, _ = figures[phase.phase]
            c50, c99 = claim[phase.phase]
            n_sweeps, longest = sweeps(pool.logs, phase.lo, phase.hi)
            say(f"{phase.phase:<11} {phase.hi - phase.lo:>4.0f} {rate_:>7,.0f} {p50:>10.1f} {p99:>10.1f} {c50:>9.2f} "
                f"{c99:>9.2f} "
                f"{phase.backlog:>11,} {phase.dead.get('queue', 0):>14,} {phase.size.get('queue', 0) / 1e6:>8.1f} "
                f"{phase.size.get('history', 0) / 1e6:>8.1f}  {'':6} {cores[phase.phase].worker:>6.2f} "
                f"{cores[phase.phase].backends:>8.2f} {cores[phase.phase].server:>6.2f} {cores[phase.phase].machine:>7.2f}"
                f"  {n_sweeps:>6} {longest:>9.1f}  {'':10} {cores[phase.phase].worker_runq:>6.0f} "
                f"{cores[phase.phase].backends_runq:>8.0f}")
        if args.server_log:  # the claim's execution in PostgreSQL, apart from the worker's side
            for phase in done:
                took = server_log.claim_ms(args.server_log, logged_from, phase.lo, phase.hi)
                pct = [took[min(len(took) - 1, int(len(took) * q))] if took else 0.0 for q in (0.5, 0.9, 0.99)]
                say(f"{phase.phase:<11} the claim in PostgreSQL ({len(took):,} logged): "
                    f"p50 {pct[0]:.2f} ms, p90 {pct[1]:.2f}, p99 {pct[2]:.2f}")
        base, under = figures["baseline"], figures[pressure_name]
        drained = next((at - done[2].lo for at, n in done[2].samples if n <= done[0].backlog), None)
        back, relapses = recovery(conn, done[2], WITHIN * base[2])
        c_base, c_under = claim["baseline"][1], claim[pressure_name][1]
        say(f"claim p99 under {pressure_name} {c_under:.2f} ms vs baseline {c_base:.2f} ms "
            f"({c_under / max(c_base, 1e-9):.1f}x): within {WITHIN:.0f}x: {'yes' if c_under <= WITHIN * c_base else 'NO'}")
        say(f"enqueue-to-start p99 under {pressure_name} {under[2]:.1f} ms vs baseline {base[2]:.1f} ms ({under[2] / base[2]:.1f}x): "
            f"within {WITHIN:.0f}x: {'yes' if under[2] <= WITHIN * base[2] else 'NO'}")
        say(f"throughput under {pressure_name} {under[0]:,.0f} vs baseline {base[0]:,.0f} jobs/s: "
            f"held (>= {HELD:.0%}): {'yes' if under[0] >= HELD * base[0] else 'NO'}")
        say(f"after the release: p99 within {WITHIN:.0f}x of the baseline's for {STEADY} s in a row from "
            f"{f'never (in {args.after:.0f} s)' if back is None else f'{back} s (then {relapses} s over)'}: "
            f"within 60 s: {'yes' if back is not None and back <= 60 else 'NO'}; backlog back to the "
            f"baseline's max ({done[0].backlog:,}) after {'never' if drained is None else f'{drained:.0f} s'}")
    broker.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("pin", "readers", "both", "scans"), default="pin")
    p.add_argument("--jobs", choices=tuple(JOB_SHAPES), default="plain",
                   help="plain: no-op jobs; keyed: each with a dedupe key of its own and one of"
                        f" {CONCURRENCY_KEYS} concurrency keys (a web app's jobs); deduped: the dedupe key"
                        f" alone; concurrency: one of the {CONCURRENCY_KEYS} concurrency keys alone")
    p.add_argument("--rate", type=float, default=None, help="jobs/s (default: half a warm-up drain)")
    p.add_argument("--baseline", type=float, default=60.0, help="seconds unpinned first")
    p.add_argument("--pin", type=float, default=90.0, help="seconds under pressure (pin and/or readers)")
    p.add_argument("--after", type=float, default=60.0, help="seconds after the release")
    p.add_argument("--settle", type=float, default=10.0, help="seconds of stream before the baseline")
    p.add_argument("--interval", type=float, default=60.0, help="seconds per timeline line")
    p.add_argument("--threads", type=int, default=16, help="threads of the one worker process")
    p.add_argument("--reader-xact", type=float, default=30.0, help="seconds each reader's transaction lasts")
    p.add_argument("--reader-pause", type=float, default=0.5, help="seconds between a reader's rounds of scans")
    p.add_argument("--server-log", type=Path, default=None,
                   help="the server's log file (e.g. /var/log/postgresql/postgresql-15-main.log): the claim's "
                        "execution time in PostgreSQL per phase, from the worker's statements logged with their "
                        "durations (bench/server_log.py; a superuser's setting)")
    p.add_argument("--database-url", default=None)
    args = p.parse_args(argv)
    say(code_state())
    with bench_database(server_url(args.database_url)) as url:
        return run(url, args)


if __name__ == "__main__":
    sys.exit(main())
