"""Flow control's targets (issue 22): a fleet-wide rate limit held and used, threads left
free by limited jobs, fair turns between tenants, and what keys cost the claim.

    python bench/bench_limits.py [--jobs 2000] [--backlog 100000] [--keys 10000] [--only L1,L2,L3,L4]

L1  3 worker processes on one node and 1 on another (SUPERVISOR_NODE_NAME), 2,000 jobs of
    one key at rate_limit="20/s" (burst 1): the most starts in any 1 s window (target
    <= 21, the limit plus the burst) and the rate over the run (target within 5 % of 20/s).
L2  2 x 8 threads, 10,000 plain no-op jobs of the queue alone, then behind 2,000 jobs of
    200 keys whose buckets are empty (rate_limit="1/h"), alternating, --l2-repeat pairs:
    the median jobs/s of the plain ones (target: behind within 10 % of alone: no thread
    holds a limited job). A drain of 5,000 took ~1 s, where one run's spread was +-15 %.
L3  2 x 8 threads, tenant a enqueues --backlog jobs of 10 ms (fairness_key), then tenant b
    10: seconds from b's send to its last start (target <= 2).
L4  a worker's claim of 32 rows (PostgresBroker.claim: floors, turn cursor, prepared),
    from a queue of waiting rows over --keys keys with every other key blocked, from one
    over as many keys none blocked, and from a queue of plain rows, in turn (target: the
    half-blocked claim within 2x of the one with none blocked; also printed: against the
    plain claim, which reads no key and updates no bucket).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    Figure,
    WorkerPool,
    bench_database,
    code_state,
    print_table,
    reset,
    say,
    server_url,
    wait_until,
)

QUEUE = "limits"
ACTORS = "bench.limit_actors"
DONE = "SELECT count(*) FROM jobs WHERE queue = 'limits' AND status = 'succeeded'"


def pool(url: str, count: int, threads: int, node: str | None = None) -> WorkerPool:
    env = {"SUPERVISOR_NODE_NAME": node} if node else {}
    return WorkerPool(url, count=count, threads=threads, queues=QUEUE, actors=ACTORS, env=env)


def l1_rate(url: str, actors, jobs: int) -> list[Figure]:
    with psycopg.connect(url, autocommit=True) as conn:
        reset(conn)
        conn.execute("DELETE FROM rate_limiter_state")
        here, there = pool(url, 3, 8), pool(url, 1, 8, node="bench-node-b")
        with here, there:
            actors.paced.broker.enqueue_many([actors.paced.message() for _ in range(jobs)])
            wait_until(lambda: conn.execute(DONE).fetchone()[0] == jobs, jobs / actors.RATE * 2 + 60, 0.2,
                       "every paced job to finish")
        starts = sorted(r[0] for r in conn.execute("SELECT started FROM bench_latency"))
        nodes = conn.execute("SELECT count(DISTINCT split_part(lease_owner, ':', 1)) FROM jobs"
                             " WHERE queue = 'limits'").fetchone()[0]
    most, j = 0, 0
    for i, t in enumerate(starts):  # the most starts in any window [t, t + 1 s)
        while starts[j] < t - 1.0:
            j += 1
        most = max(most, i - j + 1)
    rate = (len(starts) - 1) / (starts[-1] - starts[0])
    say(f"L1: {jobs} jobs on 4 processes ({nodes} nodes): {rate:.2f} starts/s over "
        f"{starts[-1] - starts[0]:.1f} s, at most {most} in any second")
    return [Figure("L1 most starts in 1 s", "starts", (most,), higher_is_better=False, target=actors.RATE + 1,
                   config="3+1 procs, 20/s"),
            Figure("L1 rate used", "% of 20/s", (100 * rate / actors.RATE,), target=95, config="3+1 procs, 20/s")]


# Polled every 10 ms while L2 drains: probes of the live table's partial indexes (a
# count over the jobs view, history included, cost ~4 ms of server CPU a poll, a fifth of
# a core at that pace, and read a growing history). The count is checked once at the end.
# The plain jobs go to the job log (the default storage; the limited ones, to job_queue):
# a log row without its done row is still to run.
FREE_LIVE = """
SELECT EXISTS (SELECT 1 FROM job_queue WHERE queue = 'limits' AND status IN ('pending', 'retryable') AND actor = 'free')
    OR EXISTS (SELECT 1 FROM job_queue WHERE status = 'running' AND actor = 'free')
    OR (SELECT count(*) FROM job_log) > (SELECT count(*) FROM job_done)
