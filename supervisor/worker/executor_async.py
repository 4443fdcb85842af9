"""Async actors on the process's event loop: many coroutines in flight on a few threads.

Dramatiq wraps an ``async def`` actor so that calling it runs the coroutine on the
AsyncIO middleware's loop thread and blocks the calling worker thread until it ends: a
thread per running coroutine. In the executor (executor.py) a worker thread that takes
an async actor's message fires ``before_process_message`` as for any message, starts
the coroutine on the loop and goes on to the next message. When the coroutine ends,
the outcome thread settles it exactly as a worker thread settles a job that ran in it
(``WorkerThread.settle``: after_process_message or after_skip_message, the ack through
the ack batcher or the nack/retry write, the work queue told it is done).

- At most ``limit`` coroutines run at once (the role's ``async_limit``): a worker thread
  that takes an async message while the loop is full waits for a coroutine to end (or,
  told to stop meanwhile, puts the message back for ``Worker.stop`` to give back).
- The claim makes room for them: a running coroutine's row is set aside from the
  capacity (``Capacity.set_aside``), and as many again as lookahead until the limit
  (``_make_room``), so a process of 4 threads fills its async_limit in a few claims.
- Dramatiq's middleware keyed by thread (TimeLimit, ShutdownNotifications) is applied
  to the coroutine instead: its thread entry is withdrawn as soon as the before hooks
  have run, a coroutine past its time limit is cancelled and fails with
  ``TimeLimitExceeded``, a ``notify_shutdown`` one is cancelled with ``Shutdown`` at
  worker shutdown. The Fence stops a coroutine (lease lost, job cancelled) through
  ``message.interrupt`` likewise. The outcome is the Interrupt whatever the coroutine
  does with its CancelledError, as under Dramatiq's AsyncIO.
- The before hooks run in a copy of the thread's context, the coroutine and the after
  hooks in that same copy: CurrentMessage and other contextvars see the job's values.
- The loop: the AsyncIO middleware's if the broker has it (its loop thread, our way: no
  thread waits), else one of the worker's own, started at the first async message.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import queue
import threading
import time
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

from dramatiq import Actor
from dramatiq.asyncio import EventLoopThread, async_to_sync, get_event_loop_thread
from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import ShutdownNotifications, TimeLimit
from dramatiq.middleware.shutdown import Shutdown
from dramatiq.middleware.time_limit import TimeLimitExceeded

from ..broker.consuming.capacity import Capacity
from ..broker.consuming.consumer import PostgresConsumer
from ..broker.message import PgMessageProxy
from .executor_threads import ClaimThread, WorkerThread, WorkQueue

log = logging.getLogger(__name__)


async def _probe() -> None:
    """Only its wrapper's code object is used: the mark of an actor Dramatiq wrapped."""


# Dramatiq's Actor keeps ``async_to_sync(fn)`` as ``actor.fn`` for an async def (the
# coroutine function is its ``__wrapped__``): its code object tells such an actor apart.
_ASYNC_WRAPPER = async_to_sync(_probe).__code__


def coroutine_function(actor: Actor[..., Any] | None) -> Callable[..., Coroutine[Any, Any, Any]] | None:
    """The ``async def`` behind an actor, or None for an actor that runs in a thread."""
    fn = getattr(actor, "fn", None)
    if getattr(fn, "__code__", None) is _ASYNC_WRAPPER:
        return fn.__wrapped__  # type: ignore[union-attr,no-any-return]
    return None


class _Job:
    """One async message from its before hooks to its settling."""

    __slots__ = ("actor", "capacity", "context", "coro", "limit_ms", "message", "notify", "started", "task",
                 "timer", "why")

    def __init__(self, message: PgMessageProxy, context: contextvars.Context) -> None:
        self.message = message
        self.context = context
        self.actor: Actor[..., Any] | None = None
        self.coro: Coroutine[Any, Any, Any] | None = None
        self.task: asyncio.Task[Any] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.limit_ms: float | None = None
        self.notify = False  # cancelled with Shutdown at worker shutdown (notify_shutdown)
        self.capacity: Capacity | None = None
        self.started = 0.0
        self.why: type[BaseException] | None = None  # the Interrupt it was cancelled with


