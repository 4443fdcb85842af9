"""Broker benchmark: throughput of no-op jobs, enqueue-to-start latency, and
I/O-bound throughput, with every job's completion durable in PostgreSQL.

    python bench/bench_broker.py [--only W1,W2,W3] [--jobs 20000] [--repeat 3]
                                 [--w1-threads 8,16,32,64] [--executors own,dramatiq] [--database-url URL]

W1  N no-op jobs bulk-enqueued with broker.enqueue_many (one transaction),
    then drained by 2 worker processes: jobs/s from the enqueue's commit until
    the DB shows no live job left (polled every 10 ms). Tried for each
    --w1-threads value; the best is reported with its thread count.
W2  1,000 jobs sent with actor.send() 10 ms apart to idle workers: latency
    from just before send() to the first line of the actor (both clocks are
    time.time() on this host), plus started_at - created_at from the DB.
W3  2,000 jobs sleeping 50 ms each on 2 processes x 16 threads: jobs/s
    against the ideal of 2 x 16 / 0.05 = 640.

--executors runs each workload with each executor (the role key `executor`) in turn,
run by run (A B A B ...), and reports each apart: a before/after in one run.
--job-log off,on does the same with the per-job log line (`--no-job-log` / the default),
each worker's stderr to a file as in production; "traced" is the line on plus tracing
(opentelemetry-instrument, its console exporter written to /dev/null), "sampled" the
same recording one trace in ten (parentbased_traceidratio 0.1), "base" the line on in
workers run from the tree $BENCH_BASE_TREE (e.g. `git archive` of an older commit).

A fresh database is created on the server (DATABASE_URL or --database-url,
default postgresql://postgres@127.0.0.1:5432/postgres) and dropped at the end.
synchronous_commit is left at the server's setting: an ack counts only once
its UPDATE has committed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    Figure,
    WorkerPool,
    bench_database,
    code_state,
    cpu_seconds,
    empty_jobs,
    percentile,
    print_table,
    reset,
    say,
    server_url,
    status_counts,
    wait_until,
)

# Cheap enough to run every 10 ms: the first two are partial-index probes of job_queue; the
# last, the job log's, every log row has its done row: two counts of narrow tables.
ANY_LIVE = """
SELECT EXISTS (SELECT 1 FROM job_queue WHERE queue = 'bench' AND status IN ('pending', 'retryable'))
    OR EXISTS (SELECT 1 FROM job_queue WHERE status = 'running')
    OR (SELECT count(*) FROM job_log) > (SELECT count(*) FROM job_done)
"""

W3_IDEAL = 2 * 16 / 0.05

# W3 per process: jobs, first start to last finish (s), claims, the threads' busy
# seconds and the mean start->finish. finished_at is the ack batch's commit, so the
# busy share counts a job's ack wait as busy: idle below it is time a thread had no row.
W3_SPANS = """
SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at))::float8,
       count(DISTINCT claimed_at), sum(extract(epoch FROM finished_at - started_at))::float8,
       avg(extract(epoch FROM finished_at - started_at))::float8
  FROM jobs WHERE queue = 'bench' AND actor = 'sleeper' GROUP BY lease_owner ORDER BY 1 DESC
"""

# One row per W2 job, in ms: send->start, the DB's own started_at - created_at,
# then the three legs. created_at and claimed_at are the INSERT's and the
# claim's transaction start (now()), read from the same host clock as time.time().
LATENCY_PARTS = """
SELECT (l.started - l.sent) * 1000,
       extract(epoch FROM j.started_at - j.created_at)::float8 * 1000,
       (extract(epoch FROM j.created_at)::float8 - l.sent) * 1000,
       extract(epoch FROM j.claimed_at - j.created_at)::float8 * 1000,
       (l.started - extract(epoch FROM j.claimed_at)::float8) * 1000
  FROM bench_latency l JOIN jobs j ON j.id = l.job_id
