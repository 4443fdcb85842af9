"""The threads of the executor (executor.py): one claim thread per queue, which puts each
claimed batch on the work queue at once, and the worker threads, which take a message,
run it and write its outcome themselves (an ack joins the broker's group commit).

What each thread does around a message is what ``dramatiq.worker``'s threads do, hook
for hook and log line for log line (the same loggers, so a user's log filters see the
same records); the difference is the hand-over: a batch per claim, not a message at a
time through a consumer thread.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import dramatiq.worker
from dramatiq import Actor
from dramatiq.broker import Broker, MessageProxy
from dramatiq.errors import BrokerConnectionError, RateLimitExceeded, Retry
from dramatiq.middleware import SkipMessage
from dramatiq.results import Results

from ..broker.consuming.consumer import PostgresConsumer
from ..broker.consuming.fencing import LeaseLost
from ..broker.message import PgMessageProxy


class Coroutines(Protocol):
    """What a WorkerThread asks of the async actors' side (executor_async.Coroutines),
    stated here so the two modules do not import each other."""

    def take(self, message: MessageProxy, thread: WorkerThread) -> bool:
        """Whether the message is an async actor's, now handed to the event loop."""
        ...

    def runs(self, actor_name: str) -> bool:
        """Whether the actor of this name is an async one (its messages go to take)."""
        ...

# Dramatiq's loggers, so its users' logging config applies to the same lines.
_worker_log = logging.getLogger("dramatiq.worker.WorkerThread")

# A consumer restarted after an unexpected error waits this long (Dramatiq's 3 s would
# leave a queue unclaimed that long; the PostgresConsumer retries outages on its own).
RESTART_DELAY_SECONDS = 0.5


class Item(NamedTuple):
    """A message waiting for a thread: lower ``priority`` (the actor's) first, then claim
    order (``seq``, unique, so messages are never compared). ``message`` is where
    Dramatiq's own work-queue items keep it (pace.GiveBack reads it)."""

    priority: int
    seq: int
    message: PgMessageProxy


class WorkQueue(queue.PriorityQueue[Item]):
    """Dramatiq's work queue (a PriorityQueue: ``qsize``, ``get``, ``task_done``, ``join``
    as Dramatiq's tests and pace.GiveBack use them) that takes a claimed batch in one go:
    one lock, one wake-up per message for threads that wait, none for busy ones."""

    def __init__(self) -> None:
        super().__init__()
        self._seq = itertools.count()
        self.taken = 0  # items taken so far (nudge: whether the awake threads keep up)
        self._taken_seen = 0

    def put_batch(self, messages: list[PgMessageProxy], priority: Callable[[PgMessageProxy], int],
                  wake: int | None = None) -> None:
        """Queue a claimed batch; wake ``wake`` waiting threads (None: one per message)."""
        items = [Item(priority(m), next(self._seq), m) for m in messages]
        with self.not_full:
            for item in items:
                heapq.heappush(self.queue, item)
            self.unfinished_tasks += len(items)
            self.not_empty.notify(len(items) if wake is None else min(wake, len(items)))

    def nudge(self) -> int:
        """Wake the waiting threads if items wait and none was taken since the last nudge
        (the threads a batch woke are all in jobs longer than their actors' means); how
        many items wait then (0: nothing to do)."""
        with self.mutex:
            stalled = self.taken == self._taken_seen
            self._taken_seen = self.taken
            if not self.queue or not stalled:
                return 0
            self.not_empty.notify(len(self.queue))
            return len(self.queue)

    def get(self, block: bool = True, timeout: float | None = None) -> Item:
        """The next item; at once, under the bare lock, when one waits (a busy thread's
        case: PriorityQueue.get's Condition, loop and not_full notification, which no one
        waits for in an unbounded queue, cost about a microsecond a job)."""
        with self.mutex:
            if self.queue:
                return self._get()
        return super().get(block, timeout)

    def _get(self) -> Item:  # PriorityQueue.get's, under the mutex
        self.taken += 1
        return heapq.heappop(self.queue)

    def task_done(self) -> None:
        with self.mutex:  # the lock beneath all_tasks_done: notify_all may be called under it
            unfinished = self.unfinished_tasks - 1
            if unfinished <= 0:
                if unfinished < 0:
                    raise ValueError("task_done() called too many times")
                self.all_tasks_done.notify_all()
            self.unfinished_tasks = unfinished

    def take_all(self) -> list[Item]:
        """Every waiting item, each counted as done (it will not run here)."""
        with self.not_full:
            items = sorted(self.queue)
            self.queue.clear()
            self.unfinished_tasks -= len(items)
            if self.unfinished_tasks <= 0:
                self.all_tasks_done.notify_all()
            return items


