"""One worker process: boot a worker (supervisor's executor, or dramatiq.Worker: the
role's ``executor``) on the PostgresBroker, keep its leases alive, and drain cleanly on
SIGTERM.

This is what ``supervisor worker`` runs and what the supervisor forks per role.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import threading
import time

import dramatiq
from psycopg_pool import ConnectionPool

from .. import apps, backoff, defaults, exit_codes, runtime
from ..broker import PostgresBroker
from ..broker.consuming import order
from ..broker.consuming.fencing import Fence, LeaseLost
from ..broker.consuming.pace import GiveBack, Pace
from ..db import Database
from ..registry import Registration
from . import executor, liveness, metrics
from .joblog import JobLog
from .scheduler import RunResults, Scheduler
from .settings import WorkerSettings
from .upkeep import Upkeep, UpkeepSettings

log = logging.getLogger(__name__)

# How often idle Dramatiq threads look up to notice a stop: bounds every drain
# (and so every roll step). Claims do not follow it; see PostgresConsumer.
WORKER_TIMEOUT_MS = 100
# The role's ``executor``: what runs its jobs (both are driven alike: start, stop, and
# GiveBack reads their work queue and consumers).
EXECUTORS: dict[str, type[dramatiq.Worker] | type[executor.Worker]] = {
    "own": executor.Worker, "dramatiq": dramatiq.Worker}


class ActorImportError(RuntimeError):
    pass


def import_actors(modules: tuple[str, ...]) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:
            raise ActorImportError(
                f"cannot import actor module {name!r}: {type(exc).__name__}: {exc}. "
                "Check the module path (it must be importable from the working directory or PYTHONPATH)."
            ) from exc


def start_apps(actor_modules: tuple[str, ...], pool: ConnectionPool) -> None:
    """Each app's on_worker_start hook (see supervisor.apps.App); a failing hook is logged."""
    for app in apps.in_use(actor_modules):
        if app.on_worker_start is not None:
            try:
                app.on_worker_start(pool)
            except Exception as exc:
                log.error("app %s: start hook failed: %s: %s", app.name, type(exc).__name__, exc)