class Coroutines:
    """The async actors' side of one executor Worker: which messages are theirs, the
    loop they run on, the bound on how many run, and the thread that settles them."""

    def __init__(self, broker: Broker, consumers: dict[str, ClaimThread], work_queue: WorkQueue, *,
                 limit: int, worker_timeout: int) -> None:
        self.broker = broker
        self.consumers = consumers
        self.work_queue = work_queue
        self.limit = max(1, limit)
        self.worker_timeout = worker_timeout
        self.in_flight = 0  # coroutines started and not ended
        self.most_in_flight = 0  # the highest in_flight seen (tests and the bench read it)
        self._unsettled: set[_Job] = set()  # taken by a thread, outcome not yet written
        # Per queue capacity (by id): [the capacity, its coroutines running, rows set aside]
        self._rooms: dict[int, list[Any]] = {}
        self._cond = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._own_loop: EventLoopThread | None = None
        self._outcomes: OutcomeThread | None = None
        self._start_lock = threading.Lock()

    # --- worker threads -------------------------------------------------------------

    def runs(self, actor_name: str) -> bool:
        """Whether the actor of this name is declared, and an async one."""
        return coroutine_function(self.broker.actors.get(actor_name)) is not None

    def take(self, message: MessageProxy, thread: WorkerThread) -> bool:
        """Whether ``message`` is an async actor's; if so it is this object's now: started
        on the loop (or settled at once if a before hook failed it, or put back on the work
        queue if ``thread`` was told to stop while the loop was full)."""
        actor = self.broker.actors.get(message.actor_name)
        fn = coroutine_function(actor)
        if fn is None or actor is None or not isinstance(message, PgMessageProxy):
            return False
        job = _Job(message, contextvars.copy_context())
        with self._cond:
            while self.in_flight >= self.limit:
                if not thread.running:  # stopping: Worker.stop gives it back, unstarted
                    self.work_queue.put_batch([message], lambda m: int(actor.priority))
                    self.work_queue.task_done()
                    return True
                self._cond.wait(thread.timeout)
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self._unsettled.add(job)
        if job.context.run(self._begin, job, fn, thread):
            # Out of the context first: the loop steps the task in it.
            self._running_loop().call_soon_threadsafe(self._run, job)
        return True

    def _begin(self, job: _Job, fn: Callable[..., Coroutine[Any, Any, Any]], thread: WorkerThread) -> bool:
        """In the worker thread, in the job's context: the before hooks, and the coroutine
        made; whether it is to run (else it was settled here)."""
        message, broker = job.message, self.broker
        message.interrupt = partial(self._interrupt, job)  # the Fence stops it through this
        try:
            broker.emit_before("process_message", message)
            self._untie_from_thread(job)
            if message.failed:  # a before hook failed it: nothing runs, as in a thread
                self.stopped_running(job)
                thread.settle(message, None)
                self.settled(job)
                return False
            job.actor = actor = broker.get_actor(message.actor_name)
            actor.logger.debug("Received args=%r kwargs=%r.", message.args, message.kwargs)
            job.coro = fn(*message.args, **message.kwargs)
        except BaseException as e:
            self.stopped_running(job)
            thread.settle(message, job.actor, exception=e)
            self.settled(job)
            return False
        consumer = self.consumers[message.queue_name].consumer
        if isinstance(consumer, PostgresConsumer):
            job.capacity = consumer.capacity
            with self._cond:
                self._make_room(job.capacity, 1)
        job.started = time.monotonic()
        return True

    def _make_room(self, capacity: Capacity, change: int) -> None:
        """``capacity``'s queue has ``change`` more (or fewer) coroutines running: set
        their rows aside (they hold no thread), and as many again as lookahead, up to
        async_limit: each claim then takes up to twice what runs, so a process fills its
        limit in a few claims, not one claim per thread's worth of rows. At the limit no
        lookahead is left: the claim holds only the threads' rows beyond it. Under _cond."""
        room = self._rooms.setdefault(id(capacity), [capacity, 0, 0])
        room[1] += change
        running = room[1]
        target = running + max(0, min(running, self.limit - self.in_flight))
        capacity.set_aside(target - room[2])
        room[2] = target

    def _untie_from_thread(self, job: _Job) -> None:
        """Withdraw what Dramatiq's thread-keyed middleware just registered for this thread
        (which goes on to other messages) and apply it to the coroutine instead."""
        actor = self.broker.actors.get(job.message.actor_name)
        for m in self.broker.middleware:
            if isinstance(m, TimeLimit):
                m.manager.remove_timeout(threading.get_ident())  # type: ignore[no-untyped-call]
                if actor is not None:
                    job.limit_ms = job.message.options.get("time_limit") or actor.options.get(
                        "time_limit", m.time_limit)
            elif isinstance(m, ShutdownNotifications) and actor is not None and m.should_notify(actor, job.message):
                m.manager.remove_notification()
                job.notify = True

    def stopped_running(self, job: _Job) -> None:
        """The job no longer runs (or never started): its slot is free; it is settled next."""
        job.message.interrupt = None
        with self._cond:
            self.in_flight -= 1
            if job.capacity is not None:
                self._make_room(job.capacity, -1)
                job.capacity = None
            self._cond.notify_all()

    def settled(self, job: _Job) -> None:
        with self._cond:
            self._unsettled.discard(job)
            self._cond.notify_all()

    # --- the loop ---------------------------------------------------------------------

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The AsyncIO middleware's loop, else the worker's own; started at first use,
        with the outcome thread."""
        if self._loop is not None:
            return self._loop
        with self._start_lock:
            if self._loop is None:
                self._outcomes = OutcomeThread(self)
                self._outcomes.start()
                theirs = get_event_loop_thread()
                if theirs is None:
                    self._own_loop = theirs = EventLoopThread(log)
                    theirs.daemon = True  # a coroutine that never ends must not keep the process up
                    theirs.start(timeout=5.0)
                self._loop = theirs.loop
        return self._loop

    def _run(self, job: _Job) -> None:
        """On the loop: start the coroutine as a task in the job's context, with its timer."""
        assert self._loop is not None and job.coro is not None
        if job.why is not None:  # stopped before it began
            job.coro.close()
            self._done(job, None)
            return
        job.task = self._loop.create_task(job.coro, context=job.context)
        job.coro = None
        if job.limit_ms is not None and job.limit_ms != float("inf"):
            job.timer = self._loop.call_later(job.limit_ms / 1000, self._expire, job)
        job.task.add_done_callback(partial(self._done, job))

    def _expire(self, job: _Job) -> None:
        logging.getLogger("dramatiq.middleware.time_limit.TimeLimit").warning(
            "Time limit exceeded. Cancelling the coroutine of message %s.", job.message)
        self._cancel(job, TimeLimitExceeded)

    def _interrupt(self, job: _Job, exc: type[BaseException]) -> None:
        """From any thread (the Fence, a shutdown notification): cancel the coroutine with ``exc``."""
        loop = self._running_loop()
        if not loop.is_closed():
            loop.call_soon_threadsafe(self._cancel, job, exc)

    def _cancel(self, job: _Job, exc: type[BaseException]) -> None:
        if job.why is not None:
            return  # the first reason stands
        job.why = exc
        if job.task is not None:
            job.task.cancel()

    def _done(self, job: _Job, task: asyncio.Task[Any] | None) -> None:
        """On the loop: the coroutine ended; its outcome goes to the outcome thread."""
        if job.timer is not None:
            job.timer.cancel()
        result, exception = None, None
        if job.why is not None:
            exception = job.why()  # what a blocked thread would have raised, however the coroutine ended
        elif task is not None and task.cancelled():
            exception = asyncio.CancelledError()
        elif task is not None:
            exception = task.exception()
            result = None if exception is not None else task.result()
        if job.actor is not None:
            job.actor.logger.debug("Completed after %.02fms.", (time.monotonic() - job.started) * 1000)
        job.task = None
        assert self._outcomes is not None
        self._outcomes.ended.put((job, result, exception))

    # --- the worker's stop ---------------------------------------------------------------

    def notify_shutdown(self) -> None:
        """Worker shutdown: cancel the coroutines of actors that asked to be told
        (ShutdownNotifications' notify_shutdown) with Shutdown."""
        with self._cond:
            jobs = [job for job in self._unsettled if job.notify]
        for job in jobs:
            self._interrupt(job, Shutdown)

    def stop(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every coroutine to end and be settled; then
        end the outcome thread and the worker's own loop. Whether all were settled (if not,
        both stay: the drain stops the rest, and their outcomes are still handled)."""
        with self._cond:
            settled = self._cond.wait_for(lambda: not self._unsettled, timeout)
            left = len(self._unsettled)
        if not settled:
            log.warning("%d coroutines still running at the shutdown timeout", left)
            return False
        if self._outcomes is not None:
            self._outcomes.ended.put(None)
            self._outcomes.join(timeout)
        if self._own_loop is not None:
            self._own_loop.stop()
        return True


class OutcomeThread(WorkerThread):
    """Settles the coroutines that ended, one after another, as a worker thread settles
    the job it ran (after hooks, outcome), in each job's context. A thread, not the loop:
    the outcome may wait for the database, the coroutines must not."""

    def __init__(self, coroutines: Coroutines) -> None:
        super().__init__(broker=coroutines.broker, consumers=coroutines.consumers,
                         work_queue=coroutines.work_queue, worker_timeout=coroutines.worker_timeout)
        self.name = "async-outcomes"
        self.coroutines = None  # it takes no message itself
        self.owner = coroutines
        self.ended: queue.SimpleQueue[tuple[_Job, Any, BaseException | None] | None] = queue.SimpleQueue()

    def run(self) -> None:
        while (item := self.ended.get()) is not None:
            job, result, exception = item
            self.owner.stopped_running(job)
            try:
                job.context.run(self.settle, job.message, job.actor, result, exception)
            except Exception:  # settle handles what the hooks raise; this would be a bug of ours
                self.logger.exception("Unhandled error settling message %s.", job.message)
            finally:
                self.owner.settled(job)
            del item, job, result, exception  # no exception (its frames) outlives the attempt
