"""PostgresBroker: Dramatiq messages stored as job rows. Its parts are mixed in: the producer
side (producer.py), the claim (claims.py), outcomes (outcomes.py), flush and join
(joining.py), and signals (signals.py); here its pools, threads, consume() and close()."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

import dramatiq
import psycopg
from dramatiq.broker import Broker
from dramatiq.errors import BrokerConnectionError, QueueNotFound
from dramatiq.middleware import (
    AgeLimit,
    Callbacks,
    CurrentMessage,
    Middleware,
    Pipelines,
    ShutdownNotifications,
    TimeLimit,
)
from dramatiq.results import Results
from psycopg_pool import ConnectionPool, PoolTimeout

from .. import db, defaults
from ..identity import owner_id
from ..registry import Registration
from . import bulk, logstore, tracing
from .batcher import AckBatcher
from .capacity import Capacity
from .claims import Claims
from .consumer import PostgresConsumer
from .fanin import GroupSteps
from .fencing import Fence
from .floors import REQUEUED, ClaimFloors, StragglerProbe, SweepSignal
from .gates import Gates
from .groups import GroupCallbacks
from .joining import Failures, QueueHelpers
from .keeper import LeaseKeeper
from .leases import Leases
from .limiter import PostgresBackend as LimiterBackend
from .listener import CANCEL_CHANNEL, Listener, PipeWakeups, Wakeups
from .message import PgMessageProxy
from .middleware import JobOptions, Retries
from .outcomes import Outcomes
from .producer import Producer, _transaction
from .progress import ProgressBuffer
from .results import PostgresBackend
from .signals import Signals
from .timer import DueTimer

log = logging.getLogger(__name__)


# Signals makes ``middleware`` a property (a list that notices edits); Broker types it as a list.
class PostgresBroker(QueueHelpers, Producer, Claims, Outcomes, Signals, Broker):  # type: ignore[misc]
    """A Dramatiq broker whose queues are rows of the ``jobs`` table.

    Parameters:
      url: database URL; None means DATABASE_URL, else the embedded server.
      lease_seconds: how long a claim stays valid without a heartbeat.
      poll_interval: longest idle wait between claims when no NOTIFY arrives.
      max_retries / min_backoff / max_backoff: defaults for the Retries middleware
        (milliseconds, like Dramatiq's).
      pool_size: connections this process may open for the broker's own work (claims,
        acks, retries, heartbeats, sends); a supervisor worker uses 2.
      actor_pool_size: connections of ``actor_pool``, for actor code's own queries,
        opened only when an actor asks for one.
      listen_url: where to LISTEN for wake-ups (default: url; "" for none: a
        pooled URL without a direct one, consumers poll).
      wakeup_fd: a pipe on which the supervisor relays its host's wake-ups
        (then this process holds no LISTEN connection).
      fail_fast_default: ``join``'s default for ``fail_fast`` (see joining.Failures).
      keep_leases: a consuming broker renews and reaps leases itself (LeaseKeeper:
        the dramatiq CLI); a supervisor worker process does it in its upkeep thread.
      queue_priorities: queue -> the priority of a message sent there without one
        (the config's roles' ``priority``).
      storage: "log" or "table" (default: SUPERVISOR_STORAGE, else "log"): where the
        jobs it sends go, and whether its consumers claim the job log too (logstore.py).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        middleware: list[Middleware] | None = None,
        lease_seconds: float = defaults.LEASE_SECONDS,
        poll_interval: float = defaults.POLL_INTERVAL,
        max_retries: int = defaults.MAX_RETRIES,
        min_backoff: int = defaults.MIN_BACKOFF_MS,
        max_backoff: int = defaults.MAX_BACKOFF_MS,
        pool_size: int = 8,
        actor_pool_size: int = 8,
        listen_url: str | None = None,
        wakeup_fd: int | None = None,
        owner: str | None = None,
        fail_fast_default: bool = False,
        keep_leases: bool = False,
        queue_priorities: dict[str, int] | None = None,
        storage: str | None = None,
    ) -> None:
        self.storage = logstore.storage(storage)
        self.url = db.resolve_url(url)
        # A failed connection attempt tells the leases at once (see Leases.beat_expiry).
        self.pool: ConnectionPool = db.make_pool(self.url, max_size=pool_size, name="broker",
                                                 reconnect_failed=self._connection_failed)
        self.listen_url = self.url if listen_url is None else listen_url
        self.wakeup_fd = wakeup_fd
        self._actor_pool_size = actor_pool_size
        self._actor_pool: ConnectionPool | None = None
        # Dramatiq's rate-limiter backend on this database, for group completion callbacks
        # and the fan-in of groups in supervisor.pipeline (limiter.py, groups.py, fanin.py).
        self.limiter = LimiterBackend(url=self.url, pool=self.pool, listen_url=self.listen_url)
        if middleware is None:
            middleware = [
                AgeLimit(),
                TimeLimit(),
                ShutdownNotifications(),
                Callbacks(),
                GroupCallbacks(self.limiter),  # a GroupCallbacks added later replaces it (add_middleware)
                Pipelines(),
                GroupSteps(self.limiter),  # before Retries: its after hook sees a member failed for good
                Retries(max_retries=max_retries, min_backoff=min_backoff, max_backoff=max_backoff),
                # Actors with store_results=True keep their results in job_results.
                Results(backend=PostgresBackend(url=self.url, pool=self.pool, listen_url=self.listen_url)),
                CurrentMessage(),
                JobOptions(),
            ]
        super().__init__(middleware=middleware)
        self.owner = owner or owner_id()
        self.lease_seconds = lease_seconds
        self.poll_interval = poll_interval
        self.queue_priorities = queue_priorities or {}  # queue -> its role's default priority (config)
        self.queues: dict[str, None] = {}
        # Unbounded until a worker process sets it to what it can run at once.
        self.capacity = Capacity(limit=1 << 30)
        # Each queue's consumer holds at most its prefetch (claimed, not finished),
        # as with Dramatiq's own brokers, within the process's capacity.
        self.queue_capacity: dict[str, Capacity] = {}
        self.fail_fast_default = fail_fast_default
        self.failures = Failures(keep=fail_fast_default)
        self.claiming = threading.Event()
        self.claiming.set()
        self.batches = logstore.Batches()  # the log batches this process holds
        self.leases = Leases(self.pool, self.owner, lease_seconds, batches=self.batches)
        # An outcome that makes its job claimable again (requeue, retry, limited, a late
        # key) writes and lets go under it, and a claim holds what it took under it: this
        # process's own next claim may take the job back between that commit and the let
        # go, and a let go keyed by job id must not drop the new hold (it did: a job given
        # back from the log and taken again here was then lost).
        self._handback = threading.RLock()
        self._log_turn = 0  # claims since this process last asked job_queue (claim)
        self.floors = ClaimFloors()  # where this process's next claim of each queue starts
        self.gates = Gates()  # the keyed part's turn cursor and announced wake-up, per queue
        # Last, so its after_process_message runs first (see Fence).
        self.fence = Fence(self.leases)
        self.add_middleware(self.fence)
        tracing.add_to(self)  # the consumer spans, first in the list (where tracing is on)
        self._listener: Wakeups | None = None
        self._acks: AckBatcher | None = None
        self._timer: DueTimer | None = None
        self._stragglers: StragglerProbe | None = None
        self._keeper = LeaseKeeper(self.leases) if keep_leases else None
        self._progress: ProgressBuffer | None = None
        self._start_lock = threading.Lock()
        self.jobs_done = 0
        self._claims_failing = False
        self._budget_cache: tuple[int, dict[str, Any]] | None = None
        self._limited_cache: tuple[int, frozenset[str]] | None = None

    def _connection_failed(self, pool: ConnectionPool) -> None:
        leases = getattr(self, "leases", None)  # the pool opens (and may fail) before the leases exist
        if leases is not None:
            leases.connection_failed()

    # --- producer side ------------------------------------------------------

    def declare_actor(self, actor: dramatiq.Actor[..., Any]) -> None:
        """Dramatiq's, after checking the actor's flow-control options: a bad one fails the
        definition with one LimitOptionError naming the actor and the option (a middleware's
        before_declare_actor could not: Dramatiq logs what a hook raises and goes on)."""
        bulk.actor_plan(actor)
        super().declare_actor(actor)

    def add_middleware(self, middleware: Middleware, *, before: type[Middleware] | None = None,
                       after: type[Middleware] | None = None) -> None:
        """Dramatiq's. A GroupCallbacks added (Dramatiq's docs add one with a backend of the
        user's) takes the place of the broker's default one: with both, each would count
        the members at its own barrier and both would send the callbacks."""
        if isinstance(middleware, dramatiq.middleware.GroupCallbacks):
            for default in [m for m in self.middleware if isinstance(m, GroupCallbacks) and m is not middleware
                            and m.rate_limiter_backend is self.limiter]:
                self.middleware.remove(default)
        super().add_middleware(middleware, before=before, after=after)

    def declare_queue(self, queue_name: str) -> None:
        if queue_name not in self.queues:
            self.emit_before("declare_queue", queue_name)
            self.queues[queue_name] = None
            self.emit_after("declare_queue", queue_name)

    @contextlib.contextmanager
    def transaction(self, conn: psycopg.Connection) -> Iterator[psycopg.Connection]:
        """Enqueue inside the caller's transaction: ``actor.send()`` calls in this
        block write through ``conn``, so the jobs exist if and only if the
        caller's transaction commits."""
        token = _transaction.set(conn)
        try:
            yield conn
        finally:
            _transaction.reset(token)

    def _retries(self) -> Retries | None:
        for m in self.middleware:
            if isinstance(m, Retries):
                return m
        return None

    @contextlib.contextmanager
    def _conn(self, conn: psycopg.Connection | None = None, *, pool: ConnectionPool | None = None,
              timeout: float = 10.0) -> Iterator[psycopg.Connection]:
        conn = conn or (None if pool else _transaction.get())
        if conn is not None:
            yield conn
            return
        try:
            with (pool or self.pool).connection(timeout=timeout) as pooled:
                yield pooled
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise BrokerConnectionError(f"database unavailable ({db.redact(self.url)}): {exc}") from exc

    # --- worker side --------------------------------------------------------

    def set_capacity(self, limit: int) -> None:
        """Claim no more rows than this process can run at once (its thread count)."""
        self.capacity.set_limit(limit)

    def pause_claiming(self) -> None:
        self.claiming.clear()

    def resume_claiming(self) -> None:
        self.claiming.set()

    @property
    def actor_pool(self) -> ConnectionPool:
        """Connections for actor code's own queries, apart from the broker's few
        (an actor holding one for long never delays a claim or an ack)."""
        with self._start_lock:
            if self._actor_pool is None:
                self._actor_pool = db.make_pool(self.url, min_size=0, max_size=self._actor_pool_size,
                                                name="actors")
            return self._actor_pool

    def _wakeups(self) -> Wakeups:
        handlers = {CANCEL_CHANNEL: self.fence.cancel}
        if self.wakeup_fd is not None:
            return PipeWakeups(self.wakeup_fd, on_notify=handlers)
        if self.listen_url:
            return Listener(self.listen_url, on_notify=handlers)
        return Wakeups("no-wakeups", on_notify=handlers)  # consumers poll

    def _start(self) -> tuple[Wakeups, AckBatcher]:
        with self._start_lock:
            if self._listener is None:
                self._listener = self._wakeups()
                self._listener.start()
            if self._acks is None:
                self._acks = AckBatcher(self._write_acks)
                self._acks.start()
            if self._timer is None:
                self._timer = DueTimer(self.pool)
                self._listener.on_gate = self._gate_opens  # a peer's '~queue seconds'
                self._listener.on_waiting = self.gates.waiting  # '+queue'
                self._timer.on_fire = self.gates.wake
                self._timer.start()
            if self._stragglers is None:
                self._stragglers = StragglerProbe(self.pool, self.floors)
                self._stragglers.start()
            return self._listener, self._acks

    def _serve(self, queue_name: str, prefetch: int) -> tuple[threading.Event, Capacity]:
        """A queue consumer's wake-up event (NOTIFY or the due timer) and in-flight bound."""
        listener, _ = self._start()
        with self._start_lock:
            if self._keeper is not None and self._keeper.ident is None:
                # Each queue holds up to its own prefetch (Dramatiq's consumers are per queue).
                self._keeper.register_as(
                    Registration(self.pool, self.owner, role=defaults.DRAMATIQ_ROLE, queues=sorted(self.queues),
                                 capacity=prefetch * len(self.queues), beat_seconds=self._keeper.beat_seconds),
                    done=lambda: self.jobs_done)
                self._keeper.start()
        assert self._timer is not None
        wakeup = self._timer.serve(queue_name, listener)
        sweep = SweepSignal(self.floors, queue_name, wakeup)
        listener.watch(REQUEUED + queue_name, sweep)
        assert self._stragglers is not None
        self._stragglers.watch(queue_name, sweep)
        with self._start_lock:
            bound = self.queue_capacity.setdefault(queue_name, Capacity(prefetch, within=self.capacity))
        bound.set_limit(prefetch)
        return wakeup, bound

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 30000) -> PostgresConsumer:
        if queue_name not in self.queues:
            raise QueueNotFound(queue_name)
        wakeup, bound = self._serve(queue_name, prefetch)
        return PostgresConsumer(
            queue_name,
            prefetch=prefetch,
            timeout_ms=timeout,
            claim=lambda queue, n, idle: self.claim(queue, n, idle=idle),
            wakeup=wakeup,
            capacity=bound,
            claiming=self.claiming,
            poll_interval=self.poll_interval,
            outcomes=self,
            priority=self._actor_priority,
        )

    def _actor_priority(self, message: PgMessageProxy) -> int:
        actor = self.actors.get(message.actor_name)
        return 0 if actor is None else actor.priority

    def progress_buffer(self) -> ProgressBuffer:
        """This process's progress reports, written by their own thread, started on
        first use (``supervisor.progress`` keeps its ``record`` for the job)."""
        progress = self._progress
        if progress is None:
            with self._start_lock:
                if self._progress is None:
                    self._progress = ProgressBuffer(self.pool, holds=self.leases.holds)
                    self._progress.start()
                progress = self._progress
        return progress

    def flush_acks(self, timeout: float | None = None) -> bool:
        return self._acks.flush(timeout) if self._acks else True

    def close(self) -> None:
        if self._acks is not None:
            self._acks.stop(timeout=10)
        if self._progress is not None:
            self._progress.stop()
            try:
                with self.pool.connection(timeout=10) as c:
                    self._progress.write(c)
            except Exception as exc:
                log.warning("could not write the last progress reports: %s", exc)
        if self._listener is not None:
            self._listener.stop()
        for thread in (self._timer, self._stragglers, self._keeper):
            if thread is not None:
                thread.stop()
        for m in self.middleware:
            if isinstance(m, Results) and isinstance(m.backend, PostgresBackend):
                m.backend.close()
        self.limiter.close()
        if self._actor_pool is not None:
            self._actor_pool.close()
        self.pool.close()


def setup_broker(url: str | None = None, **options: Any) -> PostgresBroker:
    """Install a PostgresBroker as Dramatiq's global broker (producers, the dramatiq CLI).

    Call once, before importing actor modules. URL from the argument, else
    DATABASE_URL, else the embedded default.
    """
    current = dramatiq.broker.global_broker
    if isinstance(current, PostgresBroker) and (url is None or current.url == url):
        return current
    options.setdefault("keep_leases", True)  # nobody else renews them under the dramatiq CLI
    broker = PostgresBroker(url, **options)
    dramatiq.set_broker(broker)
    return broker
