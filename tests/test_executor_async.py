"""Async actors on the own executor (worker/executor_async.py): many coroutines in flight
on a few threads, at most async_limit of them, each settled as a job that ran in a thread
is (results, retries, failures, time limits), a stop that lets them end and gives back
what did not start; in this process on the real broker, and as a `supervisor worker`."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import dramatiq
import pytest
from dramatiq.asyncio import get_event_loop_thread
from dramatiq.middleware import AsyncIO, CurrentMessage
from dramatiq.results import Results

from supervisor.admin import cancel_job
from supervisor.broker import PostgresBroker
from tests.conftest import in_process_worker, scalar, wait_for

QUEUE = "coroutines"
pytestmark = pytest.mark.broker(poll_interval=5.0)


class Gate:
    """Coroutines that count themselves in and wait until the test opens the gate."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.running = 0
        self.most = 0
        self.threads: set[int] = set()
        self.messages: list[Any] = []

    async def wait(self) -> None:
        self.running += 1  # on the loop's one thread: no lock needed
        self.most = max(self.most, self.running)
        self.threads.add(threading.get_ident())
        self.messages.append(CurrentMessage.get_current_message())
        try:
            while not self.open.is_set():
                await asyncio.sleep(0.005)
        finally:
            self.running -= 1


def gated_actor(broker: PostgresBroker, gate: Gate, name: str = "gated") -> Any:
    async def gated(n: int) -> int:
        await gate.wait()
        return n

    return dramatiq.actor(gated, broker=broker, queue_name=QUEUE, actor_name=name, max_retries=0)


def statuses(conn, ids: list[str]) -> list[str]:
    return sorted(r[0] for r in conn.execute("SELECT status FROM jobs WHERE id = ANY(%s::uuid[])", (ids,)))


def with_middleware(broker: PostgresBroker, *added: Any) -> Callable[[], None]:
    """Add middleware (before the Fence, as a user's lands); returns how to take it out again."""
    kept = list(broker.middleware)
    for m in added:
        broker.add_middleware(m, before=type(broker.fence))
    return lambda: setattr(broker, "middleware", kept)


def test_many_coroutines_run_at_once_on_two_threads(conn, broker):
    gate = Gate()
    actor = gated_actor(broker, gate)
    with in_process_worker(broker, [QUEUE], threads=2, executor="own", async_limit=100) as worker:
        ids = [actor.send(n).message_id for n in range(40)]
        wait_for(lambda: gate.running == 40, 30, message="40 coroutines running at once")
        # Every one of them is running, on the loop: no worker thread holds one.
        assert worker.coroutines.in_flight == 40
        assert broker.fence.running_count() == 0
        assert len(gate.threads) == 1 and gate.threads.isdisjoint(t.ident for t in worker.workers)
        # Their leases are held like any job's (the heartbeat renews them).
        assert broker.leases.count() == 40
        gate.open.set()
        broker.join(QUEUE, timeout=20_000)
    assert gate.most == 40
    assert statuses(conn, ids) == ["succeeded"] * 40
    # CurrentMessage (a contextvar set by a before hook in a worker thread) is the job's own.
    assert sorted(m.message_id for m in gate.messages) == sorted(ids)


def test_async_limit_bounds_the_coroutines_in_flight(conn, broker):
    gate = Gate()
    actor = gated_actor(broker, gate)
    with in_process_worker(broker, [QUEUE], threads=2, executor="own", async_limit=5) as worker:
        ids = [actor.send(n).message_id for n in range(20)]
        wait_for(lambda: gate.running == 5, 30, message="5 coroutines running")
        # The two threads took a message each and wait for a free slot; the claim took
        # no more than the threads' rows beyond the running coroutines.
        wait_for(lambda: broker.leases.count() == 7, 10, message="7 rows held: 5 running, 2 in threads")
        assert worker.coroutines.in_flight == 5
        gate.open.set()
        broker.join(QUEUE, timeout=20_000)
        assert worker.coroutines.most_in_flight == 5
    assert gate.most == 5
    assert statuses(conn, ids) == ["succeeded"] * 20


