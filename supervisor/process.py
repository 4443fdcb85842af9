"""One worker process: boot a Dramatiq Worker on the PostgresBroker, keep its
leases alive, and drain cleanly on SIGTERM.

This is what ``supervisor worker`` runs and what the supervisor forks per role.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import dramatiq
from dramatiq import Worker

from . import runtime
from .broker import PostgresBroker
from .upkeep import Upkeep, UpkeepSettings

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_BAD_ACTORS = 3
# How often idle Dramatiq threads look up to notice a stop: bounds every drain
# (and so every roll step). Claims do not follow it; see PostgresConsumer.
WORKER_TIMEOUT_MS = 100


@dataclass(frozen=True)
class WorkerSettings:
    """Everything a worker process needs; built once from the CLI or the config."""

    queues: tuple[str, ...]
    actors: tuple[str, ...]
    role: str = "worker"
    threads: int = 8
    # Rows a process may hold claimed (running or waiting for a thread). The
    # default, `threads`, never hoards; 2 x threads lets the next claim overlap
    # the current batch, which pays off for many short jobs.
    prefetch: int | None = None
    lease_seconds: float = 30.0
    heartbeat_seconds: float = 10.0
    shutdown_timeout: float = 30.0
    poll_interval: float = 1.0
    max_retries: int = 20
    min_backoff_ms: int = 15_000
    max_backoff_ms: int = 24 * 3600 * 1000
    retention_seconds: float = 7 * 24 * 3600.0
    time_limit_ms: int | None = None
    # Cron schedules this process helps fire (scheduler_locks make each fire once).
    schedules: tuple = ()
    # The config's `pipeline:` section, read by the bundled actors via supervisor.runtime.
    pipeline: dict = field(default_factory=dict, compare=False, hash=False)


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


class WorkerProcess:
    """Owns the broker, the Dramatiq Worker and the upkeep thread of one process."""

    def __init__(self, settings: WorkerSettings, url: str, *, owner: str | None = None) -> None:
        self.settings = settings
        self.url = url
        self.owner = owner
        self.stopping = threading.Event()
        self.ready = threading.Event()
        self.broker: PostgresBroker | None = None
        self.worker: Worker | None = None
        self.upkeep: Upkeep | None = None
        self.scheduler = None  # supervisor.scheduler.Scheduler when the config has schedules
        self.state = "starting"

    def in_flight(self) -> int:
        return self.broker.held_count() if self.broker else 0

    def start(self) -> None:
        s = self.settings
        broker = PostgresBroker(
            self.url,
            lease_seconds=s.lease_seconds,
            poll_interval=s.poll_interval,
            max_retries=s.max_retries,
            min_backoff=s.min_backoff_ms,
            max_backoff=s.max_backoff_ms,
            pool_size=s.threads + 4,
            owner=self.owner,
        )
        if s.time_limit_ms:
            for m in broker.middleware:
                if isinstance(m, dramatiq.middleware.TimeLimit):
                    m.time_limit = s.time_limit_ms
        self.broker = broker
        # Actor modules use @dramatiq.actor, which binds to the global broker at
        # import time: it must be ours before the first import.
        dramatiq.set_broker(broker)
        runtime.configure(pipeline=s.pipeline, worker_id=broker.owner)
        import_actors(s.actors)
        for queue in s.queues:
            broker.declare_queue(queue)
        broker.set_capacity(s.prefetch or s.threads)
        broker.emit_after("process_boot")

        self.upkeep = Upkeep(
            broker,
            role=s.role,
            queues=list(s.queues),
            settings=UpkeepSettings(
                heartbeat_seconds=s.heartbeat_seconds,
                reap_seconds=max(s.lease_seconds / 2, 1.0),
                retention_seconds=s.retention_seconds,
            ),
            state=lambda: self.state,
            in_flight=self.in_flight,
        )
        self._register()
        self.upkeep.start()

        worker = Worker(broker, queues=set(s.queues), worker_threads=s.threads,
                        worker_timeout=WORKER_TIMEOUT_MS)
        # Per-queue claim batch; the broker's capacity caps the process as a whole.
        worker.queue_prefetch = s.prefetch or s.threads
        worker.start()
        self.worker = worker
        if s.schedules:
            from .scheduler import Scheduler

            self.scheduler = Scheduler(broker, s.schedules, holder=broker.owner)
            self.scheduler.start()
        self.state = "running"
        self.ready.set()
        log.info(
            "worker %s ready: role=%s queues=%s threads=%d actors=%s",
            broker.owner, s.role, ",".join(s.queues), s.threads, ",".join(s.actors),
        )

    def _register(self) -> None:
        delay = 0.5
        while True:
            try:
                self.upkeep.register()
                return
            except Exception as exc:
                if self.stopping.is_set():
                    raise
                log.warning("database unreachable at start (%s); retrying in %.1fs", exc, delay)
                self.stopping.wait(delay)
                delay = min(delay * 2, 30)

    def drain(self) -> None:
        """Stop claiming, finish running jobs (up to shutdown_timeout), requeue
        what was prefetched, release any lease still held, and close."""
        s = self.settings
        broker = self.broker
        self.state = "draining"
        started = time.monotonic()
        log.info("draining: finishing running jobs (up to %.0fs)", s.shutdown_timeout)
        broker.pause_claiming()
        if self.scheduler is not None:
            self.scheduler.stop()
        if self.worker is not None:
            self.worker.stop(timeout=int(s.shutdown_timeout * 1000))
        broker.flush_acks(timeout=max(1.0, s.shutdown_timeout - (time.monotonic() - started)))
        try:
            left = broker.release_owner(broker.owner, why="worker stopped before the job finished")
            if left:
                log.warning("released %d jobs still running at the shutdown timeout", len(left))
        except Exception as exc:
            log.warning("could not release leases (%s); they expire in %.0fs", exc, s.lease_seconds)
        if self.upkeep is not None:
            self.upkeep.stop()
            self.upkeep.mark_stopped()
        broker.close()
        self.state = "stopped"
        log.info("worker %s stopped in %.2fs", broker.owner, time.monotonic() - started)


def install_stop_signals(stop: threading.Event) -> None:
    def handler(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def run(settings: WorkerSettings, url: str, *, owner: str | None = None,
        on_ready: Callable[[WorkerProcess], None] | None = None,
        watch: Callable[[WorkerProcess], None] | None = None, watch_interval: float = 1.0,
        on_stop: Callable[[WorkerProcess], None] | None = None) -> int:
    """Run a worker until SIGTERM/SIGINT, then drain. Returns the exit code.

    ``watch`` is called every ``watch_interval`` seconds from the main thread (the
    supervisor uses it for master beats, orphan checks and the resource guard);
    ``on_stop`` just before the drain. ``owner`` is the lease owner id, chosen by
    the supervisor so it can release this process's leases if it dies.
    """
    proc = WorkerProcess(settings, url, owner=owner)
    install_stop_signals(proc.stopping)
    try:
        proc.start()
    except ActorImportError as exc:
        log.error("%s", exc)
        return EXIT_BAD_ACTORS
    except Exception:
        if proc.stopping.is_set():  # told to stop while still starting (the database was away)
            log.info("stopped before it was ready")
            return EXIT_OK
        raise
    if on_ready:
        on_ready(proc)
    while not proc.stopping.wait(watch_interval):
        if watch:
            watch(proc)
    if on_stop:
        on_stop(proc)
    proc.drain()
    return EXIT_OK


def configure_logging(level: str = "INFO", json_logs: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if json_logs:
        from .logs import JsonFormatter

        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s %(levelname)s [{os.getpid()}] %(name)s: %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("psycopg.pool").setLevel(logging.WARNING)
