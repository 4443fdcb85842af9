"""PostgresBroker: Dramatiq messages stored as job rows (producer side and outcomes)."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import dramatiq
import psycopg
from dramatiq.broker import Broker
from dramatiq.errors import ActorNotFound, BrokerConnectionError, QueueNotFound
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
from psycopg_pool import ConnectionPool, PoolTimeout

from .. import db, defaults
from ..identity import owner_id
from . import bulk, late_keys, logstore, sending, sql
from .capacity import Capacity
from .consumer import PostgresConsumer
from .fencing import Fence
from .floors import REQUEUED, ClaimFloors, StragglerProbe, SweepSignal
from .gates import Gates
from .joining import Failures, QueueHelpers
from .keeper import LeaseKeeper
from .leases import Leases
from .listener import CANCEL_CHANNEL, Listener, PipeWakeups, Wakeups
from .message import PgMessageProxy, body_columns, decode_claimed
from .middleware import JobOptions, Retries, claim_budgets
from .outcomes import AckBatcher, Finish, Outcomes
from .progress import ProgressBuffer
from .results import PostgresBackend
from .signals import Signals
from .sql import joblog
from .timer import DueTimer

log = logging.getLogger(__name__)

# How long the actor pool keeps retrying a failed connection attempt (with backoff)
# while actor code waits for a connection.
ACTOR_POOL_RECONNECT = 30.0
# How long a claim waits for a connection while claims are failing (see claim).
CLAIM_TIMEOUT_IN_OUTAGE = 0.25
T = TypeVar("T")
_transaction: contextvars.ContextVar[psycopg.Connection | None] = contextvars.ContextVar(
    "actor_supervisor_transaction", default=None
)


# Signals makes ``middleware`` a property (a list that notices edits); Broker types it as a list.
class PostgresBroker(QueueHelpers, Outcomes, Signals, Broker):  # type: ignore[misc]
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
        if middleware is None:
            middleware = [
                AgeLimit(),
                TimeLimit(),
                ShutdownNotifications(),
                Callbacks(),
                Pipelines(),
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
        self._log_turn = 0  # claims since this process last asked job_queue (claim)
        self.floors = ClaimFloors()  # where this process's next claim of each queue starts
        self.gates = Gates()  # the keyed part's turn cursor and announced wake-up, per queue
        # Last, so its after_process_message runs first (see Fence).
        self.fence = Fence(self.leases)
        self.add_middleware(self.fence)
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

    def _row(self, message: Message[Any], delay: int | None) -> dict[str, Any]:
        actor = self.actors.get(message.actor_name)
        priority, max_attempts, dedupe_key = bulk.job_fields(message, actor, self._retries(), self.queue_priorities)
        message, concurrency_key, flow_key, limits = bulk.flow_fields(message, actor)
        return {
            "id": message.message_id,
            "queue": message.queue_name,
            "actor": message.actor_name,
            **body_columns(message),
            "message_timestamp": message.message_timestamp,
            "priority": priority,
            "delay_ms": int(delay or 0),
            "max_attempts": max_attempts,
            # the log's rows carry it (a release by any process spends it); job_queue's
            # claim reads it from the options or the claimer's actor
            "max_lease_losses": message.options.get("max_lease_losses",
                                                    None if actor is None else actor.options.get("max_lease_losses")),
            "dedupe_key": dedupe_key,
            "concurrency_key": concurrency_key,
            "flow_key": flow_key,
            "flow": limits,
        }

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

    def enqueue(
        self, message: Message[Any], *, delay: int | None = None, conn: psycopg.Connection | None = None
    ) -> Message[Any]:
        if isinstance(message, PgMessageProxy):
            # A retry: Retries hands the proxy back. dramatiq types enqueue Message -> Message only.
            return self._retry(message, delay)  # type: ignore[return-value]
        self.emit_before("enqueue", message, delay)
        row = self._row(message, delay)
        if self.storage == "log" and logstore.eligible(row, self.actors):
            message = self._send(self._log_writer([row], lambda c: message, atomic=False), conn, "enqueue 1 message")
        else:
            message = self._send(lambda c: sending.insert_one(c, row, message), conn, "enqueue 1 message")
        self.emit_after("enqueue", message, delay)
        return message

    def _log_writer(self, rows: list[dict[str, Any]], rest: Callable[[psycopg.Connection], T], *,
                    atomic: bool = True) -> Callable[[psycopg.Connection], T]:
        """A producer's write that appends ``rows`` to the log, then does ``rest`` (the
        job_queue part, if any), in one transaction (``atomic``: else no BEGIN and COMMIT
        for a write that is one statement); written again on a fresh connection, it
        appends only the rows the first write did not (sending.py)."""
        params = logstore.insert_params(rows)
        tries = [0]

        def write(c: psycopg.Connection) -> T:
            tries[0] += 1
            statement = ((joblog.LOG_INSERT_ONE if len(rows) == 1 else joblog.LOG_INSERT) if tries[0] == 1
                         else joblog.LOG_INSERT_AGAIN)
            if not c.autocommit or not atomic:  # the caller's transaction, or one statement
                c.execute(statement, params)
                return rest(c)
            with c.transaction():  # both parts, or neither
                c.execute(statement, params)
                return rest(c)
        return write

    def enqueue_many(
        self, messages: Iterable[Message[Any]], *, delay: int | None = None,
        conn: psycopg.Connection | None = None,
    ) -> list[Message[Any]]:
        """Write many messages at once, in one transaction (the caller's ``conn`` or
        ``transaction()``, else one of its own, written again on a fresh connection
        if the server ends it: see sending.py); large batches go in with COPY (see
        bulk.py). Messages whose dedupe key already has a live job, or repeats a
        key earlier in the batch, come back carrying that job's id."""
        messages = list(messages)
        if not messages:
            return []
        retries = self._retries()
        table = messages
        logged: list[dict[str, Any]] = []
        if self.storage == "log" and not delay:
            rows = [self._row(m, None) for m in messages]
            logged = [r for r in rows if logstore.eligible(r, self.actors)]
            if logged:
                table = [m for m, r in zip(messages, rows, strict=True) if not logstore.eligible(r, self.actors)]

        def write_table(c: psycopg.Connection) -> list[Message[Any]]:
            return bulk.enqueue_many(c, table, actors=self.actors, retries=retries, delay=int(delay or 0),
                                     priorities=self.queue_priorities) if table else []

        what = f"enqueue {len(messages)} messages"
        if not logged:
            return self._send(write_table, conn, what)
        written = iter(self._send(self._log_writer(logged, write_table), conn, what))
        kept = {r["id"] for r in logged}  # in the caller's order: a table message as bulk returns it
        return [m if m.message_id in kept else next(written) for m in messages]

    def _send(self, write: Callable[[psycopg.Connection], T], conn: psycopg.Connection | None, what: str) -> T:
        """A producer's write: on the caller's connection (its transaction, never
        written again here: see sending.py), else on the pool's, again on a fresh one
        if the server ends it (BrokerConnectionError once that has not helped)."""
        callers = conn or _transaction.get()
        if callers is not None:
            return write(callers)
        return sending.write_retrying(self.pool, self.url, write, what, give_up_after=defaults.ENQUEUE_RETRY_SECONDS)

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
                                                name="actors", reconnect_timeout=ACTOR_POOL_RECONNECT)
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
            if self._keeper is not None and self._keeper.ident is None:
                self._keeper.start()
            return self._listener, self._acks

    def _serve(self, queue_name: str, prefetch: int) -> tuple[threading.Event, Capacity]:
        """A queue consumer's wake-up event (NOTIFY or the due timer) and in-flight bound."""
        listener, _ = self._start()
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

    def _budgets(self) -> dict[str, Any]:
        """Each known actor's exception and lease-loss budgets, for rows that carry none
        (computed again only when an actor was declared since)."""
        if self._budget_cache is None or self._budget_cache[0] != len(self.actors):
            self._budget_cache = (len(self.actors), claim_budgets(self.actors, self._retries()))
        return self._budget_cache[1]

    def claim(self, queue: str, n: int, *, idle: bool = False) -> list[PgMessageProxy]:
        """Claim up to n rows; ``idle`` when the previous claim found the queue short.

        A row that cannot become a message fails at once, alone; only the others
        are returned (the consumer frees the capacity the bad ones reserved).

        With the log (storage "log"): the log's rows, and job_queue's only when the log had
        none (one statement a claim while the log has work: a woken consumer's job starts
        after one round trip), or first at every LOG_TABLE_TURN-th claim, so job_queue's
        rows (retries, delayed and keyed jobs) are never starved by a log that always has
        more.

        With storage "table" (every job this broker sends goes to job_queue): job_queue's
        rows, and the log's when job_queue had none, so the jobs of a producer left at the
        default storage never wait in a log no worker reads."""
        if self.storage != "log":
            return self._claim_table(queue, n, idle) or self._claim_log(queue, n, idle)
        self._log_turn += 1
        if self._log_turn % defaults.LOG_TABLE_TURN == 0:
            out = self._claim_table(queue, n, idle)
            return out + self._claim_log(queue, n - len(out), idle) if len(out) < n else out
        return self._claim_log(queue, n, idle) or self._claim_table(queue, n, idle)

    def _claiming(self, statement: Callable[[psycopg.Connection], T]) -> T:
        """A claim's statement on the pool, as an outage wants it (see claim)."""
        # In an outage, ask for a connection only briefly: the consumer tries again
        # at once, and each try makes the pool attempt a fresh connection.
        timeout = CLAIM_TIMEOUT_IN_OUTAGE if self._claims_failing else 10.0
        try:
            with self._conn(pool=self.pool, timeout=timeout) as c:
                result = statement(c)
        except BrokerConnectionError:
            self._claims_failing = True
            self.leases.may_have_orphaned()  # the claim may have committed with its answer lost
            with contextlib.suppress(Exception):
                self.pool.check()  # drop every broken idle connection now, not one per try
            raise
        self._claims_failing = False
        return result

    def _claim_log(self, queue: str, n: int, idle: bool) -> list[PgMessageProxy]:
        """Up to n rows of the queue's log, as one leased batch (``idle``: see claim)."""
        params = {"queue": queue, "n": n, "owner": self.owner, "lease_s": self.lease_seconds, "relaxed": idle}
        sent = time.monotonic()
        rows = self._claiming(lambda c: c.execute(joblog.LOG_CLAIM, params).fetchall())
        if not rows:
            return []
        out, bad = logstore.decode(rows, self.actors, self._budgets()["default_max_attempts"])
        self.batches.hold([(m.message_id, m.log_row) for m in out] + [(b[0], b[3]) for b in bad])
        self.leases.hold([(m.message_id, m.attempts) for m in out], since=sent)
        if bad:
            self.leases.fail_unreadable([b[:3] for b in bad])
            for job_id, _, _, _ in bad:
                actor = next(str(r[5]) for r in rows if str(r[3]) == job_id)
                if actor not in self.actors:
                    self.failures.record(job_id, ActorNotFound(actor))
        return out

    def _claim_table(self, queue: str, n: int, idle: bool) -> list[PgMessageProxy]:
        """Up to n rows of the queue in job_queue (sql.claim)."""
        floors, sweep = self.floors.params(queue)
        params = {"queue": queue, "n": n, "owner": self.owner, "lease_s": self.lease_seconds, "relaxed": idle,
                  **self._budgets(), **floors, **self.gates.params(queue, n)}
        sent = time.monotonic()
        keyed, probe = self.gates.statement(queue)
        rows = self._claiming(lambda c: c.execute(sql.claim(n, keyed=keyed, probe=probe), params).fetchall())
        if rows and rows[0][0] is None:  # the keyed part's META row (sql/flow.py)
            self._gated(queue, n, rows.pop(0))
        self.floors.claimed(queue, rows, sweep, time.monotonic() - sent)
        out, bad = decode_claimed(rows, self.actors)
        late: list[late_keys.LateKey] = []
        with_limits = self._with_limits()
        if with_limits:
            out, late, unkeyable = late_keys.split(rows, out, self.actors, with_limits)
            bad += unkeyable
        self.leases.hold([(m.message_id, m.attempts) for m in (*out, *(k.message for k in late))], since=sent)
        if late:
            self._key_late(late)
        if bad:
            self.leases.fail_unreadable(bad)
            failed = {job_id for job_id, _, _ in bad}
            for row in rows:  # join(fail_fast) raises what Dramatiq's worker would have met
                if str(row[0]) in failed and row[2] not in self.actors:
                    self.failures.record(str(row[0]), ActorNotFound(row[2]))
        return out

    def _with_limits(self) -> frozenset[str]:
        """The actors this process knows that have flow control (again only when an actor
        was declared since)."""
        if self._limited_cache is None or self._limited_cache[0] != len(self.actors):
            self._limited_cache = (len(self.actors), late_keys.planned(self.actors))
        return self._limited_cache[1]

    def _key_late(self, late: list[late_keys.LateKey]) -> None:
        """Claimed rows their producer did not key: written back waiting on their actor's key."""
        rows = [Finish(k.message.message_id, k.message.attempts, "requeue",
                       reason="keyed by its actor's limits (its producer did not know them)") for k in late]
        with self._conn(pool=self.pool) as c, c.transaction():
            c.execute(sql.KEY_LATE, late_keys.params(self.owner, late))
            self._finish(c, rows)
        self.leases.let_go(*(k.message.message_id for k in late))

    def _gate_opens(self, queue: str, seconds: float) -> None:
        """A peer's '~queue seconds': a limit key of the queue opens then (it has waiting rows)."""
        self.gates.gated(queue)
        if self._timer is not None:
            self._timer.due_in(queue, seconds)

    def _gated(self, queue: str, n: int, meta: tuple[Any, ...]) -> None:
        """A claim's word on the queue's limit keys: whether it has waiting rows, where its
        next turn starts, and when a gated key opens (0: the plain claim saw waiting rows,
        or the keyed one could not reach every key or left rows: claim again now)."""
        wait, cursor = meta[sql.WAIT_COLUMN], meta[sql.CURSOR_COLUMN]
        self.gates.learned(queue, n, wait, cursor, meta[sql.KEYS_COLUMN], meta[sql.TOOK_COLUMN])
        if wait is None:
            return
        if wait <= 0:
            if self._listener is not None:
                self._listener.event_for(queue).set()
        elif self._timer is not None:
            self._timer.due_in(queue, float(wait))

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