def test_a_coroutine_s_return_value_reaches_the_results_backend(broker):
    async def doubled(n: int) -> int:
        await asyncio.sleep(0)
        return n * 2

    actor = dramatiq.actor(doubled, broker=broker, queue_name=QUEUE, actor_name="doubled", max_retries=0,
                           store_results=True)
    with in_process_worker(broker, [QUEUE], threads=1, executor="own"):
        messages = [actor.send(n) for n in range(5)]
        backend = next(m.backend for m in broker.middleware if isinstance(m, Results))
        assert [m.get_result(backend=backend, block=True, timeout=20_000) for m in messages] == [0, 2, 4, 6, 8]


def test_a_raising_coroutine_is_retried_then_fails_as_a_sync_actor_does(conn, broker):
    attempts: list[int] = []

    async def flaky() -> None:
        attempts.append(1)
        await asyncio.sleep(0)
        raise RuntimeError("raised in a coroutine")

    actor = dramatiq.actor(flaky, broker=broker, queue_name=QUEUE, actor_name="flaky", max_retries=2,
                           min_backoff=0, max_backoff=0)
    broker.forget_failures()
    with in_process_worker(broker, [QUEUE], threads=1, executor="own"):
        message = actor.send()
        broker.join(QUEUE, timeout=20_000, fail_fast=False)
    status, tries, error = conn.execute("SELECT status, attempts, last_error FROM jobs WHERE id = %s",
                                        (message.message_id,)).fetchone()
    assert (status, tries, len(attempts)) == ("failed", 3, 3)
    assert "RuntimeError: raised in a coroutine" in error and "in flaky" in error


def test_a_coroutine_past_its_time_limit_is_cancelled_and_fails(conn, broker):
    cleaned_up = threading.Event()

    async def overdue() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            cleaned_up.set()  # cancelled: its finally runs, on the loop

    actor = dramatiq.actor(overdue, broker=broker, queue_name=QUEUE, actor_name="overdue", max_retries=0,
                           time_limit=200)
    broker.forget_failures()
    with in_process_worker(broker, [QUEUE], threads=1, executor="own"):
        message = actor.send()
        broker.join(QUEUE, timeout=20_000, fail_fast=False)
    assert cleaned_up.is_set()
    status, error = conn.execute("SELECT status, last_error FROM jobs WHERE id = %s",
                                 (message.message_id,)).fetchone()
    assert status == "failed" and "TimeLimitExceeded" in error


def test_a_cancelled_job_s_coroutine_is_cancelled_on_the_loop_and_the_others_run_on(conn, broker):
    gate = Gate()
    ended: list[int] = []

    async def watched(n: int) -> None:
        try:
            await gate.wait()
        finally:
            ended.append(n)

    actor = dramatiq.actor(watched, broker=broker, queue_name=QUEUE, actor_name="watched", max_retries=0)
    with in_process_worker(broker, [QUEUE], threads=1, executor="own"):
        ids = [actor.send(n).message_id for n in range(3)]
        wait_for(lambda: gate.running == 3, 30, message="3 coroutines running")
        # The operator's cancel: a NOTIFY reaches this process's Fence, which cancels the
        # coroutine (no thread to raise in) and writes nothing for it.
        assert cancel_job(conn, ids[1])
        wait_for(lambda: ended == [1], 10, message="the cancelled coroutine to end")
        assert gate.running == 2
        gate.open.set()
        broker.join(QUEUE, timeout=20_000, fail_fast=False)
    assert sorted(ended) == [0, 1, 2]
    assert [scalar(conn, "SELECT status FROM jobs WHERE id = %s", (i,)) for i in ids] == \
        ["succeeded", "cancelled", "succeeded"]


