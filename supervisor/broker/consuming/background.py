"""The broker's threads, each started on first need (a consumer, an ack): the wake-ups
(a LISTEN connection of its own, the master's relay pipe, or none: consumers poll), the
ack batcher, the due timer, the straggler probe, and the lease keeper of a dramatiq CLI
broker; the claims and outcomes read the ones they signal (listener, timer, acks)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from psycopg_pool import ConnectionPool

from ... import defaults
from ...registry import Registration
from .completer import AckBatcher, Completer
from .floors import REQUEUED, ClaimFloors, StragglerProbe, SweepSignal
from .gates import Gates
from .keeper import LeaseKeeper
from .listener import CANCEL_CHANNEL, Listener, PipeWakeups, Wakeups
from .timer import DueTimer


class Background:
    """Owns the broker's threads: None until started (``start``, ``serve``), stopped by
    the broker's close (``stop_acks`` first, ``stop`` last)."""

    def __init__(self, pool: ConnectionPool, owner: str, *, floors: ClaimFloors, gates: Gates,
                 completer: Completer, on_cancel: Callable[[str], None], listen_url: str, wakeup_fd: int | None,
                 keeper: LeaseKeeper | None, lock: threading.Lock) -> None:
        self.pool = pool
        self.owner = owner
        self.floors = floors
        self.gates = gates
        self.listen_url = listen_url
        self.wakeup_fd = wakeup_fd
        self.keeper = keeper
        self.listener: Wakeups | None = None
        self.acks: AckBatcher | None = None
        self.timer: DueTimer | None = None
        self.stragglers: StragglerProbe | None = None
        self.completer = completer  # the ack batcher's writes
        self._on_cancel = on_cancel
        self._lock = lock  # the broker's start lock

    def _wakeups(self) -> Wakeups:
        handlers = {CANCEL_CHANNEL: self._on_cancel}
        if self.wakeup_fd is not None:
            return PipeWakeups(self.wakeup_fd, on_notify=handlers)
        if self.listen_url:
            return Listener(self.listen_url, on_notify=handlers)
        return Wakeups("no-wakeups", on_notify=handlers)  # consumers poll

    def start(self) -> tuple[Wakeups, AckBatcher]:
        """The wake-ups, the ack batcher, the due timer and the straggler probe, started
        once (whoever asks first: a consumer, or an ack of a claim made without one)."""
        with self._lock:
            if self.listener is None:
                self.listener = self._wakeups()
                self.listener.start()
            if self.acks is None:
                # its write looked up now, as the batcher starts (a test's fault injection patches the class)
                self.acks = AckBatcher(self.completer.write_acks)
                self.acks.start()
            if self.timer is None:
                self.timer = DueTimer(self.pool)
                self.listener.on_gate = self.gate_opens  # a peer's '~queue seconds'
                self.listener.on_waiting = self.gates.waiting  # '+queue'
                self.timer.on_fire = self.gates.wake
                self.timer.start()
            if self.stragglers is None:
                self.stragglers = StragglerProbe(self.pool, self.floors)
                self.stragglers.start()
            return self.listener, self.acks

    def serve(self, queue_name: str, prefetch: int, queues: dict[str, None], done: Callable[[], int]
              ) -> threading.Event:
        """A queue consumer's wake-up event (NOTIFY or the due timer); the keeper, if any,
        registered and started with the first (``done``: the jobs this process finished)."""
        listener, _ = self.start()
        with self._lock:
            if self.keeper is not None and self.keeper.ident is None:
                # Each queue holds up to its own prefetch (Dramatiq's consumers are per queue).
                self.keeper.register_as(
                    Registration(self.pool, self.owner, role=defaults.DRAMATIQ_ROLE, queues=sorted(queues),
                                 capacity=prefetch * len(queues), beat_seconds=self.keeper.beat_seconds),
                    done=done)
                self.keeper.start()
        assert self.timer is not None
        wakeup = self.timer.serve(queue_name, listener)
        sweep = SweepSignal(self.floors, queue_name, wakeup)
        listener.watch(REQUEUED + queue_name, sweep)
        assert self.stragglers is not None
        self.stragglers.watch(queue_name, sweep)
        return wakeup

    def gate_opens(self, queue: str, seconds: float) -> None:
        """A peer's '~queue seconds': a limit key of the queue opens then (it has waiting rows)."""
        self.gates.gated(queue)
        if self.timer is not None:
            self.timer.due_in(queue, seconds)

    def flush_acks(self, timeout: float | None = None) -> bool:
        return self.acks.flush(timeout) if self.acks else True

    def stop_acks(self) -> None:
        if self.acks is not None:
            self.acks.stop(timeout=10)

    def stop(self) -> None:
        """Every thread but the ack batcher (stop_acks, before the last progress reports)."""
        if self.listener is not None:
            self.listener.stop()
        for thread in (self.timer, self.stragglers, self.keeper):
            if thread is not None:
                thread.stop()
