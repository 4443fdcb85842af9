"""Mixed job lengths: paced prefetch against a fixed prefetch of the thread count.

    python bench/bench_mixed.py [--repeat 3] [--rate 150] [--seconds 20] [--burst 2000]
                                [--threads 4] [--database-url URL]

2 worker processes x --threads (4) run jobs of which 95 % take 1 ms and 5 % take 500 ms
(bench_actors.timed: it records when it started, then sleeps out the rest of its
length), in the same seeded order for every run. Each run starts fresh workers, either
paced (no `--prefetch`, the default) or with `--prefetch` = threads (no row ever waits
for a thread), alternating paced, fixed, paced, fixed ... so load drift on a shared
machine hits both alike:

- stream: --rate jobs/s for --seconds, a batch every 10 ms on a fixed schedule with
  `enqueue_many`; enqueue-to-start = the actor's first `time.time()` minus the time just
  before the batch was sent (p50, p99, max);
- burst: --burst jobs in one transaction; throughput = jobs / (commit until none is left).

Each run also counts the rows given back for want of a free thread (job_events), and
the summary checks the goal: paced p99 at most fixed p99 + 20 ms, paced throughput not
lower (medians over the runs).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_broker import ANY_LIVE, _bulk_enqueue, _drain, load
from bench.common import (
    WorkerPool,
    bench_database,
    code_state,
    empty_jobs,
    percentile,
    reset,
    say,
    server_url,
)

SHORT_S, LONG_S, LONG_SHARE = 0.001, 0.5, 0.05
TICK = 0.01
GIVEN_BACK = "SELECT count(*) FROM job_events WHERE reason LIKE 'given back%%'"


def lengths(n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [LONG_S if rng.random() < LONG_SHARE else SHORT_S for _ in range(n)]


def stream(conn: psycopg.Connection, broker, actor, *, rate: float, seconds: float, seed: int) -> list[float]:
    """Send ``rate`` jobs a second for ``seconds``; returns each job's enqueue-to-start (ms)."""
    plan = lengths(int(rate * seconds), seed)
    sent = 0
    started = time.monotonic()
    tick = 0
    while sent < len(plan):
        due = min(len(plan), int(rate * (tick + 1) * TICK)) - sent
        if due > 0:
            now = time.time()
            broker.enqueue_many([actor.message(now, s) for s in plan[sent:sent + due]])
            sent += due
        tick += 1
        pause = started + tick * TICK - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    deadline = time.monotonic() + 120
    while conn.execute("SELECT count(*) FROM bench_latency").fetchone()[0] < len(plan):
        if time.monotonic() > deadline:
            raise RuntimeError("stream jobs did not all start within 120 s")
        time.sleep(0.05)
    return [r[0] for r in conn.execute("SELECT (started - sent) * 1000 FROM bench_latency").fetchall()]


def burst(url: str, conn: psycopg.Connection, broker, actor, *, jobs: int, seed: int) -> float:
    """``jobs`` jobs in one commit; returns jobs/s until none is left."""
    messages = [actor.message(0.0, s) for s in lengths(jobs, seed)]
    committed = _bulk_enqueue(url, messages, broker, 0)
    return jobs / _drain(conn, jobs, committed, timeout=300)


def run(url: str, broker, actors, *, mode: str, args: argparse.Namespace, seed: int) -> dict[str, float]:
    prefetch = args.threads if mode == "fixed" else None
    with psycopg.connect(url, autocommit=True) as conn:
        reset(conn)
        conn.execute("TRUNCATE bench_latency")
        with WorkerPool(url, count=2, threads=args.threads, prefetch=prefetch):
            # Warm-up with the mix itself: connections, prepared statements, and the pace
            # settled on these lengths.
            broker.enqueue_many([actors.timed.message(0.0, s) for s in lengths(200, seed + 1)])
            deadline = time.monotonic() + 120
            while conn.execute(ANY_LIVE).fetchone()[0]:
                if time.monotonic() > deadline:
                    raise RuntimeError("warm-up jobs did not finish")
                time.sleep(0.05)
            empty_jobs(conn)
            conn.execute("TRUNCATE bench_latency")
            waits = stream(conn, broker, actors.timed, rate=args.rate, seconds=args.seconds, seed=seed)
            while conn.execute(ANY_LIVE).fetchone()[0]:
                time.sleep(0.05)
            given_back = conn.execute(GIVEN_BACK).fetchone()[0]
            empty_jobs(conn)
            conn.execute("TRUNCATE bench_latency")
            rate = burst(url, conn, broker, actors.timed, jobs=args.burst, seed=seed + 2)
            given_back_burst = conn.execute(GIVEN_BACK).fetchone()[0]
    out = {"p50": percentile(waits, 50), "p99": percentile(waits, 99), "max": max(waits), "jobs/s": rate,
           "given back": given_back, "given back (burst)": given_back_burst}
    say(f"  {mode:<5} enqueue->start p50 {out['p50']:6.2f} ms  p99 {out['p99']:7.2f} ms  max {out['max']:7.1f} ms  "
        f"| burst {rate:6.1f} jobs/s | rows given back: stream {given_back}, burst {given_back_burst} | {load()}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=3, help="runs of each mode (alternating)")
    p.add_argument("--rate", type=float, default=150.0, help="stream jobs/s (capacity is ~8 / 26 ms = 300)")
    p.add_argument("--seconds", type=float, default=20.0, help="stream length")
    p.add_argument("--burst", type=int, default=2000, help="jobs in the burst")
    p.add_argument("--threads", type=int, default=4, help="threads per process (2 processes)")
    p.add_argument("--database-url", default=None)
    args = p.parse_args(argv)

    say(code_state())
    results: dict[str, list[dict[str, float]]] = {"paced": [], "fixed": []}
    with bench_database(server_url(args.database_url)) as url:
        import supervisor

        broker = supervisor.setup_broker(url)
        from bench import bench_actors as actors

        say(f"2 x {args.threads} threads; {1 - LONG_SHARE:.0%} of jobs {SHORT_S * 1000:.0f} ms, "
            f"{LONG_SHARE:.0%} {LONG_S * 1000:.0f} ms; stream {args.rate:.0f} jobs/s for {args.seconds:.0f} s, "
            f"burst {args.burst:,}")
        for i in range(args.repeat):
            for mode in ("paced", "fixed"):
                results[mode].append(run(url, broker, actors, mode=mode, args=args, seed=i))
        broker.close()

    def median(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in results[mode])

    say("")
    say(f"medians of {args.repeat} runs      paced      fixed (prefetch = threads)")
    for key, unit in (("p50", "ms"), ("p99", "ms"), ("max", "ms"), ("jobs/s", "jobs/s"), ("given back", "rows")):
        say(f"  {key + ' (' + unit + ')':<22} {median('paced', key):>9.2f}  {median('fixed', key):>9.2f}")
    p99_ok = median("paced", "p99") <= median("fixed", "p99") + 20
    rate_ok = median("paced", "jobs/s") >= median("fixed", "jobs/s")
    say(f"goal: paced p99 <= fixed p99 + 20 ms: {'yes' if p99_ok else 'NO'}; "
        f"paced throughput >= fixed: {'yes' if rate_ok else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
