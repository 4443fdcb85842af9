"""The group commit of successes: AckBatcher collects a process's acks and writes them in
batches on a thread of its own (the write is Completer.write_acks: sql.FINISH, and
LOG_FINISH for the log's rows), so under load commits fall far below jobs."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ... import backoff
from .. import threads

log = logging.getLogger(__name__)

# Called once the acks it came with are committed, with how many of them (a batch's acks
# that share a callback share one call).
Done = Callable[[int], None] | None
# ids, attempts, and when each attempt started and ended running (time.monotonic(), or None)
Write = Callable[[list[str], list[int], list[float | None], list[float | None]], None]



class AckBatcher(threading.Thread):
    """Collects (job id, attempt) pairs and writes them in batches; each pair's
    ``done`` callback runs once its ack is committed (a consumer frees its slot then).
    The attempt's start and end (monotonic clock) ride along: the ack writes them, so
    recording when a job ran costs no statement of its own.

    While one batch is in flight the next accumulates, so under load the
    number of commits falls far below the number of jobs, and when idle an
    ack is written at once. A failed write keeps the batch and retries with
    backoff: the rows stay 'running' under this process's lease meanwhile. Any other
    error ends the process (see threads.py): acks it cannot write, it must not claim.
    """

    def __init__(self, write: Write, *, max_batch: int = 2000) -> None:
        super().__init__(name="ack-batcher", daemon=True)
        self._write = write
        self._max_batch = max_batch
        self._pending: list[tuple[str, int, Done, float | None, float | None]] = []
        self._lock = threading.RLock()  # the condition's, taken bare by add (a job's path)
        self._cond = threading.Condition(self._lock)
        self._busy = False
        self._halt = False

    def add(self, job_id: str, attempt: int, done: Done = None,
            started: float | None = None, ended: float | None = None) -> None:
        with self._lock:
            self._pending.append((job_id, attempt, done, started, ended))
            if len(self._pending) == 1:  # the batcher waits for the first; later ones join its batch
                self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every ack added so far is committed."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._busy, timeout)

    def stop(self, timeout: float | None = None) -> bool:
        flushed = self.flush(timeout)
        with self._cond:
            self._halt = True
            self._cond.notify_all()
        return flushed

    def run(self) -> None:
        with threads.lifetime(self.name, lambda: self._halt):
            self._run()

    def _run(self) -> None:
        waits = backoff.delays(first=0.1, cap=10.0)
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._halt)
                if self._halt and not self._pending:
                    return
                batch = self._pending[: self._max_batch]
                del self._pending[: self._max_batch]
                self._busy = True
            try:
                self._write([a[0] for a in batch], [a[1] for a in batch], [a[3] for a in batch],
                            [a[4] for a in batch])
            except threads.EXPECTED as exc:
                delay = next(waits)
                threads.warn(log, f"writing {len(batch)} acks", exc, f"retrying in {delay:.1f}s")
                with self._cond:
                    self._pending[:0] = batch
                    self._busy = False
                    self._cond.notify_all()
                    self._cond.wait(delay)
                continue
            waits = backoff.delays(first=0.1, cap=10.0)
            # Each callback once with how many of its acks committed (a consumer's
            # capacity: one release for the batch, not one per job).
            committed: dict[Callable[[int], None], int] = {}
            for _, _, done, _, _ in batch:
                if done is not None:
                    committed[done] = committed.get(done, 0) + 1
            for done, n in committed.items():
                done(n)
            with self._cond:
                self._busy = False
                self._cond.notify_all()
