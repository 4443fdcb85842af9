"""Self-fencing: stop running a job this process may no longer run.

A job's lease is valid until ``renewed + lease``; the reaper of another process
takes it back only a margin after that. A process that cannot renew in time
(the database is unreachable, the heartbeat is stuck, the process was frozen)
interrupts the job before its lease can expire, in the job's own thread, the way
Dramatiq's TimeLimit does, and never writes an outcome for it: so two processes
never run one job at the same moment. The same interrupt ends a job that an
operator cancelled while it ran (``supervisor jobs cancel``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import Middleware
from dramatiq.middleware.threading import Interrupt, raise_thread_exception

from ... import testsignals
from .. import threads
from ..message import PgMessageProxy
from .leases import Hold, Leases
from .order import Last, Placement

log = logging.getLogger(__name__)


class LeaseLost(Interrupt):
    """This process could not renew the job's lease in time (or it was reclaimed):
    another process may run the job now. The job is delivered again, elsewhere."""


class JobCancelled(Interrupt):
    """An operator cancelled the job while it ran."""


_REASONS: dict[type[Interrupt], str] = {LeaseLost: "lease lost", JobCancelled: "cancelled"}


class Fence(Middleware):
    """Maps running jobs to their threads and interrupts the ones to stop.

    Last in the middleware list (``placement``, checked at worker start). A job stopped
    before it started (prefetched) is stopped in ``before_process_message`` instead, and
    never runs.
    """

    placement: ClassVar[Placement] = Last(
        "its after_process_message runs first: once the actor has returned, no interrupt can land "
        "in another middleware's after hooks, where the outcome is written")

    def __init__(self, leases: Leases, *, interval: float = 0.05) -> None:
        self.leases = leases
        self.interval = interval
        # What each running job's thread is, and since when (a job's run time feeds Pace).
        self._running: dict[Hold, tuple[int, PgMessageProxy, float]] = {}
        self.on_finished: Callable[[float, str], None] | None = None  # (run time, actor name)
        # Every check: how long the longest-running job has run so far (Pace reads it).
        self.on_running: Callable[[float], None] | None = None
        # When a job last ended (pace.GiveBack: rows wait while no thread frees).
        self.finished_at = 0.0
        self._doomed: dict[Hold, type[Interrupt]] = {}
        self._on_loop = 0  # of _running: coroutines on the event loop (thread id 0)
        self._lock = threading.Lock()
        self._watchdog: threading.Thread | None = None
        leases.on_lost = lambda holds: self.stop_jobs(holds, LeaseLost)

    # --- Dramatiq hooks (worker threads) -------------------------------------

    def after_process_boot(self, broker: Broker) -> None:
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch, name="lease-fence", daemon=True)
            self._watchdog.start()

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        if not isinstance(message, PgMessageProxy):
            return
        key = (message.message_id, message.attempts)
        with self._lock:
            doomed = self._doomed.pop(key, None)
            if doomed is None:
                message.started = started = time.monotonic()  # the attempt runs from here (last hook)
                # A coroutine on the event loop has no thread of its own (0): it is stopped
                # through message.interrupt, and holds no thread (running_count, Pace).
                on_loop = message.interrupt is not None
                self._running[key] = (0 if on_loop else threading.get_ident(), message, started)
                self._on_loop += on_loop
                return
        message.fenced = _REASONS[doomed]
        raise doomed()

    def after_process_message(self, broker: Broker, message: MessageProxy, *, result: Any = None,
                              exception: BaseException | None = None) -> None:
        if isinstance(message, PgMessageProxy):
            message.ended = ended = time.monotonic()  # first of the after hooks: the actor just returned
            with self._lock:
                entry = self._running.pop((message.message_id, message.attempts), None)
                on_loop = entry is not None and entry[0] == 0
                self._on_loop -= on_loop
            if on_loop:
                return  # a coroutine's end frees no thread, and its length says nothing of the threads'
            self.finished_at = ended
            if entry is not None and self.on_finished is not None:
                self.on_finished(ended - entry[2], message.actor_name)

    def running_count(self) -> int:
        """Jobs running in a thread now (not coroutines on the event loop)."""
        return len(self._running) - self._on_loop

    after_skip_message = after_process_message

    # --- who stops what ---------------------------------------------------------

    def cancel(self, job_id: str) -> None:
        """A NOTIFY said this job was cancelled; stop it if this process holds it."""
        self.stop_jobs(self.leases.holds_job(job_id), JobCancelled)

    def stop_jobs(self, holds: list[Hold], exc: type[Interrupt]) -> None:
        for key in holds:
            with self._lock:
                if not self.leases.holds(key):
                    continue  # finished meanwhile: its outcome is written (or being written)
                entry = self._running.pop(key, None)
                if entry is None:
                    self._doomed[key] = exc  # claimed, not started: it will not start
                    log.warning("will not start job %s (attempt %d): %s", key[0], key[1], _REASONS[exc])
                    continue
                thread_id, message, _ = entry
                message.fenced = _REASONS[exc]
                if not thread_id:
                    # A coroutine: cancelled on its loop (counted there until its after hook);
                    # one that has just ended has no interrupt, and writes nothing (fenced).
                    self._running[key] = entry
                    if message.interrupt is not None:
                        message.interrupt(exc)
                else:
                    raise_thread_exception(thread_id, exc)
            log.warning("interrupted job %s (attempt %d): %s", key[0], key[1], _REASONS[exc])
            testsignals.emit(testsignals.Interrupted(key[0], key[1], _REASONS[exc]))

    def _watch(self) -> None:
        # No database here: whatever fails is a bug, and a process whose fence is dead
        # could run a job past its lease, so it ends (threads.py).
        with threads.lifetime("lease-fence", lambda: False):
            self._check_forever()

    def _check_forever(self) -> None:
        while True:
            time.sleep(self.interval)
            overdue = self.leases.overdue(time.monotonic())
            if overdue:
                log.warning("could not renew the lease of %d job(s) in time: stopping them", len(overdue))
                self.stop_jobs(overdue, LeaseLost)
            on_running = self.on_running
            with self._lock:
                for key in [k for k in self._doomed if not self.leases.holds(k)]:
                    del self._doomed[key]
                started = [entry[2] for entry in self._running.values() if entry[0]] if on_running else []
            if on_running is not None and started:
                on_running(time.monotonic() - min(started))