class _Pausable(threading.Thread):
    """Dramatiq's thread controls: ``running``, ``paused`` and ``paused_event`` (set once
    the thread has seen the pause), ``pause``, ``resume``, ``stop``. A paused thread looks
    again every ``timeout`` seconds, as Dramatiq's do: a resume takes effect at the next
    look (Dramatiq's tests rely on it: rows sent just before a resume are all claimed by
    then, and run by priority), a stop at once."""

    def __init__(self, name: str, timeout: float) -> None:
        super().__init__(name=name, daemon=True)
        self.running = True  # from the start: a stop() before run() is not lost
        self.paused = False
        self.paused_event = threading.Event()
        self.timeout = timeout
        self._stopping = threading.Event()

    def pause(self) -> None:
        self.paused = True
        self.paused_event.clear()

    def resume(self) -> None:
        self.paused = False
        self.paused_event.clear()

    def stop(self) -> None:
        self.running = False
        self._stopping.set()

    def _rest(self) -> None:
        """Paused: say so, and look again after the timeout (at once if told to stop)."""
        self.paused_event.set()
        self._stopping.wait(self.timeout)


class ClaimThread(_Pausable):
    """Claims batches of one queue (``PostgresConsumer.take``: capacity, wake-ups, outages)
    and puts each on the work queue as it comes. Dramatiq's consumer thread hooks fire
    here (``after_consumer_thread_boot``, ``before_consumer_thread_shutdown``); its
    ``consumer`` is the queue's PostgresConsumer (acks, nacks and requeues go to it)."""

    def __init__(self, *, broker: Broker, queue_name: str, prefetch: int, work_queue: WorkQueue,
                 worker_timeout: int, wakes: Callable[[list[PgMessageProxy]], int | None] | None = None) -> None:
        super().__init__(f"claims-{queue_name}", worker_timeout / 1000)
        # How many waiting worker threads a batch wakes (None, or a None answer: one per message).
        self.wakes = wakes
        self.logger = logging.getLogger(f"dramatiq.worker.ConsumerThread({queue_name})")
        self.broker = broker
        self.queue_name = queue_name
        self.prefetch = prefetch
        self.work_queue = work_queue
        self.worker_timeout = worker_timeout
        self.consumer: PostgresConsumer | None = None
        self.claims_stopped = False  # a stopping worker claims nothing more (see Worker.stop)

    def run(self) -> None:
        self.broker.emit_after("consumer_thread_boot", self)
        fresh = True
        while self.running:
            if self.paused or self.claims_stopped:
                self._rest()
                continue
            try:
                if fresh:
                    # A consumer of its own after an unexpected error, as Dramatiq's consumer
                    # thread makes one; the old one stays ``consumer`` until then: the outcomes
                    # of messages it claimed go through it (what it holds is shared per queue).
                    self.consumer = self._consume()
                    fresh = False
                assert self.consumer is not None
                batch = self.consumer.take(self.timeout)
                if batch:
                    self.work_queue.put_batch(batch, self._priority, self.wakes(batch) if self.wakes else None)
            except Exception:
                self.logger.critical("Consumer encountered an unexpected error.", exc_info=True)
                fresh = True
                if self.running:
                    self.logger.info("Restarting consumer in %0.2f seconds.", RESTART_DELAY_SECONDS)
                    self._stopping.wait(RESTART_DELAY_SECONDS)
        self.broker.emit_before("consumer_thread_shutdown", self)

    def _consume(self) -> PostgresConsumer:
        consumer = self.broker.consume(queue_name=self.queue_name, prefetch=self.prefetch, timeout=self.worker_timeout)
        assert isinstance(consumer, PostgresConsumer)  # Worker takes a PostgresBroker only
        # The work queue orders what it holds by (actor priority, claim order) itself: the
        # consumer's own sort of each batch by priority would only repeat it.
        consumer.priority = None
        return consumer

    def _priority(self, message: PgMessageProxy) -> int:
        actor = self.broker.actors.get(message.actor_name)
        return 0 if actor is None else int(actor.priority)

    def stop_claiming(self) -> None:
        self.claims_stopped = True

    def requeue_messages(self, messages: list[PgMessageProxy]) -> None:
        if self.consumer is not None:
            self.consumer.requeue(messages)

    def close(self) -> None:
        if self.consumer is not None:
            self.consumer.close()  # gives back what it still holds (a database away: their leases expire)


