"""supervisor's own executor (worker/executor.py) keeps dramatiq.Worker's contract: every
middleware hook fires as Dramatiq's worker fires it, pause holds claims and runs, a stop
finishes what runs and gives back what no thread started. In this process on the real
broker, and as `supervisor worker` processes of each executor side by side."""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from typing import Any

import dramatiq
import pytest
from dramatiq.middleware import Middleware, SkipMessage

from supervisor.broker import PostgresBroker
from supervisor.broker.consuming.fencing import Fence
from supervisor.worker.executor import Worker
from tests.conftest import in_process_worker, scalar, wait_for

QUEUE = "executor"

# Every hook Dramatiq's worker fires (the broker's own: enqueue, declare_*, boot).
WORKER_HOOKS = ("before_worker_boot", "after_worker_boot", "before_worker_shutdown", "after_worker_shutdown",
                "after_worker_thread_boot", "before_worker_thread_shutdown", "after_consumer_thread_boot",
                "before_consumer_thread_shutdown")
MESSAGE_HOOKS = ("before_process_message", "after_process_message", "after_skip_message", "before_ack",
                 "after_ack", "before_nack", "after_nack", "before_enqueue", "after_enqueue")


class Recorder(Middleware):
    """Records each hook as it fires: the worker's in order, each message's by its id."""

    def __init__(self) -> None:
        self.worker: list[str] = []
        self.messages: dict[str, list[str]] = defaultdict(list)
        self.threads: dict[str, set[int]] = defaultdict(set)  # message id -> threads its hooks ran in
        self._lock = threading.Lock()

    def before_process_message(self, broker: Any, message: Any) -> None:
        self._message("before_process_message", message)
        if message.actor_name == "skipped":
            raise SkipMessage("skipped on purpose")

    def _message(self, hook: str, message: Any) -> None:
        with self._lock:
            self.messages[message.message_id].append(hook)
            if not hook.endswith("_enqueue"):  # a send's run in the sender's thread
                self.threads[message.message_id].add(threading.get_ident())

    def _worker(self, hook: str) -> None:
        with self._lock:
            self.worker.append(hook)


def _recording(hook: str, per_message: bool) -> Any:
    def record(self: Recorder, broker: Any, subject: Any = None, *args: Any, **kwargs: Any) -> None:
        if per_message:
            self._message(hook, subject)
        else:
            self._worker(hook)

    return record


for _hook in WORKER_HOOKS:
    setattr(Recorder, _hook, _recording(_hook, per_message=False))
for _hook in MESSAGE_HOOKS:
    if _hook != "before_process_message":
        setattr(Recorder, _hook, _recording(_hook, per_message=True))


def declare_actors(broker: PostgresBroker) -> dict[str, Any]:
    def ok() -> None:
        pass

    def failing() -> None:
        raise RuntimeError("failed on purpose")

    def retried() -> None:
        message = dramatiq.middleware.CurrentMessage.get_current_message()
        if message is not None and message.options.get("retries", 0) == 0:
            raise dramatiq.Retry(delay=0)

    def skipped() -> None:
        raise AssertionError("a skipped message never runs")

    options: dict[str, dict[str, Any]] = {"ok": {}, "failing": {"max_retries": 0}, "retried": {"max_retries": 3},
                                          "skipped": {}}
    return {name: dramatiq.actor(fn, broker=broker, queue_name=QUEUE, actor_name=name, **options[name])
            for name, fn in (("ok", ok), ("failing", failing), ("retried", retried), ("skipped", skipped))}


def run_and_record(broker: PostgresBroker, actors: dict[str, Any], executor: str) -> tuple[Recorder, dict[str, str]]:
    """Run one message of each actor on ``executor``: the hooks, and each message's actor."""
    recorder = Recorder()
    middleware = list(broker.middleware)
    broker.add_middleware(recorder, before=Fence)
    try:
        # Sent before the worker starts: a send's after_enqueue, in this thread, never
        # races the message's run.
        sent = {actor.send().message_id: name for name, actor in actors.items()}
        with in_process_worker(broker, [QUEUE], threads=2, executor=executor):
            broker.join(QUEUE, timeout=20_000, fail_fast=False)
        return recorder, sent
    finally:
        broker.middleware = middleware