"""

# How the drain was shaped: a claim stamps its rows with one claimed_at (its
# transaction's now()), an ack batch with one finished_at, per process.
BATCHES = """
SELECT (SELECT count(*) FROM (SELECT DISTINCT lease_owner, claimed_at FROM jobs) c),
       (SELECT count(*)::float / greatest(1, count(DISTINCT (lease_owner, claimed_at))) FROM jobs),
       (SELECT count(*) FROM (SELECT DISTINCT lease_owner, finished_at FROM jobs) f),
       (SELECT count(*)::float / greatest(1, count(DISTINCT (lease_owner, finished_at))) FROM jobs)
"""


def load() -> str:
    """The machine is shared: every figure is printed with the load it ran under."""
    return f"load avg {os.getloadavg()[0]:.1f}"


def _settings_line(conn: psycopg.Connection) -> str:
    rows = conn.execute(
        "SELECT name, setting FROM pg_settings WHERE name IN "
        "('synchronous_commit', 'fsync', 'wal_sync_method', 'shared_buffers', 'server_version')"
    ).fetchall()
    return ", ".join(f"{k}={v}" for k, v in rows)


def _drain(conn: psycopg.Connection, expected: int, started: float, timeout: float) -> float:
    """Wait until no job is live; return the seconds since ``started``.
    Prints a progress line about once a second."""
    next_report = started + 1.0

    def done() -> bool:
        nonlocal next_report
        if time.monotonic() >= next_report:
            counts = status_counts(conn)
            say(f"    ... {counts.get('succeeded', 0):,}/{expected:,} succeeded after "
                f"{time.monotonic() - started:.1f}s")
            next_report += 1.0
        return not conn.execute(ANY_LIVE).fetchone()[0]

    ended = wait_until(done, timeout, interval=0.01, what="the queue to drain")
    counts = status_counts(conn)
    if counts.get("succeeded", 0) != expected:
        raise RuntimeError(f"expected {expected} succeeded jobs, found {counts}")
    return ended - started


def _bulk_enqueue(url: str, messages: list, broker, chunk: int) -> float:
    """Enqueue in one transaction (so the drain starts from one commit);
    return the time the commit returned."""
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        for i in range(0, len(messages), chunk or len(messages)):
            broker.enqueue_many(messages[i:i + (chunk or len(messages))], conn=conn)
    return time.monotonic()


def _warm_up(url: str, conn: psycopg.Connection, broker, actor, n: int = 200) -> None:
    """Open every process's pool connections and prepare its statements, so the
    timed part measures the steady state rather than connection set-up."""
    broker.enqueue_many([actor.message() for _ in range(n)])
    wait_until(lambda: not conn.execute(ANY_LIVE).fetchone()[0], 60, what="warm-up jobs")
    empty_jobs(conn)


def w1(url: str, broker, actors, *, jobs: int, threads: int, chunk: int, pool: dict | None = None) -> dict[str, float]:
    with psycopg.connect(url, autocommit=True) as conn:
        reset(conn)
        with WorkerPool(url, count=2, threads=threads, **(pool or {})) as workers:
            _warm_up(url, conn, broker, actors.noop)
            cpu0 = sum(cpu_seconds(pid) for pid in workers.pids())
            t0 = time.monotonic()
            messages = [actors.noop.message() for _ in range(jobs)]
            built = time.monotonic()
            committed = _bulk_enqueue(url, messages, broker, chunk)
            enqueue_rate = jobs / (committed - t0)
            insert_rate = jobs / (committed - built)
            say(f"    enqueued {jobs:,} in {committed - t0:.3f}s ({enqueue_rate:,.0f} jobs/s; "
                f"building messages {built - t0:.3f}s, enqueue_many + commit {committed - built:.3f}s)")
            seconds = _drain(conn, jobs, committed, timeout=300)
            # The workers' CPU per job: steadier than jobs/s on a loaded machine (it leaves out
            # time spent waiting for a core), and what the job line and tracing add to a job.
            cpu_us = (sum(cpu_seconds(pid) for pid in workers.pids()) - cpu0) / jobs * 1e6
            shape = conn.execute(BATCHES).fetchone()
    rate = jobs / seconds
    say(f"    drained {jobs:,} in {seconds:.3f}s -> {rate:,.0f} jobs/s, workers' CPU {cpu_us:.0f} us/job "
        f"({shape[0]:,} claims of {shape[1]:.1f} rows on average, {shape[2]:,} ack batches of {shape[3]:.1f}; "
        f"{load()})")
    return {"enqueue": enqueue_rate, "insert": insert_rate, "drain": rate, "cpu": cpu_us}


def w2(url: str, actors, *, jobs: int, threads: int, interval: float, processes: int = 2,
       pool: dict | None = None) -> dict[str, list[float]]:
    with psycopg.connect(url, autocommit=True) as conn:
        reset(conn)
        with WorkerPool(url, count=processes, threads=threads, **(pool or {})):
            for _ in range(20):  # warm-up: connections, prepared statements, caches
                actors.latency.send(time.time())
                time.sleep(interval)
            wait_until(lambda: conn.execute("SELECT count(*) FROM bench_latency").fetchone()[0] == 20, 30,
                       what="warm-up jobs")
            conn.execute("DELETE FROM bench_latency")
            reset(conn)
            send_ms = []
            returned: dict[str, float] = {}  # job id -> when send() returned (the job is committed)
            start = time.monotonic()
            for i in range(jobs):
                pause = start + i * interval - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                before = time.time()
                message = actors.latency.send(before)
                after = time.time()
                returned[message.message_id] = after
                send_ms.append((after - before) * 1000)
                if i and i % 250 == 0:
                    say(f"    ... sent {i:,}/{jobs:,}")
            wait_until(lambda: conn.execute("SELECT count(*) FROM bench_latency").fetchone()[0] == jobs, 60,
                       interval=0.02, what="latency rows")
            wait_until(lambda: not conn.execute(ANY_LIVE).fetchone()[0], 60, what="acks")
            counts = status_counts(conn)
            if counts.get("succeeded", 0) != jobs:
                raise RuntimeError(f"expected {jobs} succeeded jobs, found {counts}")
            rows = conn.execute(LATENCY_PARTS).fetchall()
            started = conn.execute("SELECT job_id::text, started FROM bench_latency").fetchall()
    committed_ms = [(t - returned[job_id]) * 1000 for job_id, t in started]
    start_ms = [r[0] for r in rows]
    db_ms = [r[1] for r in rows]
    parts = {name: [r[i] for r in rows] for i, name in enumerate(
        ("send->INSERT began", "INSERT began->claim began", "claim began->actor started"), start=2)}

    def pct(values: list[float]) -> str:
        return " ".join(f"p{q} {percentile(values, q):.2f}" for q in (50, 95, 99)) + f" max {max(values):.2f}"

    say(f"    send->start ms: {pct(start_ms)}; send() returned->start: {pct(committed_ms)}; "
        f"send() call: {pct(send_ms)}; "
        f"DB started_at-created_at: {pct(db_ms)}; {load()}")
    say("    where the time goes (ms): " + "; ".join(f"{k} {pct(v)}" for k, v in parts.items()))
    return {"start": start_ms, "send": send_ms, "db": db_ms, "committed": committed_ms}


def w3(url: str, broker, actors, *, jobs: int, sleep_s: float, pool: dict | None = None) -> float:
    with psycopg.connect(url, autocommit=True) as conn:
        reset(conn)
        with WorkerPool(url, count=2, threads=16, **(pool or {})):
            _warm_up(url, conn, broker, actors.noop)
            messages = [actors.sleeper.message(sleep_s) for _ in range(jobs)]
            committed = _bulk_enqueue(url, messages, broker, 0)
            seconds = _drain(conn, jobs, committed, timeout=120)
        spans = conn.execute(W3_SPANS).fetchall()
    rate = jobs / seconds
    say(f"    drained {jobs:,} x {sleep_s * 1000:.0f} ms sleeps in {seconds:.3f}s -> {rate:,.0f} jobs/s "
        f"({rate / W3_IDEAL:.1%} of {W3_IDEAL:.0f}; {load()})")
    say("    where the time goes, per process: " + "; ".join(
        f"{n} jobs in {span:.2f}s, {claims} claims, threads busy {busy / (16 * span):.1%} of the span, "
        f"mean start->finish {mean * 1000:.1f} ms" for n, span, claims, busy, mean in spans))
    return rate


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="W1,W2,W3", help="comma-separated workloads to run")
    p.add_argument("--jobs", type=int, default=20_000, help="W1 job count")
    p.add_argument("--w2-jobs", type=int, default=1_000)
    p.add_argument("--w3-jobs", type=int, default=2_000)
    p.add_argument("--repeat", type=int, default=3, help="runs of each workload (best and spread reported)")
    p.add_argument("--w1-threads", default="8,16,32,64", help="thread counts per process to try in W1")
    p.add_argument("--w2-threads", type=int, default=8, help="threads per process in W2")
    p.add_argument("--prefetch-factor", type=int, default=0,
                   help="W1/W3 workers hold up to factor x threads claimed rows (default 0: the product's"
                        " default, paced)")
    p.add_argument("--chunk", type=int, default=0, help="W1 enqueue_many batch size (0: one call)")
    p.add_argument("--executors", default="own",
                   help="comma-separated executors (own, dramatiq), alternated run by run (a ':log' suffix, from"
                        " when the storage was a choice, is accepted and changes nothing)")
    p.add_argument("--job-log", default="off",
                   help="comma-separated: off (--no-job-log), on (the default line), traced (on, and spans to the"
                        " console exporter, to /dev/null), sampled (traced, 1 trace in 10); alternated run by"
                        " run with the executors")
    p.add_argument("--database-url", default=None,
                   help="server to create the bench database on (default $DATABASE_URL, else local)")
    args = p.parse_args(argv)
    only = {w.strip().upper() for w in args.only.split(",") if w.strip()}
    modes = [m.strip() for m in args.job_log.split(",") if m.strip()]
    executors = [f"{e.strip()}/{m}" for e in args.executors.split(",") if e.strip() for m in modes]

    def named(config: str, executor: str) -> str:
        name, _, mode = executor.partition("/")
        tags = ([] if name == "own" and "," not in args.executors else [name]) + \
            ([f"job log {mode}"] if modes != ["off"] else [])
        return ", ".join([config, *tags])

    def variant(name: str, pool: dict) -> dict:
        """The worker pool's options for an executor/job-log variant. (SUPERVISOR_STORAGE=log:
        a base tree from before one store, BENCH_BASE_TREE, then sends and claims as today's.)"""
        name, _, mode = name.partition("/")
        executor = name.partition(":")[0]
        env = {"SUPERVISOR_STORAGE": "log"}
        if mode in ("traced", "sampled"):
            env.update(OTEL_TRACES_EXPORTER="console", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none",
                       OTEL_SERVICE_NAME="bench-worker")
        if mode == "sampled":  # one trace in ten recorded (the bench's sends have no parent)
            env.update(OTEL_TRACES_SAMPLER="parentbased_traceidratio", OTEL_TRACES_SAMPLER_ARG="0.1")
        # base: the line on, the workers' code from another tree (a before/after in one run)
        root = {"root": Path(os.environ["BENCH_BASE_TREE"])} if mode == "base" else {}
        return {**pool, "executor": executor, "env": env, "job_log": mode != "off",
                "traced": mode in ("traced", "sampled"), **root}

    server = server_url(args.database_url)
    figures: list[Figure] = []
    with bench_database(server) as url:
        import supervisor

        broker = supervisor.setup_broker(url)
        from bench import bench_actors as actors

        with psycopg.connect(url, autocommit=True) as conn:
            say(f"server: {_settings_line(conn)}")
        say(code_state())

        if "W1" in only:
            thread_counts = [int(t) for t in args.w1_threads.split(",")]
            drains: dict[tuple[int, str], list[float]] = {}
            cpus: dict[tuple[int, str], list[float]] = {}
            enqueues: list[float] = []
            inserts: list[float] = []
            for run in range(args.repeat):
                for threads in thread_counts:
                    for executor in executors:
                        say(f"W1 run {run + 1}/{args.repeat}: {args.jobs:,} no-op jobs, 2 processes x {threads} "
                            f"threads, executor {executor}")
                        r = w1(url, broker, actors, jobs=args.jobs, threads=threads, chunk=args.chunk,
                               pool=variant(executor, {"prefetch": threads * args.prefetch_factor or None}))
                        drains.setdefault((threads, executor), []).append(r["drain"])
                        cpus.setdefault((threads, executor), []).append(r["cpu"])
                        enqueues.append(r["enqueue"])
                        inserts.append(r["insert"])
            figures.append(Figure("W1 enqueue (build+insert+commit)", "jobs/s", tuple(enqueues),
                                  config=f"enqueue_many x{args.jobs:,}"))
            figures.append(Figure("W1 enqueue (enqueue_many+commit)", "jobs/s", tuple(inserts),
                                  config=f"enqueue_many x{args.jobs:,}"))
            for (threads, executor), values in drains.items():
                figures.append(Figure("W1 drain", "jobs/s", tuple(values), target=15_000,
                                      config=named(f"2 proc x {threads} thr", executor)))
            for (threads, executor), values in cpus.items():
                figures.append(Figure("W1 workers' CPU per job", "us", tuple(values), higher_is_better=False,
                                      config=named(f"2 proc x {threads} thr", executor)))
            for executor in executors:
                best = max(thread_counts, key=lambda t: max(drains[(t, executor)]))
                say(f"W1 best thread count ({executor}): {best} ({max(drains[(best, executor)]):,.0f} jobs/s)")

        if "W2" in only:
            w2s: dict[str, dict[str, list[float]]] = {e: defaultdict(list) for e in executors}
            for run in range(args.repeat):
                for executor in executors:
                    say(f"W2 run {run + 1}/{args.repeat}: {args.w2_jobs:,} sends 10 ms apart, "
                        f"2 idle processes x {args.w2_threads} threads, executor {executor}")
                    r = w2(url, actors, jobs=args.w2_jobs, threads=args.w2_threads, interval=0.01,
                           pool=variant(executor, {}))
                    got = w2s[executor]
                    for name, values, q in (("p50", r["start"], 50), ("p95", r["start"], 95),
                                            ("p99", r["start"], 99), ("db99", r["db"], 99), ("send50", r["send"], 50),
                                            ("c50", r["committed"], 50), ("c99", r["committed"], 99)):
                        got[name].append(percentile(values, q))
            for executor, got in w2s.items():
                cfg = named(f"2 proc x {args.w2_threads} thr", executor)
                figures += [
                    Figure("W2 send->start p50", "ms", tuple(got["p50"]), higher_is_better=False, config=cfg),
                    Figure("W2 send->start p95", "ms", tuple(got["p95"]), higher_is_better=False, config=cfg),
                    Figure("W2 send->start p99", "ms", tuple(got["p99"]), higher_is_better=False, target=3.0,
                           config=cfg),
                    Figure("W2 DB started-created p99", "ms", tuple(got["db99"]), higher_is_better=False, config=cfg),
                    Figure("W2 send() call p50", "ms", tuple(got["send50"]), higher_is_better=False, config=cfg),
                    Figure("W2 committed->start p50", "ms", tuple(got["c50"]), higher_is_better=False, config=cfg),
                    Figure("W2 committed->start p99", "ms", tuple(got["c99"]), higher_is_better=False, target=3.0,
                           config=cfg),
                ]

        if "W3" in only:
            rates: dict[str, list[float]] = {e: [] for e in executors}
            for run in range(args.repeat):
                for executor in executors:
                    say(f"W3 run {run + 1}/{args.repeat}: {args.w3_jobs:,} x 50 ms sleeps, 2 processes x 16 threads,"
                        f" executor {executor}")
                    rates[executor].append(w3(url, broker, actors, jobs=args.w3_jobs, sleep_s=0.05,
                                              pool=variant(executor, {"prefetch": 16 * args.prefetch_factor or None})))
            for executor, values in rates.items():
                cfg = named("2 proc x 16 thr", executor)
                figures.append(Figure("W3 drain", "jobs/s", tuple(values), target=0.9 * W3_IDEAL, config=cfg))
                figures.append(Figure("W3 % of ideal 640", "%", tuple(100 * r / W3_IDEAL for r in values),
                                      target=90.0, config=cfg))
        broker.close()

    say("")
    say(f"summary (best of {args.repeat} runs; spread = min..max)")
    print_table(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