class WorkerProcess:
    """Owns the broker, the worker (the role's executor) and the upkeep thread of one process."""

    def __init__(self, settings: WorkerSettings, database: Database, *, owner: str | None = None,
                 wakeup_fd: int | None = None) -> None:
        self.settings = settings
        self.database = database
        self.owner = owner
        self.wakeup_fd = wakeup_fd
        self.stopping = threading.Event()
        self.ready = threading.Event()
        self.broker: PostgresBroker | None = None
        self.worker: dramatiq.Worker | executor.Worker | None = None
        self.upkeep: Upkeep | None = None
        self.scheduler: Scheduler | None = None
        self.give_back: GiveBack | None = None
        self.state = "starting"
        # Why this process does not claim, set by the master's resource guard (its beat shows it).
        self.paused_reason: str | None = None

    def in_flight(self) -> int:
        return self.broker.leases.count() if self.broker else 0

    def start(self) -> None:
        s, r = self.settings, self.settings.role
        broker = PostgresBroker(
            self.database.url,
            lease_seconds=r.lease,
            poll_interval=r.poll_interval,
            max_retries=r.max_retries,
            # Dramatiq's options are in milliseconds.
            min_backoff=int(r.min_backoff * 1000),
            max_backoff=int(r.max_backoff * 1000),
            # The broker's own work shares a few connections; actor code gets its own pool.
            pool_size=defaults.WORKER_CONNECTIONS,
            actor_pool_size=r.threads,
            listen_url=self.database.listen_url,
            wakeup_fd=self.wakeup_fd,
            owner=self.owner,
            queue_priorities=s.queue_priorities,
        )
        if r.time_limit:
            for m in broker.middleware:
                if isinstance(m, dramatiq.middleware.TimeLimit):
                    m.time_limit = int(r.time_limit * 1000)
        # Ahead of the Fence, which stays last (broker/consuming/order.py, checked below).
        broker.add_middleware(RunResults(), before=Fence)
        if s.job_log:  # first, so it times the whole run (its placement: before Retries)
            broker.add_middleware(JobLog(r.name), before=type(broker.middleware[0]))
        if metrics.enabled():
            broker.add_middleware(metrics.JobMetrics(), before=Fence)
        self.broker = broker
        # Actor modules use @dramatiq.actor, which binds to the global broker at
        # import time: it must be ours before the first import.
        dramatiq.set_broker(broker)
        runtime.configure(app_settings=s.app_settings, worker_id=broker.owner)
        import_actors(r.actors)
        order.check(broker.middleware)  # after the actor modules, which may add middleware
        for queue in r.queues:
            broker.declare_queue(queue)
        broker.set_capacity(s.capacity)
        pace = Pace(broker.capacity, r.threads, s.capacity, follow=r.prefetch is None)
        broker.fence.on_finished = pace.finished
        if r.prefetch is None:
            broker.fence.on_running = pace.running
        broker.emit_after("process_boot")

        # Found dead by its beat when it has a session of its own to prove it alive (liveness.py).
        session = liveness.session_name(self.database, listens=self.wakeup_fd is None)
        broker.leases.beat_expiry = liveness.beat_expiry(r.heartbeat) if session else None
        registration = Registration(broker.pool, broker.owner, role=r.name, queues=list(r.queues),
                                    capacity=s.capacity, beat_seconds=r.heartbeat,
                                    session_name=session)
        self.upkeep = Upkeep(
            broker,
            registration,
            settings=UpkeepSettings(
                heartbeat_seconds=r.heartbeat,
                reap_seconds=max(r.lease / 2, 1.0),
                retention=s.retention,
            ),
            state=lambda: self.state,
            paused=lambda: self.paused_reason,
        )
        # The database may still be starting (a reboot): wait for it, unless told to stop.
        backoff.retry(registration.register, "registering with the database", cap=30.0, stop=self.stopping,
                      logger=log)
        start_apps(r.actors, broker.pool)
        self.upkeep.start()

        # async_limit is the own executor's (dramatiq.Worker runs coroutines its own way)
        options = {"async_limit": r.async_limit} if r.executor == "own" else {}
        worker = EXECUTORS[r.executor](broker, queues=set(r.queues), worker_threads=r.threads,
                                       worker_timeout=WORKER_TIMEOUT_MS, **options)
        # The broker's capacity caps the process as a whole. A queue's prefetch bound
        # also counts acks not yet committed; the slack keeps it from binding here.
        worker.queue_prefetch = s.capacity * 4
        worker.start()
        self.worker = worker
        if s.capacity > r.threads:  # rows may wait for a thread: never long (see broker/consuming/pace.py)
            self.give_back = GiveBack(worker.work_queue, worker.consumers, broker.fence, r.threads,
                                      on_give_back=pace.gave_back, patience=pace.patience)
            self.give_back.start()
            if isinstance(worker, executor.Worker):
                worker.wakes = pace.wakes  # GiveBack wakes the rest when the awake ones stall
        if s.schedules:
            self.scheduler = Scheduler(broker, s.schedules, holder=broker.owner)
            self.scheduler.start()
        self.state = "running"
        self.ready.set()
        log.info(
            "worker %s ready: role=%s queues=%s threads=%d executor=%s actors=%s",
            broker.owner, r.name, ",".join(r.queues), r.threads, r.executor, ",".join(r.actors),
        )

    def drain(self) -> None:
        """Stop claiming, finish running jobs (up to shutdown_timeout), requeue
        what was prefetched, release any lease still held, and close."""
        r = self.settings.role
        broker = self.broker
        assert broker is not None, "drain() before start()"
        self.state = "draining"
        started = time.monotonic()
        log.info("draining: finishing running jobs (up to %.0fs)", r.shutdown_timeout)
        broker.pause_claiming()
        if self.give_back is not None:
            self.give_back.stop()
        if self.scheduler is not None:
            self.scheduler.stop()
        if self.worker is not None:
            self.worker.stop(timeout=int(r.shutdown_timeout * 1000))
        broker.flush_acks(timeout=max(1.0, r.shutdown_timeout - (time.monotonic() - started)))
        # Jobs still running past the timeout are stopped in their threads before
        # their rows are given back: another process may claim them at once.
        broker.fence.stop_jobs(broker.leases.held(), LeaseLost)
        try:
            left = broker.leases.release_owner(broker.owner, why="worker stopped before the job finished")
            if left:
                log.warning("released %d jobs still running at the shutdown timeout", len(left))
        except Exception as exc:
            log.warning("could not release leases (%s); they expire in %.0fs", exc, r.lease)
        if self.upkeep is not None:
            self.upkeep.stop()
            try:
                self.upkeep.registration.stop()
            except Exception as exc:
                log.warning("could not mark worker row stopped: %s", exc)
        broker.close()
        self.state = "stopped"
        log.info("worker %s stopped in %.2fs", broker.owner, time.monotonic() - started)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def install_stop_signals(stop: threading.Event) -> None:
    """SIGTERM and SIGINT set ``stop``, from a thread of their own.

    A Python signal handler runs in the main thread between two bytecodes, which can be
    while that thread holds the Event's own lock inside ``Event.wait`` (the run loop
    waits on ``stop`` every tick); ``stop.set()`` there waits for that lock for ever. A
    child whose master had died hung so, never draining. So the handler does nothing:
    the interpreter's C-level handler writes the signal's number to a pipe
    (``set_wakeup_fd``), and a thread reading the pipe sets the Event. Main thread only."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)

    def relay() -> None:
        while data := os.read(read_fd, 64):
            if any(number in STOP_SIGNALS for number in data):
                stop.set()

    threading.Thread(target=relay, name="stop-signals", daemon=True).start()
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, frame: None)  # the relay acts; see above


class Hooks:
    """What a supervisor adds around a worker process (the standalone worker adds nothing).

    ``on_tick`` runs every ``tick_interval`` seconds on the main thread (the
    supervisor's child sends master beats, checks for orphaning and runs the
    resource guard there); ``on_stop`` runs just before the drain.
    """

    tick_interval: float = 1.0

    def on_ready(self, proc: WorkerProcess) -> None:
        """The process is claiming."""

    def on_tick(self, proc: WorkerProcess) -> None:
        """Called every ``tick_interval`` seconds until told to stop."""

    def on_stop(self, proc: WorkerProcess) -> None:
        """Told to stop; the drain follows."""


def run(settings: WorkerSettings, database: Database, *, owner: str | None = None, hooks: Hooks | None = None,
        wakeup_fd: int | None = None) -> int:
    """Run a worker until SIGTERM/SIGINT, then drain. Returns the exit code.

    ``owner`` is the lease owner id, chosen by the supervisor so it can release
    this process's leases if it dies; ``wakeup_fd`` the pipe on which it relays
    its host's NOTIFY wake-ups (else the process LISTENs on its own).
    """
    hooks = hooks or Hooks()
    proc = WorkerProcess(settings, database, owner=owner, wakeup_fd=wakeup_fd)
    install_stop_signals(proc.stopping)
    try:
        proc.start()
    except (ActorImportError, order.MiddlewareOrderError) as exc:
        log.error("%s", exc)
        return exit_codes.BAD_ACTORS
    except Exception:
        if proc.stopping.is_set():  # told to stop while still starting (the database was away)
            log.info("stopped before it was ready")
            return exit_codes.OK
        raise
    hooks.on_ready(proc)
    while not proc.stopping.wait(hooks.tick_interval):
        hooks.on_tick(proc)
    hooks.on_stop(proc)
    proc.drain()
    return exit_codes.OK
