"""`python -m bench.soak_trace worker ...`: the worker CLI, plus a tracer that logs what
could stall a claim, each with its wall-clock span (bench/soak.py reads the lines back):

- the upkeep's tasks: beat, reap, prune, and the vacuum or analyze (`maintain`);
- ack batches that took 50 ms or more (`acks N`);
- Python's garbage collections over 5 ms;
- the process's own stalls: a thread that sleeps 5 ms and wakes 20 ms late or more (the
  GIL held by another thread, or no CPU for the process);
- pace changes (the process's capacity limit), rows given back for want of a thread;
- the broker pool's waits, once a second when any request had to queue;
- with BENCH_CLAIM_TRACE=1, every claim (`claim N US KIND ASKED [sweep]`: the rows it took, its
  microseconds, plain, probe or keyed (broker/consuming/gates.py), the rows it asked for, and whether it
  read every level from its start: broker/consuming/floors.py), timed around
  `PostgresBroker.claim` as the worker calls it: bench/pressure.py's claim latency.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time

TRACE = "soak-trace"


def main() -> None:
    # Imported here: bench/soak.py imports this module for TRACE alone.
    from psycopg_pool import ConnectionPool

    from supervisor.broker.consuming.capacity import Capacity
    from supervisor.broker.consuming.consumer import PostgresConsumer
    from supervisor.broker.consuming.leases import Leases
    from supervisor.cli.main import main as cli
    from supervisor.worker import upkeep

    log = logging.getLogger("soak")

    def event(start: float, what: str) -> None:
        log.info("%s %.3f %.3f %s", TRACE, start, time.time(), what)

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            start = time.time()
            try:
                return fn(*args, **kwargs)
            finally:
                event(start, name)
        return wrapper

    for name in ("beat", "prune", "_maintain"):
        setattr(upkeep.Upkeep, name, timed(name.strip("_"), getattr(upkeep.Upkeep, name)))
    Leases.reap_expired = timed("reap", Leases.reap_expired)  # type: ignore[method-assign]
    from supervisor.broker.consuming.completer import Completer

    write_acks = Completer.write_acks

    def slow_acks(self, ids, *args, **kwargs):  # an ack batch that took 50 ms or more
        start = time.time()
        try:
            return write_acks(self, ids, *args, **kwargs)
        finally:
            if time.time() - start >= 0.05:
                event(start, f"acks {len(ids)}")
    Completer.write_acks = slow_acks  # type: ignore[method-assign]
    if os.environ.get("BENCH_CLAIM_TRACE") == "1":
        from supervisor.broker.consuming.claims import Claims
        from supervisor.broker.consuming.gates import Gates

        claim, statement = Claims.claim, Gates.statement
        kind = threading.local()

        def traced_statement(self, queue):
            keyed, probe = statement(self, queue)
            kind.value = "keyed" if keyed else "probe" if probe else "plain"
            return keyed, probe

        def traced_claim(self, queue, n, **kwargs):
            start, began = time.time(), time.perf_counter()
            sweep = self.floors.params(queue)[1]  # reads the floors, changes nothing
            got = claim(self, queue, n, **kwargs)
            event(start, f"claim {len(got)} {(time.perf_counter() - began) * 1e6:.0f} {getattr(kind, 'value', '?')} {n}"
                         f"{' sweep' if sweep else ''}")
            return got
        Claims.claim = traced_claim  # type: ignore[method-assign]
        Gates.statement = traced_statement  # type: ignore[method-assign]
    give_back = PostgresConsumer.give_back

    def traced_give_back(self, messages, waited):
        event(time.time() - waited, f"gave back {len(messages)}")
        return give_back(self, messages, waited)
    PostgresConsumer.give_back = traced_give_back  # type: ignore[method-assign]

    gc_start = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_start[0] = time.time()
        elif time.time() - gc_start[0] > 0.005:
            event(gc_start[0], f"gc gen{info['generation']} collected {info['collected']}")
    gc.callbacks.append(on_gc)

    set_limit = Capacity.set_limit

    def traced_limit(self, limit: int) -> None:
        if limit != self.limit and self.within is None and self.limit < 1 << 29:
            event(time.time(), f"pace limit {self.limit} -> {limit}")
        set_limit(self, limit)
    Capacity.set_limit = traced_limit  # type: ignore[method-assign]

    pools: list[ConnectionPool] = []
    pool_init = ConnectionPool.__init__

    def tracked(self, *args, **kwargs) -> None:
        pool_init(self, *args, **kwargs)
        if kwargs.get("name") == "broker":
            pools.append(self)
    ConnectionPool.__init__ = tracked  # type: ignore[method-assign]

    def watch() -> None:
        next_stats = time.monotonic() + 1
        while True:
            before = time.monotonic()
            time.sleep(0.005)
            late = time.monotonic() - before - 0.005
            if late > 0.02:
                event(time.time() - late, f"stall {late * 1000:.0f} ms")
            if time.monotonic() >= next_stats:
                next_stats += 1
                for pool in pools:
                    st = pool.pop_stats()
                    if st.get("requests_queued"):
                        event(time.time(), f"pool {st.get('requests_num', 0)} requests, {st['requests_queued']}"
                              f" waited {st.get('requests_wait_ms', 0)} ms in all")
    threading.Thread(target=watch, name="soak-watch", daemon=True).start()
    cli()


if __name__ == "__main__":
    main()
