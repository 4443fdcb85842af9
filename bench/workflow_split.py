"""bench_workflows.py --split: where the join's start latency goes (J1), stage by stage.

Marks taken in the bench's one process (time.time(), the actors' clock):

    end     the last parent's end (its actor)
    write   its ack batch's write began (the ack batcher took it: the wait for a batch in flight)
    commit  that write committed (the statement, its end triggers, the join's release)
    notify  the first wake-up of the join's queue after that commit (NOTIFY -> the listener)
    claim   the claim that returned the join
    start   the join's actor began

The hooks wrap the broker's own objects (its completer's write, its claims, the wake-ups'
delivery); nothing of the broker changes.
"""

from __future__ import annotations

if __name__ == "__main__":  # imported by bench_workflows.py as bench.workflow_split; nothing to run
    raise SystemExit(f"{__file__}: a module the scripts in bench/ import, not a script (bench/README.md lists them)")

import threading
import time
from typing import Any

from supervisor.broker.consuming import listener

STAGES = ("end -> write", "write -> commit", "commit -> notify", "notify -> claim", "claim -> start")


class Split:
    """The marks of one run; ``stages(last_end, join_id, join_start)`` after it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.writes: list[tuple[float, float, set[str]]] = []  # (began, committed, ids)
        self.notifies: list[float] = []
        self.claims: list[tuple[float, set[str]]] = []
        self.last_writes: list[tuple[int, float]] = []  # each run's releasing write: (acks, ms)
        self.all_writes: list[float] = []  # every ack write's ms, over the runs

    def reset(self) -> None:
        with self.lock:
            self.writes.clear()
            self.notifies.clear()
            self.claims.clear()

    def install(self, broker: Any, queue: str) -> None:
        write = broker.completer.write_acks
        claim = broker.claims.claim
        deliver = listener.Wakeups.deliver

        def timed_write(ids: list[str], *rest: Any) -> None:
            began = time.time()
            write(ids, *rest)
            with self.lock:
                self.writes.append((began, time.time(), set(ids)))

        def timed_claim(q: str, n: int, *, idle: bool = False) -> Any:
            got = claim(q, n, idle=idle)
            with self.lock:
                self.claims.append((time.time(), {m.message_id for m in got}))
            return got

        def timed_deliver(wakeups: Any, channel: str, payload: str) -> None:
            if channel == listener.CHANNEL and payload == queue:
                with self.lock:
                    self.notifies.append(time.time())
            deliver(wakeups, channel, payload)

        broker.completer.write_acks = timed_write  # looked up when the batcher starts
        broker.claims.claim = timed_claim
        listener.Wakeups.deliver = timed_deliver  # type: ignore[method-assign]

    def writes_summary(self) -> str:
        """The write that released the join against the others (what the release adds)."""
        sizes = ", ".join(f"{n} acks {ms:.1f} ms" for n, ms in self.last_writes)
        every = sorted(self.all_writes)
        return (f"the join's releasing ack write: {sizes}; every ack write: median {every[len(every) // 2]:.1f} ms,"
                f" p99 {every[int(len(every) * 0.99)]:.1f} ms")

    def stages(self, last_end: float, last_id: str, join_id: str, join_start: float) -> dict[str, float] | None:
        """The five stages in ms for the parent that ended last, None if a mark is missing."""
        with self.lock:
            write = next(((b, c) for b, c, ids in self.writes if last_id in ids), None)
            claimed = next((t for t, ids in self.claims if join_id in ids), None)
            if write is None or claimed is None:
                return None
            # the NOTIFY may reach the listener before the writer's thread notes its commit
            notify = next((t for t in self.notifies if t >= write[0]), claimed)
            last = next(len(ids) for _, _, ids in self.writes if last_id in ids)
            self.last_writes.append((last, (write[1] - write[0]) * 1000))
            self.all_writes.extend((c - b) * 1000 for b, c, _ in self.writes)
        marks = (last_end, write[0], write[1], min(max(notify, write[1]), claimed), claimed, join_start)
        return {name: (b - a) * 1000 for name, a, b in zip(STAGES, marks, marks[1:], strict=False)}
