"""Where a worker's CPU per job goes, stage by stage, in one thread: no thread hand-offs,
no GIL contention, so the figures repeat within a few percent where profile_worker.py's
drain (the same code under 2 x 8 threads) moves by 10 % from run to run.

    python bench/job_path.py [--jobs 20000] [--claim 16] [--ack-batch 8] [--repeat 3]

On a fresh bench database, each run enqueues --jobs no-op jobs, then, with the process's
CPU time (every thread: os.times) read around each stage:
1. claim: ``PostgresBroker.claim`` of --claim rows at a time until the queue is empty (the
   statement's round trip, decoding the rows into messages, holding their leases);
2. queue: the executor's ``WorkQueue.put_batch`` of each claim, then ``get`` of every
   message (no thread waits: what a busy thread pays);
3. run: ``WorkerThread.process_message`` of each message as a worker thread runs it
   (before hooks, the no-op actor, after hooks, the ack into the batcher's list), with
   the ack batcher held, so its writes are not counted here;
4. finish: the batcher writes the acks in batches of --ack-batch (``sql.FINISH``; what
   a drain's group commit writes, about 8 per batch at 2 x 8 threads).
Each stage's CPU per job, and their sum, against the W1 drain's worker CPU per job
(profile_worker.py) for the same code: the rest is what threads cost.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dramatiq

from bench.common import bench_database, reset
from supervisor.broker import PostgresBroker
from supervisor.broker.consuming.fencing import Fence
from supervisor.worker.executor_threads import WorkerThread, WorkQueue
from supervisor.worker.scheduler import RunResults

QUEUE = "bench"


def cpu() -> float:
    t = os.times()
    return t.user + t.system


class _Holder:
    """What a worker thread finds in ``consumers``: the queue's consumer."""

    def __init__(self, consumer: object) -> None:
        self.consumer = consumer


def run(url: str, jobs: int, claim: int, ack_batch: int) -> dict[str, float]:
    broker = PostgresBroker(url, pool_size=2)
    broker.add_middleware(RunResults(), before=Fence)
    dramatiq.set_broker(broker)

    @dramatiq.actor(broker=broker, queue_name=QUEUE, actor_name="noop", max_retries=0)
    def noop() -> None:
        pass

    broker.declare_queue(QUEUE)
    broker.set_capacity(jobs + claim)
    broker.emit_after("process_boot")
    broker.enqueue_many([noop.message() for _ in range(jobs)])
    consumer = broker.consume(QUEUE, prefetch=jobs + claim)  # every claimed row held until its ack
    figures: dict[str, float] = {}

    start = cpu()
    batches = []
    while True:
        n = consumer.capacity.reserve(claim)
        got = broker.claim(QUEUE, n)
        consumer.capacity.release(n - len(got))
        if not got:
            break
        batches.append(got)
    figures["claim"] = cpu() - start
    claimed = sum(len(b) for b in batches)
    assert claimed == jobs, f"claimed {claimed} of {jobs}"

    work = WorkQueue()
    start = cpu()
    for batch in batches:
        work.put_batch(batch, broker._actor_priority)  # noqa: SLF001  (what the claim thread passes)
    items = [work.get() for _ in range(jobs)]
    figures["queue"] = cpu() - start

    worker = WorkerThread(broker=broker, consumers={QUEUE: _Holder(consumer)},  # type: ignore[dict-item]
                          work_queue=work, worker_timeout=1000)
    acks = broker.background.acks or broker.background.start()[1]
    with acks._cond:  # noqa: SLF001  (the batcher waits: its writes are the next stage's)
        start = cpu()
        for item in items:
            worker.process_message(item.message)
        figures["run"] = cpu() - start
        pending = list(acks._pending)  # noqa: SLF001
        acks._pending.clear()  # noqa: SLF001
        acks._max_batch = ack_batch  # noqa: SLF001
    start = cpu()
    for i in range(0, len(pending), ack_batch):
        with acks._cond:  # noqa: SLF001
            acks._pending.extend(pending[i:i + ack_batch])  # noqa: SLF001
            acks._cond.notify_all()  # noqa: SLF001
        acks.flush()
    figures["finish"] = cpu() - start
    broker.close()
    return {k: v / jobs * 1e6 for k, v in figures.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--claim", type=int, default=16)
    p.add_argument("--ack-batch", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--database-url", default=os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    args = p.parse_args(argv)
    runs: list[dict[str, float]] = []
    with bench_database(args.database_url) as url:
        for i in range(args.repeat):
            with __import__("psycopg").connect(url, autocommit=True) as c:
                reset(c)
            figures = run(url, args.jobs, args.claim, args.ack_batch)
            runs.append(figures)
            parts = ", ".join(f"{k} {v:.1f}" for k, v in figures.items())
            print(f"run {i + 1}/{args.repeat}: {args.jobs:,} jobs, claims of {args.claim}, acks of {args.ack_batch}:"
                  f" CPU us/job {parts}; sum {sum(figures.values()):.1f} (load {os.getloadavg()[0]:.1f})", flush=True)
            time.sleep(0.2)
    print("medians, us of CPU per job: " + ", ".join(
        f"{k} {statistics.median(r[k] for r in runs):.1f}" for k in runs[0])
        + f"; sum {statistics.median(sum(r.values()) for r in runs):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
