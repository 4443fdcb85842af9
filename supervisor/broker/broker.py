"""PostgresBroker: Dramatiq messages stored as job rows. Composed of parts, each given what
it needs: ``producer`` (producer.py: enqueue, enqueue_many), ``claims`` (claims.py),
``outcomes`` (outcomes.py: ack, nack, retry, limited, requeue), ``completer`` (completer.py:
the outcomes' writes, the progress buffer), ``background`` (background.py: its threads)
and ``queue_helpers`` (joining.py: flush, join); the middleware signals (signals.py) are
a base. Here the state the parts share, their wiring, Dramatiq's Broker interface as
delegations, consume() and close()."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

import dramatiq
import psycopg
from dramatiq.broker import Broker
from dramatiq.errors import QueueNotFound
from dramatiq.message import Message
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
from psycopg_pool import ConnectionPool

from .. import db, defaults
from ..identity import owner_id
from . import bulk, logstore, tracing
from .connections import Connections, within
from .consuming.background import Background
from .consuming.capacity import Capacity
from .consuming.claims import Claims
from .consuming.completer import Completer
from .consuming.consumer import PostgresConsumer
from .consuming.fencing import Fence
from .consuming.floors import ClaimFloors
from .consuming.gates import Gates
from .consuming.keeper import LeaseKeeper
from .consuming.leases import Leases
from .consuming.outcomes import Outcomes
from .consuming.progress import ProgressBuffer
from .consuming.workflow_results import WorkflowSteps
from .fanin import GroupSteps
from .groups import GroupCallbacks
from .joining import Failures, QueueHelpers
from .limiter import PostgresBackend as LimiterBackend
from .message import PgMessageProxy
from .middleware import JobOptions, Retries
from .producing.producer import Producer
from .results import PostgresBackend
from .signals import Signals


# Signals stays a base, not a part: it turns ``middleware`` into a property (a list that
# notices edits), which only a class can hold, and overrides emit_before / emit_after,
# which Dramatiq calls on the broker and whose hooks get the broker itself; a part behind
# a delegation would add a call to each of a job's signals. Broker types middleware as a list.
class PostgresBroker(Signals, Broker):  # type: ignore[misc]
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
      storage: ignored (kept so older callers still run): every job the log takes goes
        there, and every consumer claims it (logstore.ignored_storage says so once).
      floors: where this process's next claim of each queue starts (default: ClaimFloors()).

    The state its parts share is made here and handed to each: ``pool``, ``owner``,
    ``leases`` (what this process holds), ``batches`` (the log batches it holds),
    ``floors``, ``gates``, ``failures`` and the hand-back lock.
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
        floors: ClaimFloors | None = None,
    ) -> None:
        logstore.ignored_storage(storage)
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
                WorkflowSteps(),  # before Results: its result for a step's done row is the one kept
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
        handback = threading.RLock()
        # Where this process's next claim of each queue starts (given: a test's own slack and clock).
        self.floors = floors if floors is not None else ClaimFloors()
        self.gates = Gates()  # the keyed part's turn cursor and announced wake-up, per queue
        # Last, so its after_process_message runs first (see Fence).
        self.fence = Fence(self.leases)
        self.add_middleware(self.fence)
        tracing.add_to(self)  # the consumer spans, first in the list (where tracing is on)
        self._start_lock = threading.Lock()  # each thread and pool made once, whichever part asks first
        self.connections = connections = Connections(self.pool, self.url)  # the parts' pool, or the caller's
        self.completer = Completer(self.pool, self.owner, self.batches, holds=self.leases.holds,
                                   lock=self._start_lock)
        self.background = Background(
            self.pool, self.owner, floors=self.floors, gates=self.gates, completer=self.completer,
            on_cancel=self.fence.cancel, listen_url=self.listen_url, wakeup_fd=wakeup_fd,
            keeper=LeaseKeeper(self.leases) if keep_leases else None, lock=self._start_lock)
        self.outcomes = Outcomes(
            connections, completer=self.completer, background=self.background, leases=self.leases,
            batches=self.batches, floors=self.floors, failures=self.failures, actors=self.actors,
            handback=handback, emit_before=self.emit_before, emit_after=self.emit_after)
        self.claims = Claims(
            connections, self.owner, lease_seconds=lease_seconds, leases=self.leases,
            batches=self.batches, floors=self.floors, gates=self.gates, failures=self.failures,
            actors=self.actors, handback=handback, retries=self._retries, finish=self.completer.finish,
            background=self.background)
        self.producer = Producer(
            connections, actors=self.actors, queue_priorities=self.queue_priorities,
            retries=self._retries, retry=self.outcomes.retry, emit_before=self.emit_before,
            emit_after=self.emit_after)
        self.queue_helpers = QueueHelpers(self.pool, self.queues, self.failures, fail_fast_default=fail_fast_default)

    def _connection_failed(self, pool: ConnectionPool) -> None:
        leases = getattr(self, "leases", None)  # the pool opens (and may fail) before the leases exist
        if leases is not None:
            leases.connection_failed()

    def _retries(self) -> Retries | None:
        for m in self.middleware:
            if isinstance(m, Retries):
                return m
        return None

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

    def enqueue(self, message: Message[Any], *, delay: int | None = None,
                conn: psycopg.Connection | None = None) -> Message[Any]:
        return self.producer.enqueue(message, delay=delay, conn=conn)

    def enqueue_many(self, messages: Iterable[Message[Any]], *, delay: int | None = None,
                     conn: psycopg.Connection | None = None) -> list[Message[Any]]:
        """Producer.enqueue_many: many messages in one transaction, large batches by COPY."""
        return self.producer.enqueue_many(messages, delay=delay, conn=conn)

    def transaction(self, conn: psycopg.Connection) -> AbstractContextManager[psycopg.Connection]:
        """Enqueue inside the caller's transaction: ``actor.send()`` calls in this
        block write through ``conn``, so the jobs exist if and only if the
        caller's transaction commits."""
        return within(conn)

    # --- Dramatiq's test helpers (joining.py) ---------------------------------

    def flush(self, queue_name: str) -> None:
        self.queue_helpers.flush(queue_name)

    def flush_all(self) -> None:
        self.queue_helpers.flush_all()

    def join(self, queue_name: str, *, timeout: int | None = None, fail_fast: bool | None = None) -> None:
        self.queue_helpers.join(queue_name, timeout=timeout, fail_fast=fail_fast)

    @property
    def dead_letters(self) -> list[PgMessageProxy]:
        return self.queue_helpers.dead_letters

    def forget_failures(self) -> None:
        self.queue_helpers.forget_failures()

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

    def claim(self, queue: str, n: int, *, idle: bool = False) -> list[PgMessageProxy]:
        return self.claims.claim(queue, n, idle=idle)

    def ack(self, message: PgMessageProxy, on_written: Callable[[int], None] | None = None) -> None:
        self.outcomes.ack(message, on_written)

    def nack(self, message: PgMessageProxy) -> None:
        self.outcomes.nack(message)

    def limited(self, message: PgMessageProxy, seconds: float) -> PgMessageProxy:
        """The actor raised ``supervisor.RateLimited`` (Retries calls it: Outcomes.limited)."""
        return self.outcomes.limited(message, seconds)

    def requeue(self, messages: Iterable[PgMessageProxy], reason: str = "requeued unstarted on drain") -> int:
        return self.outcomes.requeue(messages, reason)

    @property
    def jobs_done(self) -> int:
        """Attempts this process finished (acked or failed: Outcomes)."""
        return self.outcomes.jobs_done

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 30000) -> PostgresConsumer:
        if queue_name not in self.queues:
            raise QueueNotFound(queue_name)
        claims, outcomes = self.claims, self.outcomes
        # (the count read by a bound getattr, not a lambda of this module: a claim passes
        # through the parts the broker composed, not the broker itself)
        wakeup = self.background.serve(queue_name, prefetch, self.queues,
                                       done=functools.partial(getattr, outcomes, "jobs_done"))
        with self._start_lock:
            bound = self.queue_capacity.setdefault(queue_name, Capacity(prefetch, within=self.capacity))
        bound.set_limit(prefetch)
        return PostgresConsumer(
            queue_name,
            prefetch=prefetch,
            timeout_ms=timeout,
            claim=lambda queue, n, idle: claims.claim(queue, n, idle=idle),
            wakeup=wakeup,
            capacity=bound,
            claiming=self.claiming,
            poll_interval=self.poll_interval,
            outcomes=outcomes,
            priority=self._actor_priority,
        )

    def _actor_priority(self, message: PgMessageProxy) -> int:
        actor = self.actors.get(message.actor_name)
        return 0 if actor is None else actor.priority

    def progress_buffer(self) -> ProgressBuffer:
        """This process's progress reports (Completer.progress_buffer)."""
        return self.completer.progress_buffer()

    def flush_acks(self, timeout: float | None = None) -> bool:
        return self.background.flush_acks(timeout)

    def close(self) -> None:
        self.background.stop_acks()  # the last acks written, then the last progress reports
        self.completer.close()
        self.background.stop()
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