"""


def _drain_free(url: str, conn: psycopg.Connection, actors, jobs: int) -> float:
    actors.free.broker.enqueue_many([actors.free.message() for _ in range(jobs)])
    start = time.monotonic()
    ended = wait_until(lambda: not conn.execute(FREE_LIVE).fetchone()[0], 300, 0.01, "the plain jobs to finish")
    done = conn.execute("SELECT count(*) FROM jobs WHERE actor = 'free' AND status = 'succeeded'").fetchone()[0]
    if done != jobs:
        raise RuntimeError(f"expected {jobs} plain jobs to succeed, found {done}")
    return jobs / (ended - start)


def l2_threads(url: str, actors, jobs: int = 10_000, limited: int = 2000, keys: int = 200,
               repeat: int = 2) -> list[Figure]:
    with psycopg.connect(url, autocommit=True) as conn:
        alone, behind_rates = [], []
        for behind in (False, True) * repeat:
            reset(conn)
            conn.execute("DELETE FROM rate_limiter_state")
            if behind:  # every key's bucket empty: one token an hour
                conn.execute("INSERT INTO rate_limiter_state (key, tokens, burst, rate_per_second, updated_at)"
                             " SELECT 'gated:' || k, 0, 1, 1.0 / 3600, now() FROM generate_series(0, %s) k", (keys,))
                actors.gated.broker.enqueue_many([actors.gated.message(i % keys) for i in range(limited)])
            with pool(url, 2, 8):
                (behind_rates if behind else alone).append(_drain_free(url, conn, actors, jobs))
            if behind:
                left = conn.execute("SELECT count(*) FROM jobs WHERE actor = 'gated' AND status = 'waiting'").fetchone()[0]
                say(f"L2: {left} limited jobs still waiting, holding no thread")
    a, b = statistics.median(alone), statistics.median(behind_rates)
    say(f"L2: plain jobs alone {', '.join(f'{r:,.0f}' for r in alone)}/s, behind {limited} limited ones"
        f" {', '.join(f'{r:,.0f}' for r in behind_rates)}/s (alternating)")
    return [Figure("L2 plain jobs/s, limited ones waiting", "% of alone", (100 * b / a,), target=90,
                   config="2x8 threads")]


def l3_fairness(url: str, actors, backlog: int) -> list[Figure]:
    with psycopg.connect(url, autocommit=True) as conn:
        reset(conn)
        broker = actors.tenant.broker
        for i in range(0, backlog, 10_000):
            broker.enqueue_many([actors.tenant.message("a") for _ in range(min(10_000, backlog - i))])
        with pool(url, 2, 8):
            wait_until(lambda: conn.execute("SELECT count(*) FROM jobs WHERE actor = 'tenant' AND status = 'succeeded'")
                       .fetchone()[0] >= min(200, backlog // 2), 60, 0.01, "tenant a's jobs to run")
            sent = time.time()
            broker.enqueue_many([actors.tenant.message("b") for _ in range(10)])
            wait_until(lambda: conn.execute("SELECT count(*) FROM bench_latency").fetchone()[0] == 10, 120, 0.01,
                       "tenant b's jobs to start")
            last = conn.execute("SELECT max(started) FROM bench_latency").fetchone()[0]
            waiting = conn.execute("SELECT count(*) FROM jobs WHERE flow_key = 'tenant:a' AND status = 'waiting'"
                                   ).fetchone()[0]
    say(f"L3: tenant b's 10 jobs all started {last - sent:.3f} s after their send, {waiting:,} of a's still waiting")
    return [Figure("L3 tenant b's last start", "s", (last - sent,), higher_is_better=False, target=2.0,
                   config=f"2x8, a: {backlog:,} x 10 ms")]


L4_CLAIM, L4_PER_KEY = 32, 10  # L4's rows a claim, and waiting rows a key


def l4_claim(url: str, keys: int, claims: int = 400, per_key: int = L4_PER_KEY) -> list[Figure]:
    """Claims of 32 by a PostgresBroker as a worker's (its floors, its turn cursor, prepared
    statements), in turn from three queues of keys x per_key rows: waiting rows over
    ``keys`` keys with every other key blocked, waiting rows over as many keys none
    blocked, and plain rows. Each claim's rows are then deleted on another connection, as
    their acks would."""
    import dramatiq

    from supervisor.broker import PostgresBroker

    queues = {"l4-half": "h", "l4-open": "o"}  # queue -> its keys' prefix
    with psycopg.connect(url, autocommit=True) as side:
        reset(side)
        side.execute("DELETE FROM rate_limiter_state")
        # rows enqueued one after another (a microsecond apart), as sends would make them
        side.execute("INSERT INTO job_queue (queue, actor, max_attempts, run_at) SELECT 'l4-plain', 'l4', 1,"
                     " now() - interval '1 minute' + i * interval '1 microsecond'"
                     " FROM generate_series(1, %s) i", (keys * per_key,))
        for queue, prefix in queues.items():
            side.execute("INSERT INTO job_queue (queue, actor, max_attempts, flow_key, flow, status, run_at)"
                         " SELECT %s, 'l4', 1, %s || lpad((i %% %s)::text, 6, '0'), '{\"r\": 100, \"b\": 100}',"
                         " 'waiting', now() - interval '1 minute' + i * interval '1 microsecond'"
                         " FROM generate_series(1, %s) i", (queue, prefix, keys, keys * per_key))
            side.execute("INSERT INTO rate_limiter_state (key, tokens, burst, rate_per_second, updated_at,"
                         " blocked_until)"
                         " SELECT %s || lpad(i::text, 6, '0'), 100, 100, 100, now(),"
                         " CASE WHEN %s AND i %% 2 = 0 THEN now() + interval '1 hour' END"
                         " FROM generate_series(0, %s) i", (prefix, queue == "l4-half", keys))
        side.execute("VACUUM ANALYZE job_queue, rate_limiter_state, job_concurrency")
        broker = PostgresBroker(url, pool_size=1)
        try:
            dramatiq.actor(lambda: None, broker=broker, actor_name="l4", queue_name="l4-plain")
            order = ["l4-half", "l4-open", "l4-plain"]
            times: dict[str, list[float]] = {q: [] for q in order}
            for queue in queues:
                broker.claim(queue, L4_CLAIM)  # the plain claim finds waiting rows: the keyed one from now on
            for i in range(claims):
                for queue in order[i % 3:] + order[:i % 3]:
                    start = time.perf_counter()
                    got = broker.claim(queue, L4_CLAIM)
                    times[queue].append(time.perf_counter() - start)
                    if len(got) != L4_CLAIM:
                        raise RuntimeError(f"{queue}: a claim took {len(got)} rows")
                    ids = [m.message_id for m in got]
                    side.execute("DELETE FROM job_queue WHERE id = ANY(%s::uuid[])", (ids,))
                    broker.leases.let_go(*ids)
        finally:
            broker.close()
    half, open_, plain = (statistics.median(times[q][20:]) * 1e6 for q in order)
    say(f"L4: a claim of 32 from {keys:,} keys: {half:,.0f} us half blocked, {open_:,.0f} us none blocked;"
        f" {plain:,.0f} us from plain rows (median of {claims - 20} each, in turn)")
    return [Figure("L4 claim, keys half blocked / none blocked", "x", (half / open_,), higher_is_better=False,
                   target=2.0, config=f"32 rows, {keys:,} keys"),
            Figure("L4 claim, keys half blocked / plain rows", "x", (half / plain,), higher_is_better=False,
                   config=f"32 rows, {keys:,} keys")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=2000, help="L1's jobs")
    p.add_argument("--backlog", type=int, default=100_000, help="L3's tenant a jobs")
    p.add_argument("--keys", type=int, default=10_000, help="L4's keys")
    p.add_argument("--l4-claims", type=int, default=400, help="L4's claims from each queue (the first 20 warm up)")
    p.add_argument("--only", default="L1,L2,L3,L4")
    p.add_argument("--l2-jobs", type=int, default=10_000, help="L2's plain jobs per drain")
    p.add_argument("--l2-repeat", type=int, default=5,
                   help="L2's alternating pairs (alone, behind); the median of each is compared")
    p.add_argument("--database-url", default=None)
    args = p.parse_args(argv)
    only = set(args.only.upper().split(","))
    if "L4" in only and args.l4_claims <= 20:
        p.error("--l4-claims: more than 20 (the first 20 of each queue warm up)")
    if "L4" in only and args.keys * L4_PER_KEY // 2 < (args.l4_claims + 1) * L4_CLAIM:
        p.error(f"--keys: at least {-(-2 * (args.l4_claims + 1) * L4_CLAIM // L4_PER_KEY):,} for {args.l4_claims} claims of"
                f" {L4_CLAIM} (every other key blocked, {L4_PER_KEY} rows a key)")
    with bench_database(server_url(args.database_url)) as url:
        import supervisor

        supervisor.setup_broker(url)
        from bench import limit_actors as actors

        say(code_state())
        figures: list[Figure] = []
        if "L4" in only:
            figures += l4_claim(url, args.keys, claims=args.l4_claims)
        if "L3" in only:
            figures += l3_fairness(url, actors, args.backlog)
        if "L2" in only:
            figures += l2_threads(url, actors, jobs=args.l2_jobs, repeat=args.l2_repeat)
        if "L1" in only:
            figures += l1_rate(url, actors, args.jobs)
        say(f"load {os.getloadavg()[0]:.2f}")
        print_table(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
