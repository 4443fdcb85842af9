"""The executor: ``dramatiq.Worker``'s contract on the PostgresBroker, without its
hand-offs.

Constructed and driven as ``dramatiq.Worker`` is (``Worker(broker, queues=...,
worker_threads=..., worker_timeout=...)``, ``start``, ``stop``, ``join``, ``pause``,
``resume``; ``workers``, ``work_queue``, ``consumers`` and ``queue_prefetch`` where
Dramatiq's tests read them), with every middleware hook fired where and in the order
Dramatiq's worker fires it. What differs is the path of a message:

- a claim thread per queue (executor_threads.ClaimThread) claims a batch
  (``PostgresConsumer.take``: sized by the free capacity, ordered by actor priority)
  and puts the whole batch on the work queue at once, where Dramatiq's consumer thread
  hands over one message at a time;
- a worker thread takes the next message by (actor priority, claim order), runs it and
  writes its outcome itself: an ack joins the broker's group commit (outcomes.AckBatcher),
  a failure or a retry is written from this thread;
- an async actor's message is started on the event loop by the thread that took it,
  which goes on to the next; at most ``async_limit`` coroutines run at once, and the
  outcome thread settles each when it ends (executor_async.py).

``stop`` stops the claims first, then lets the worker threads finish their current
message and the coroutines end (up to the timeout), and gives what no thread started
back to its queue.

``supervisor run`` and ``supervisor worker`` use it unless a role says ``executor:
dramatiq`` (worker/process.py); the broker works the same under ``dramatiq.Worker``.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable

import dramatiq.worker
from dramatiq.broker import Broker
from dramatiq.common import join_all, q_name
from dramatiq.errors import BrokerConnectionError
from dramatiq.middleware import Middleware

from .. import defaults
from ..broker import PostgresBroker
from ..broker.message import PgMessageProxy
from .executor_async import Coroutines
from .executor_threads import ClaimThread, WorkerThread, WorkQueue

log = logging.getLogger("dramatiq.worker.Worker")  # Dramatiq's, for the same lines on the same logger


class Worker:
    """Runs the messages of ``queues`` (default: every queue the broker declares, now or
    later) on ``worker_threads`` threads; idle threads look up every ``worker_timeout``
    milliseconds (a stop or a pause waits at most that long for them)."""

    def __init__(self, broker: Broker, *, queues: set[str] | None = None,
                 worker_timeout: int = dramatiq.worker.WORKER_TIMEOUT, worker_threads: int = 8,
                 async_limit: int = defaults.ASYNC_LIMIT) -> None:
        if not isinstance(broker, PostgresBroker):
            raise TypeError(f"supervisor's Worker runs a PostgresBroker's jobs, not a {type(broker).__name__}'s"
                            " (dramatiq.Worker runs any broker's)")
        self.broker = broker
        self.consumers: dict[str, ClaimThread] = {}
        self.consumer_whitelist = set(queues) if queues else None
        # Dramatiq's bound per queue (read when built, as Dramatiq's is: a test may patch it).
        self.queue_prefetch = dramatiq.worker.QUEUE_PREFETCH or min(worker_threads * 2, 65535)
        self.workers: list[WorkerThread] = []
        self.work_queue = WorkQueue()
        self.worker_timeout = worker_timeout
        self.worker_threads = worker_threads
        self._declared: _DeclaredQueues | None = None
        # How many waiting threads a claimed batch wakes (supervisor's worker process sets
        # Pace.wakes when GiveBack runs, which wakes the rest if the awake ones stall);
        # None: one per message, as Dramatiq's consumer hands each over.
        self.wakes: Callable[[list[PgMessageProxy]], int | None] | None = None
        # Async actors' coroutines, at most async_limit at once, on the event loop (executor_async.py).
        self.coroutines = Coroutines(broker, self.consumers, self.work_queue, limit=async_limit,
                                     worker_timeout=worker_timeout)

    def start(self) -> None:
        self.broker.emit_before("worker_boot", self)
        # Starts a claim thread for each declared queue, now and whenever one is declared.
        self._declared = _DeclaredQueues(self)
        self.broker.add_middleware(self._declared)
        for _ in range(self.worker_threads):
            self.add_worker()
        self.broker.emit_after("worker_boot", self)

    def pause(self) -> None:
        """Claim nothing more and take no message off the work queue; returns once every
        thread has seen it (a worker thread after its current message)."""
        threads = [*self.consumers.values(), *self.workers]
        for thread in threads:
            thread.pause()
        for thread in threads:
            thread.paused_event.wait()

    def resume(self) -> None:
        for thread in [*self.consumers.values(), *self.workers]:
            thread.resume()

    def stop(self, timeout: int = 600000) -> None:
        """Stop within ``timeout`` milliseconds: no more claims, running messages finish,
        the ones no thread started go back to their queues."""
        self.broker.emit_before("worker_shutdown", self)
        self.coroutines.notify_shutdown()  # ShutdownNotifications' counterpart for coroutines
        log.info("Shutting down...")
        # Claims stop first (Dramatiq's consumers go on claiming until its workers have
        # stopped, only for the rows to be given back); the claim threads themselves end
        # after the worker threads, in Dramatiq's order of thread shutdown hooks.
        for consumer in self.consumers.values():
            consumer.stop_claiming()
        for worker in self.workers:
            worker.stop()
        started = time.monotonic()
        join_all(self.workers, timeout)
        # No thread starts a coroutine now: the running ones end (up to the rest of the timeout).
        self.coroutines.stop(max(0.0, timeout / 1000 - (time.monotonic() - started)))
        for consumer in self.consumers.values():
            consumer.stop()
        join_all(self.consumers.values(), timeout)
        by_queue: dict[str, list[PgMessageProxy]] = defaultdict(list)
        for item in self.work_queue.take_all():
            by_queue[item.message.queue_name].append(item.message)
        for queue_name, messages in by_queue.items():
            try:
                self.consumers[queue_name].requeue_messages(messages)
            except BrokerConnectionError:
                log.warning("Failed to requeue messages on queue %r.", queue_name, exc_info=True)
        for consumer in self.consumers.values():
            consumer.close()
        if self._declared is not None:
            self._declared.active = False  # a stopped worker starts no claim thread for a later queue
        self.broker.emit_after("worker_shutdown", self)
        log.info("Worker has been shut down.")

    def join(self) -> None:
        """Wait until every message claimed so far has run and its outcome is handed on."""
        while True:
            self.work_queue.join()
            if not self.work_queue.unfinished_tasks:
                return

    def add_consumer(self, queue_name: str) -> None:
        if queue_name in self.consumers:
            return
        if self.consumer_whitelist and q_name(queue_name) not in self.consumer_whitelist:
            return
        thread = self.consumers[queue_name] = ClaimThread(
            broker=self.broker, queue_name=queue_name, prefetch=self.queue_prefetch, work_queue=self.work_queue,
            worker_timeout=self.worker_timeout, wakes=lambda batch: self.wakes(batch) if self.wakes else None)
        thread.start()

    def add_worker(self) -> None:
        thread = WorkerThread(broker=self.broker, consumers=self.consumers, work_queue=self.work_queue,
                              worker_timeout=self.worker_timeout, coroutines=self.coroutines)
        thread.start()
        self.workers.append(thread)


class _DeclaredQueues(Middleware):
    """A claim thread for each queue the broker declares (added by ``Worker.start``, after
    the Fence: it has no message hook, so order.check lets it be). ``worker`` is the
    attribute a caller finds it by, as Dramatiq's own worker middleware."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.active = True

    def after_declare_queue(self, broker: Broker, queue_name: str) -> None:
        if self.active:
            self.worker.add_consumer(queue_name)