def test_hooks_fire_as_dramatiq_s_worker_fires_them(conn, broker):
    by_executor = {}
    actors = declare_actors(broker)
    for executor in ("dramatiq", "own"):
        recorder, sent = run_and_record(broker, actors, executor)
        per_actor = {name: recorder.messages[message_id] for message_id, name in sent.items()}
        by_executor[executor] = (per_actor, recorder.worker, recorder.threads, sent)
    own, theirs = by_executor["own"], by_executor["dramatiq"]
    assert own[0] == theirs[0]
    sent = ["before_enqueue", "after_enqueue"]
    # The recorder sits just before the Fence: its after_process_message runs before
    # Retries' (after hooks run in reverse), which sends the retry.
    assert own[0] == {
        "ok": [*sent, "before_process_message", "after_process_message", "before_ack", "after_ack"],
        "failing": [*sent, "before_process_message", "after_process_message", "before_nack", "after_nack"],
        "skipped": [*sent, "before_process_message", "after_skip_message", "before_ack", "after_ack"],
        "retried": [*sent, "before_process_message", "after_process_message", "before_enqueue", "after_enqueue",
                    "before_ack", "after_ack", "before_process_message", "after_process_message", "before_ack",
                    "after_ack"],
    }
    # Boot: the same hooks (thread boots fire in their threads, in any order around
    # after_worker_boot); shutdown: in the same order, every worker thread's before the
    # consumer's.
    for executor, (_, worker_hooks, _, _) in by_executor.items():
        boot = worker_hooks[:worker_hooks.index("before_worker_shutdown")]
        assert boot[0] == "before_worker_boot", executor
        assert Counter(boot) == Counter({"before_worker_boot": 1, "after_worker_boot": 1,
                                         "after_worker_thread_boot": 2, "after_consumer_thread_boot": 1}), executor
    shutdowns = [hooks[hooks.index("before_worker_shutdown"):] for _, hooks, _, _ in (own, theirs)]
    assert shutdowns[0] == shutdowns[1] == [
        "before_worker_shutdown", "before_worker_thread_shutdown", "before_worker_thread_shutdown",
        "before_consumer_thread_shutdown", "after_worker_shutdown"]
    # The own executor writes an outcome in the thread that ran the job: one thread per attempt.
    for message_id, name in own[3].items():
        if name != "retried":
            assert len(own[2][message_id]) == 1, name


def test_a_paused_worker_claims_nothing_and_runs_nothing_until_resumed(conn, broker):
    calls: list[int] = []
    actor = dramatiq.actor(lambda n: calls.append(n), broker=broker, queue_name=QUEUE, actor_name="paused",
                           max_retries=0)
    with in_process_worker(broker, [QUEUE], threads=2, executor="own") as worker:
        wait_for(lambda: worker.consumers[QUEUE].consumer is not None, 10, message="the queue's consumer")
        worker.pause()
        assert all(t.paused_event.is_set() for t in [*worker.workers, *worker.consumers.values()])
        assert broker.background.listener is not None
        wakeup = broker.background.listener.event_for(QUEUE)
        wakeup.clear()
        message = actor.send(1)
        # The NOTIFY reached the queue's wake-up event, which only a claim clears: the
        # paused claim thread had reason to claim, and did not.
        assert wakeup.wait(10)
        assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (message.message_id,)) == "pending"
        assert calls == []
        worker.resume()
        broker.join(QUEUE, timeout=10_000)
        worker.join()
    assert calls == [1]
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (message.message_id,)) == "succeeded"