def test_a_stop_lets_running_coroutines_end_and_gives_back_what_did_not_start(conn, broker):
    gate = Gate()
    actor = gated_actor(broker, gate)
    with in_process_worker(broker, [QUEUE], threads=1, executor="own", async_limit=2) as worker:
        ids = [actor.send(n).message_id for n in range(5)]
        wait_for(lambda: gate.running == 2, 30, message="2 coroutines running")
        # The thread holds a third and waits for a slot.
        wait_for(lambda: broker.leases.count() == 3, 10, message="a third row in the thread")
        stopping = threading.Thread(target=worker.stop, kwargs={"timeout": 10_000})
        stopping.start()
        wait_for(lambda: not worker.workers[0].is_alive(), 10, message="the worker thread to end")
        assert stopping.is_alive()  # waiting for the coroutines
        gate.open.set()
        stopping.join(15)
        assert not stopping.is_alive()
        broker.flush_acks(10)
    assert gate.most == 2
    # The two that ran succeeded; the one the thread held went back unstarted, as did the
    # rows never claimed: pending, no attempt spent.
    assert statuses(conn, ids) == ["pending"] * 3 + ["succeeded"] * 2
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE id = ANY(%s::uuid[]) AND status = 'pending'"
                        " AND attempts = 0", (ids,)) == 3
    assert broker.leases.count() == 0


def test_a_notify_shutdown_coroutine_is_cancelled_with_shutdown_when_the_worker_stops(conn, broker):
    gate = Gate()
    actor = gated_actor(broker, gate, "told")
    actor.options["notify_shutdown"] = True
    broker.forget_failures()
    with in_process_worker(broker, [QUEUE], threads=1, executor="own"):
        message = actor.send(1)
        wait_for(lambda: gate.running == 1, 30, message="the coroutine running")
    # The stop (leaving the block) cancelled it, the gate never opened.
    assert gate.running == 0 and not gate.open.is_set()
    status, error = conn.execute("SELECT status, last_error FROM jobs WHERE id = %s",
                                 (message.message_id,)).fetchone()
    assert status == "failed" and "Shutdown" in error


def test_with_dramatiq_s_asyncio_middleware_coroutines_run_on_its_loop_without_a_thread_each(conn, broker):
    gate = Gate()
    restore = with_middleware(broker, AsyncIO())
    actor = gated_actor(broker, gate)
    try:
        with in_process_worker(broker, [QUEUE], threads=2, executor="own"):
            loop_thread = get_event_loop_thread()
            assert loop_thread is not None
            ids = [actor.send(n).message_id for n in range(10)]
            wait_for(lambda: gate.running == 10, 30, message="10 coroutines running at once")
            assert gate.threads == {loop_thread.ident}
            gate.open.set()
            broker.join(QUEUE, timeout=20_000)
    finally:
        restore()
    assert statuses(conn, ids) == ["succeeded"] * 10
    assert get_event_loop_thread() is None  # the middleware's shutdown hook ended its loop


def test_a_supervisor_worker_runs_many_async_jobs_at_once_on_two_threads(conn, workers):
    w = workers(queues="async", actors="tests.async_actors", threads=2, extra_args=("--async-limit", "50"))
    w.wait_ready(conn)
    conn.execute("INSERT INTO jobs (queue, actor, args, max_attempts) SELECT 'async', 'snooze',"
                 " jsonb_build_array(1.0), 1 FROM generate_series(1, 30)")
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 30, 60,
             interval=0.1, message="30 async jobs to succeed")
    # How many ran at once, from the rows' own times: at some job's start, the jobs that
    # had started and not yet finished.
    overlap = scalar(conn, """
        SELECT max(n) FROM (SELECT (SELECT count(*) FROM jobs b WHERE b.started_at <= a.started_at
                                    AND b.finished_at > a.started_at) AS n FROM jobs a) s""")
    assert overlap > 2
    assert w.terminate() == 0
