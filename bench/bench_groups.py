"""Dramatiq's rate limiters, group callbacks and supervisor.pipeline's group steps on
PostgreSQL (issue 41): what a limiter call costs, and how soon a group's callback or the
step after a group starts once its last member is done.

    python bench/bench_groups.py [--ops 2000] [--members 200] [--repeat 3] [--threads 8] [--database-url URL]

L1  ConcurrentRateLimiter(PostgresBackend(), limit=4): one acquire + release, one thread (us).
L2  the same from --threads threads at once: pairs per second.
G1  a group of --members no-op members with a completion callback, in one worker process of
    --threads threads: from run() to the callback's start, and from the last member's end
    to the callback's start (the fan-in lag).
G0  the same members sent as plain messages (no group): from the send to the last one's end,
    sent in one enqueue_many, and one by one (as Dramatiq's group.run() sends its members).
P1  supervisor.pipeline([seed, group of --members, collect]): from the last member's end to
    collect's start.

Times are time.time() in the actors (one process, one clock); each figure is the median of
--repeat runs, with the best.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dramatiq
from dramatiq.rate_limits import ConcurrentRateLimiter

import supervisor
from bench.common import bench_database, code_state, percentile, say, server_url
from supervisor.broker import PostgresBroker
from supervisor.rate_limits import PostgresBackend


class Clock:
    """The actors' marks: each member's end, the callback's start; ``done`` when it started."""

    def __init__(self) -> None:
        self.ends: list[float] = []
        self.final = 0.0
        self.done = threading.Event()

    def member(self) -> None:
        self.ends.append(time.time())

    def finish(self) -> None:
        self.final = time.time()
        self.done.set()


def declare(broker: PostgresBroker, clock: list[Clock]) -> dict[str, Any]:
    def actor(fn: Callable[..., Any]) -> Any:
        return dramatiq.actor(broker=broker, queue_name="bench_groups", actor_name=fn.__name__, max_retries=0)(fn)

    def member(*_: Any) -> int:
        clock[0].member()
        return 1

    def callback(*_: Any) -> None:
        clock[0].finish()

    def plain(last: bool) -> None:
        clock[0].member()
        if last:
            clock[0].finish()

    return {f.__name__: actor(f) for f in (member, callback, plain)}


def limiter_figures(url: str, ops: int, threads: int) -> tuple[list[float], float]:
    backend = PostgresBackend(url=url)
    limiter = ConcurrentRateLimiter(backend, "bench-slots", limit=4)
    pairs: list[float] = []
    for _ in range(ops):
        started = time.perf_counter()
        with limiter.acquire(raise_on_failure=False):
            pass
        pairs.append((time.perf_counter() - started) * 1e6)

    def hammer() -> None:
        for _ in range(ops // threads):
            with limiter.acquire(raise_on_failure=False):
                pass

    workers = [threading.Thread(target=hammer) for _ in range(threads)]
    started = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    rate = (ops // threads) * threads / (time.perf_counter() - started)
    backend.close()
    return pairs, rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--members", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--database-url")
    args = parser.parse_args()
    say(code_state())
    with bench_database(server_url(args.database_url)) as url:
        pairs, rate = limiter_figures(url, args.ops, args.threads)
        say(f"L1 acquire+release, 1 thread: p50 {percentile(pairs, 50):.0f} us, p99 {percentile(pairs, 99):.0f} us")
        say(f"L2 acquire+release, {args.threads} threads: {rate:.0f} pairs/s")
        broker = PostgresBroker(url, pool_size=4)
        dramatiq.set_broker(broker)
        clock = [Clock()]
        a = declare(broker, clock)
        worker = dramatiq.Worker(broker, worker_threads=args.threads, worker_timeout=100)
        worker.start()
        runs: dict[str, list[float]] = {"G1 run -> callback": [], "G1 run() itself": [],
                                        "G1 last member -> callback": [], "G0 enqueue_many -> last end": [],
                                        "G0 one by one -> last end": [], "P1 last member -> next step": []}
        try:
            for _ in range(args.repeat):
                clock[0] = Clock()
                sent = time.time()
                broker.enqueue_many([a["plain"].message(i == args.members - 1) for i in range(args.members)])
                clock[0].done.wait(120)
                runs["G0 enqueue_many -> last end"].append((max(clock[0].ends) - sent) * 1000)

                clock[0] = Clock()
                sent = time.time()
                for i in range(args.members):
                    a["plain"].send(i == args.members - 1)
                clock[0].done.wait(120)
                runs["G0 one by one -> last end"].append((max(clock[0].ends) - sent) * 1000)

                clock[0] = Clock()
                g = dramatiq.group([a["member"].message() for _ in range(args.members)], broker=broker)
                g.add_completion_callback(a["callback"].message())
                sent = time.time()
                g.run()
                runs["G1 run() itself"].append((time.time() - sent) * 1000)
                clock[0].done.wait(120)
                runs["G1 run -> callback"].append((clock[0].final - sent) * 1000)
                runs["G1 last member -> callback"].append((clock[0].final - max(clock[0].ends)) * 1000)

                clock[0] = Clock()
                supervisor.pipeline([a["member"].message(),
                                     dramatiq.group([a["member"].message() for _ in range(args.members)],
                                                    broker=broker),
                                     a["callback"].message()], broker=broker).run()
                clock[0].done.wait(120)
                runs["P1 last member -> next step"].append((clock[0].final - max(clock[0].ends)) * 1000)
        finally:
            worker.stop()
            broker.close()
    say(f"{args.members} members, {args.threads} threads, {args.repeat} runs:")
    for name, values in runs.items():
        say(f"{name}: median {statistics.median(values):.1f} ms, best {min(values):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