def test_a_stop_finishes_the_running_job_and_gives_back_what_no_thread_started(conn, broker):
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def blocker() -> None:
        started.set()
        assert release.wait(30)
        ran.append("blocker")

    blocking = dramatiq.actor(blocker, broker=broker, queue_name=QUEUE, actor_name="blocker", max_retries=0)
    noop = dramatiq.actor(lambda: ran.append("noop"), broker=broker, queue_name=QUEUE, actor_name="noop",
                          max_retries=0)
    with in_process_worker(broker, [QUEUE], threads=1, prefetch=4, executor="own") as worker:
        assert isinstance(worker, Worker)
        first = blocking.send()
        assert started.wait(10)
        waiting = [noop.send().message_id for _ in range(3)]
        wait_for(lambda: worker.work_queue.qsize() == 3, 10, message="3 rows claimed behind the running job")
        stopping = threading.Thread(target=worker.stop, kwargs={"timeout": 10_000})
        stopping.start()
        # Release the running job only once the thread was told to stop: it takes nothing more.
        wait_for(lambda: not worker.workers[0].running, 10, message="the worker thread to be told to stop")
        release.set()
        stopping.join(15)
        assert not stopping.is_alive()
        broker.flush_acks(10)
    assert ran == ["blocker"]
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (first.message_id,)) == "succeeded"
    rows = conn.execute("SELECT status, attempts FROM jobs WHERE id = ANY(%s::uuid[])", (waiting,)).fetchall()
    assert rows == [("pending", 0)] * 3
    assert worker.work_queue.qsize() == 0 and worker.work_queue.unfinished_tasks == 0
    assert not any(t.is_alive() for t in [*worker.workers, *worker.consumers.values()])


def test_a_queue_declared_after_start_is_claimed_unless_outside_the_worker_s_queues(conn, broker):
    late = dramatiq.actor(lambda: None, broker=broker, queue_name="executor_late", actor_name="late", max_retries=0)
    broker.declare_queue(QUEUE)
    worker = Worker(broker, worker_threads=1, worker_timeout=100)
    only = Worker(broker, queues={QUEUE}, worker_threads=1, worker_timeout=100)
    worker.start()
    only.start()
    try:
        broker.declare_queue("executor_later")
        assert set(worker.consumers) >= {QUEUE, "executor_late", "executor_later"}
        assert set(only.consumers) == {QUEUE}
        late.send()
        broker.join("executor_late", timeout=10_000)
    finally:
        worker.stop(timeout=10_000)
        only.stop(timeout=10_000)
        broker.flush_acks(10)
    broker.declare_queue("executor_after_stop")  # a stopped worker starts no claim thread
    assert "executor_after_stop" not in worker.consumers


@pytest.mark.parametrize("first", ["own", "dramatiq"])
def test_processes_of_each_executor_share_a_queue_exactly_once(conn, workers, first):
    second = "dramatiq" if first == "own" else "own"
    procs = [workers(threads=4, executor=first), workers(threads=4, executor=second)]
    for p in procs:
        p.wait_ready(conn)
    conn.execute("INSERT INTO jobs (queue, actor, args, max_attempts) SELECT 'tests', 'record',"
                 " jsonb_build_array(g, 0.0), 4 FROM generate_series(1, 2000) AS g")
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 2000, 120,
             interval=0.2, message="2000 jobs to succeed")
    runs, distinct, pids = conn.execute(
        "SELECT count(*), count(DISTINCT job_id), count(DISTINCT pid) FROM test_results").fetchone()
    assert (runs, distinct, pids) == (2000, 2000, 2)
    for p in procs:
        assert p.terminate() == 0


@pytest.mark.parametrize("executor", ["own", "dramatiq"])
def test_every_slot_a_drain_took_is_given_back_once_its_acks_commit(conn, broker, executor):
    """The ack batcher gives a batch's slots back in one call per consumer (with how many
    committed): after a drain of 2,000 jobs in batches, the process's capacity and the
    queue's bound hold nothing, neither more nor less."""
    runs: list[int] = []

    @dramatiq.actor(broker=broker, queue_name="slots", actor_name="slots_noop", max_retries=0)
    def noop(i):
        runs.append(i)

    broker.declare_queue("slots")
    broker.enqueue_many([noop.message(i) for i in range(2000)])
    with in_process_worker(broker, ["slots"], threads=4, prefetch=64, executor=executor):
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE queue = 'slots' AND status = 'succeeded'")
                 == 2000, 60)
    assert sorted(runs) == list(range(2000))
    assert broker.capacity.used == 0
    assert broker.queue_capacity["slots"].used == 0
