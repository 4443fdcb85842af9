"""Calibration: what Dramatiq's own ``Worker`` costs per no-op job on this machine, with
no database at all (Dramatiq's in-memory ``StubBroker``), as CPU per job of the process.

    python bench/stub_worker.py [--jobs 20000] [--threads 8] [--repeat 3]

Issue 24's target for our worker's CPU per job (``profile_worker.py``) was set at 100 us on
a machine where this figure was 159 us (bench/README.md, 2026-11-24, second session):
machines of this kind differ 2x and more, so this script gives the run's yardstick, and
``--target`` prints the target scaled to it (100 / 159 of this figure).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import dramatiq
from dramatiq.brokers.stub import StubBroker

# Issue 24's target and the figure this script gave on the machine it was set on.
TARGET_US, YARDSTICK_US = 100.0, 159.0


def cpu() -> float:
    t = os.times()
    return t.user + t.system


def run(jobs: int, threads: int) -> tuple[float, float]:
    """(jobs/s, CPU us per job) of one drain of ``jobs`` no-op messages."""
    broker = StubBroker()
    broker.emit_after("process_boot")
    dramatiq.set_broker(broker)

    @dramatiq.actor(broker=broker, max_retries=0)
    def noop() -> None:
        pass

    for _ in range(jobs):
        noop.send()
    worker = dramatiq.Worker(broker, worker_threads=threads, worker_timeout=100)
    before, started = cpu(), time.monotonic()
    worker.start()
    broker.join(noop.queue_name)
    worker.join()
    seconds, used = time.monotonic() - started, cpu() - before
    worker.stop()
    broker.close()
    return jobs / seconds, used / jobs * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    figures = []
    for i in range(args.repeat):
        rate, us = run(args.jobs, args.threads)
        figures.append(us)
        print(f"run {i + 1}/{args.repeat}: {args.jobs:,} no-op jobs on dramatiq.Worker x {args.threads} threads"
              f" (StubBroker): {rate:,.0f} jobs/s, {us:.1f} us CPU per job; load avg {os.getloadavg()[0]:.1f}",
              flush=True)
    median = statistics.median(figures)
    print(f"dramatiq.Worker on StubBroker: {median:.1f} us CPU per job (median of {args.repeat});"
          f" issue 24's {TARGET_US:.0f} us target scaled to this machine: {TARGET_US * median / YARDSTICK_US:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
