"""Durable workflows (issue 41, item 3): a workflow of --steps steps (one root, --steps - 2
parallel steps, one join) against as many plain jobs, on the same worker, in one run.

    python bench/bench_workflows.py [--steps 200] [--repeat 3] [--threads 8] [--database-url URL]

W0  --steps plain no-op jobs sent in one enqueue_many: from the send to the last one's end.
W1  the workflow, sent (every step and edge in one transaction): from the send to the join's
    end; the ratio is W0's time over W1's (the workflow's throughput relative to plain jobs).
J1  the join's start after its last parent's end (each parent stamps its end, the join its start).

Times are time.time() in the actors (one process, one clock); each figure is the median of
--repeat runs, with the best; J1 also as p50 over the runs.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dramatiq

import supervisor
from bench.common import bench_database, code_state, percentile, say, server_url
from supervisor.broker import PostgresBroker


class Clock:
    """The actors' marks: each step's end, the join's start; ``done`` when the last one ran."""

    def __init__(self, expect: int) -> None:
        self.expect = expect
        self.ends: list[float] = []
        self.join_start = 0.0
        self.last = 0.0
        self.done = threading.Event()
        self.lock = threading.Lock()

    def step(self) -> None:
        now = time.time()
        with self.lock:
            self.ends.append(now)
            if len(self.ends) == self.expect:
                self.last = now
                self.done.set()

    def join(self) -> None:
        self.join_start = time.time()
        self.last = time.time()
        self.done.set()


def declare(broker: PostgresBroker, clock: list[Clock]) -> dict[str, Any]:
    def actor(fn: Any) -> Any:
        return dramatiq.actor(broker=broker, queue_name="bench_wf", actor_name=fn.__name__, max_retries=0)(fn)

    def wf_step(*_: Any) -> int:
        clock[0].step()
        return 1

    def wf_join(parents: list[int]) -> None:
        clock[0].join()

    def wf_plain() -> None:
        clock[0].step()

    return {f.__name__: actor(f) for f in (wf_step, wf_join, wf_plain)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--database-url")
    args = parser.parse_args()
    # Dramatiq's Results warns at every step that returns a value without store_results: a
    # log line per step would be what this measures.
    logging.getLogger("dramatiq.results.middleware.Results").setLevel(logging.ERROR)
    say(code_state())
    n = max(3, args.steps)
    with bench_database(server_url(args.database_url)) as url:
        broker = PostgresBroker(url, pool_size=4)
        dramatiq.set_broker(broker)
        clock = [Clock(n)]
        a = declare(broker, clock)
        worker = dramatiq.Worker(broker, worker_threads=args.threads, worker_timeout=100)
        worker.start()
        runs: dict[str, list[float]] = {"W0 plain jobs, send -> last end": [], "W1 workflow, send -> join end": [],
                                        "W1 send itself": [], "J1 last parent end -> join start": []}
        ratios: list[float] = []
        try:
            for _ in range(args.repeat):
                clock[0] = Clock(n)
                sent = time.time()
                broker.enqueue_many([a["wf_plain"].message() for _ in range(n)])
                if not clock[0].done.wait(300):
                    raise SystemExit("plain jobs did not finish in 300 s")
                plain = (clock[0].last - sent) * 1000
                runs["W0 plain jobs, send -> last end"].append(plain)

                clock[0] = Clock(n + 10)  # done by the join only
                wf = supervisor.workflow("bench", broker=broker)
                root = wf.add(a["wf_step"].message())
                mids = [wf.add(a["wf_step"].message(), after=[root]) for _ in range(n - 2)]
                wf.add(a["wf_join"].message(), after=mids)
                sent = time.time()
                wf.send()
                runs["W1 send itself"].append((time.time() - sent) * 1000)
                if not clock[0].done.wait(300):
                    raise SystemExit("the workflow's join did not run in 300 s")
                took = (clock[0].last - sent) * 1000
                runs["W1 workflow, send -> join end"].append(took)
                runs["J1 last parent end -> join start"].append((clock[0].join_start - max(clock[0].ends)) * 1000)
                ratios.append(plain / took)
        finally:
            worker.stop()
            broker.close()
        say(f"{n} steps (1 root, {n - 2} parallel, 1 join) vs {n} plain jobs; {args.threads} threads, "
            f"{args.repeat} runs")
        for name, values in runs.items():
            say(f"{name}: median {statistics.median(values):.1f} ms, best {min(values):.1f} ms")
        say(f"W1 throughput / W0: median {statistics.median(ratios):.2f}x, best {max(ratios):.2f}x")
        say(f"J1 p50 {percentile(runs['J1 last parent end -> join start'], 50):.1f} ms over {args.repeat} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