class WorkerThread(_Pausable):
    """Takes the next message off the work queue, runs it with Dramatiq's hooks around
    it, and writes its outcome through its queue's consumer, in this thread."""

    def __init__(self, *, broker: Broker, consumers: dict[str, ClaimThread], work_queue: WorkQueue,
                 worker_timeout: int, coroutines: Coroutines | None = None) -> None:
        super().__init__("worker", worker_timeout / 1000)
        self.logger = _worker_log
        self.broker = broker
        self.consumers = consumers
        self.work_queue = work_queue
        self.coroutines = coroutines  # where async actors' messages go (None: every actor runs here)
        # The actors asked about that run in a thread: their next messages skip the question
        # (an actor does not change from one kind to the other while the process runs).
        self._threaded: set[str] = set()

    def run(self) -> None:
        self.broker.emit_after("worker_thread_boot", self)
        get = self.work_queue.get
        while self.running:
            if self.paused:
                self._rest()
                continue
            try:
                item = get(timeout=self.timeout)
            except queue.Empty:
                continue
            self.process_message(item.message)
        self.broker.emit_before("worker_thread_shutdown", self)

    def process_message(self, message: MessageProxy) -> None:
        """Run one message as dramatiq.worker.WorkerThread does: before_process_message, the
        actor (unless a hook failed it), then after_process_message with its result or
        exception, or after_skip_message; then its outcome, and it is done. An async
        actor's message is handed to the event loop instead (executor_async.py), which
        settles it when its coroutine ends."""
        coroutines = self.coroutines
        if coroutines is not None and message.actor_name not in self._threaded:
            if coroutines.take(message, self):
                return
            if not coroutines.runs(message.actor_name):
                self._threaded.add(message.actor_name)
        broker = self.broker
        actor = None
        try:
            broker.emit_before("process_message", message)
            result = None
            if not message.failed:
                actor = broker.get_actor(message.actor_name)
                result = actor(*message.args, **message.kwargs)
        except BaseException as e:
            self.settle(message, actor, exception=e)
        else:
            self.settle(message, actor, result)

    def settle(self, message: MessageProxy, actor: Actor[..., Any] | None, result: Any = None,
               exception: BaseException | None = None) -> None:
        """What follows a run (``exception``: what it or a before hook raised), as Dramatiq's
        worker thread does it: after_process_message (or after_skip_message), the outcome,
        the work queue told it is done."""
        broker = self.broker
        try:
            if exception is not None:
                raise exception
            if result is not None and actor is not None and message.options.get("pipe_target") is None \
                    and not any(type(m) is Results for m in broker.middleware):
                self.logger.warning(
                    "Actor '%s' returned a value that is not None, and you haven't added the Results middleware "
                    "to the broker, so the value has been discarded. Consider adding the Results middleware to "
                    "your broker or piping the result into another actor.", actor.actor_name)
            broker.emit_after("process_message", message, result=result)
        except SkipMessage as e:
            if message.failed:
                message.stuff_exception(e)
            self.logger.warning("Message %s was skipped.", message)
            broker.emit_after("skip_message", message)
        except BaseException as e:
            message.stuff_exception(e)
            throws = message.options.get("throws") or (actor and actor.options.get("throws"))
            if isinstance(e, RateLimitExceeded):
                self.logger.debug("Rate limit exceeded in message %s: %s.", message, e)
            elif isinstance(e, LeaseLost):  # the fence's, not the job's: no traceback to read
                self.logger.warning("Message %s lost its lease; it runs again where it is claimed next.", message)
            elif throws and isinstance(e, throws):
                self.logger.info("Failed to process message %s with expected exception %s.", message,
                                 type(e).__name__)
            elif not isinstance(e, Retry):
                self.logger.error("Failed to process message %s with unhandled exception.", message, exc_info=True)
            broker.emit_after("process_message", message, exception=e)
        finally:
            self.post_process_message(message)
            self.work_queue.task_done()
            # No reference to the exception (its traceback, the frames' locals) outlives
            # the attempt (Dramatiq's discussion #351).
            message.clear_exception()
            exception = None

    def post_process_message(self, message: MessageProxy) -> None:
        """Ack or nack with Dramatiq's hooks around it; through a database outage, again
        until it is written (the lease fence makes a late write harmless)."""
        consumer = self.consumers[message.queue_name].consumer
        assert consumer is not None, "a message of a queue whose consumer is gone"
        while True:
            try:
                if message.failed:
                    self.broker.emit_before("nack", message)
                    consumer.nack(message)  # type: ignore[arg-type]  # only our claims arrive
                    self.broker.emit_after("nack", message)
                else:
                    self.broker.emit_before("ack", message)
                    consumer.ack(message)  # type: ignore[arg-type]
                    self.broker.emit_after("ack", message)
                return
            except BrokerConnectionError as e:
                delay = dramatiq.worker.POST_PROCESS_MESSAGE_RETRY_DELAY_SECS
                self.logger.warning("Failed to post_process_message(%s) due to a connection error: %s; "
                                    "retrying in %s seconds.", message, e, delay)
                time.sleep(delay)
            except Exception:
                self.logger.exception("Unhandled error during post_process_message(%s).", message)
                return

