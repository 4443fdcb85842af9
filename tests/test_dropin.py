"""What Dramatiq's own tests expect of a broker: exact messages, prefetch as an in-flight
bound, retries on time and as Dramatiq's middleware does them, the configured encoder,
join(fail_fast=...). Real workers in this process, each test with both executors
(dramatiq.Worker and supervisor's own), real PostgreSQL."""

from __future__ import annotations

import datetime
import gc
import logging
import threading
import weakref
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

import dramatiq
import pytest
from dramatiq.encoder import JSONEncoder, PickleEncoder
from dramatiq.errors import ActorNotFound, QueueJoinTimeout
from dramatiq.message import Message
from dramatiq.middleware import AsyncIO, CurrentMessage

from supervisor.broker import PostgresBroker
from supervisor.broker.consuming.timer import DueTimer
from supervisor.broker.joining import RaisedInActor
from supervisor.worker.process import EXECUTORS
from tests.conftest import cli, scalar, wait_for

QUEUE = "dropin"
# The poll interval is long on purpose: retries and delays must not wait for it.
pytestmark = pytest.mark.broker(poll_interval=5.0, fail_fast_default=True)


@pytest.fixture
def actors(broker: PostgresBroker) -> SimpleNamespace:
    seen: list = []  # (actor, message proxy, args) per run, in order

    def capture(*args, **kwargs):
        seen.append(("capture", CurrentMessage.get_current_message(), args))

    def retry_once(delay_ms: int):
        message = CurrentMessage.get_current_message()
        seen.append(("retry_once", message, ()))
        if message.options.get("retries", 0) == 0:
            raise dramatiq.Retry(delay=delay_ms)

    def bounce(times: int):
        message = CurrentMessage.get_current_message()
        seen.append(("bounce", message, ()))
        if message.options.get("retries", 0) < times:
            raise RuntimeError("bounce")

    def refuse():
        raise ValueError("refused on purpose")

    def exhausted(message_data, retry_info):
        seen.append(("exhausted", message_data, retry_info))

    def give_up():
        raise RuntimeError("always")

    def noop():
        pass

    def declare(fn, **options):
        return dramatiq.actor(fn, broker=broker, queue_name=QUEUE, **options)

    return SimpleNamespace(
        seen=seen,
        capture=declare(capture, max_retries=0),
        retry_once=declare(retry_once, max_retries=3),
        bounce=declare(bounce, max_retries=10, min_backoff=0),
        refuse=declare(refuse, max_retries=5, throws=(ValueError,)),
        exhausted=declare(exhausted, max_retries=0),
        give_up=declare(give_up, max_retries=1, min_backoff=0, on_retry_exhausted="exhausted"),
        noop=declare(noop, max_retries=0),
    )


@pytest.fixture(params=sorted(EXECUTORS))
def executor(request: pytest.FixtureRequest) -> str:
    """Each test that runs a worker runs with each executor (the role key's values)."""
    return str(request.param)


def start_worker(broker: PostgresBroker, threads: int, executor: str) -> Any:
    worker = EXECUTORS[executor](broker, queues={QUEUE}, worker_threads=threads, worker_timeout=100)
    worker.start()
    return worker


def stop_worker(broker: PostgresBroker, worker: Any) -> None:
    worker.stop(timeout=10_000)
    broker.flush_acks(10)
    broker.middleware = [m for m in broker.middleware if getattr(m, "worker", None) is not worker]


@pytest.fixture
def worker(broker, actors, conn, executor) -> Iterator[Any]:
    actors.seen.clear()
    broker.forget_failures()
    w = start_worker(broker, threads=2, executor=executor)
    yield w
    stop_worker(broker, w)


def runs(actors, name: str) -> list:
    return [entry for entry in actors.seen if entry[0] == name]


def test_the_message_received_is_the_message_sent(conn, broker, actors, worker):
    sent = [
        actors.capture.send_with_options(args=(1, "two", [3.5, None], {"k": "v"}), kwargs={"flag": True},
                                         max_age=3_600_000, custom={"nested": [1, 2]}),
        actors.capture.send(),
        *broker.enqueue_many([actors.capture.message(i, name=f"bulk {i}") for i in range(3)]),
    ]
    broker.join(QUEUE, timeout=10_000)
    received = {m.message_id: m for _, m, _ in runs(actors, "capture")}
    assert set(received) == {m.message_id for m in sent}
    for message in sent:
        got = received[message.message_id]
        assert got == message  # every field: id, timestamp, queue, actor, args, kwargs, options
        assert got.message_timestamp == message.message_timestamp
        assert str(got) == str(message)


def test_prefetch_bounds_what_a_plain_worker_holds(conn, broker, actors, executor):
    """A worker with one thread prefetches 2 (2 x threads, as Dramatiq's): never more rows running."""
    broker.enqueue_many([actors.noop.message() for _ in range(300)])
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, scalar(conn_sampler, "SELECT count(*) FROM jobs WHERE status = 'running'"))

    import psycopg

    conn_sampler = psycopg.connect(conn.info.dsn, password=conn.info.password, autocommit=True)
    sampler = threading.Thread(target=sample)
    sampler.start()
    w = start_worker(broker, threads=1, executor=executor)
    try:
        assert w.queue_prefetch == 2
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 300, 60,
                 message="300 jobs to succeed")
    finally:
        stop.set()
        sampler.join(10)
        conn_sampler.close()
        stop_worker(broker, w)
    assert 1 <= peak <= 2


def test_a_delayed_retry_starts_when_due(conn, broker, actors, worker):
    wait_for(lambda: broker.queue_capacity.get(QUEUE), 10, message="the consumer to start")
    message = actors.retry_once.send(100)
    broker.join(QUEUE, timeout=10_000)
    late, attempts = conn.execute(
        "SELECT extract(epoch FROM claimed_at - run_at), attempts FROM jobs WHERE id = %s", (message.message_id,)
    ).fetchone()
    assert attempts == 2
    assert 0 <= late < 0.1, f"the retry started {late * 1000:.0f} ms after it was due"


def test_a_delayed_send_starts_when_due(conn, broker, actors, worker):
    wait_for(lambda: broker.queue_capacity.get(QUEUE), 10, message="the consumer to start")
    message = actors.capture.send_with_options(delay=100)  # the insert trigger's NOTIFY '@dropin' sets the timer
    broker.join(QUEUE, timeout=10_000)
    late = scalar(conn, "SELECT extract(epoch FROM claimed_at - run_at) FROM jobs WHERE id = %s",
                  (message.message_id,))
    assert 0 <= late < 0.1, f"the delayed job started {late * 1000:.0f} ms after it was due"


def test_the_next_due_query_sees_every_priority(conn, broker):
    timer = DueTimer(broker.pool)
    assert timer.next_due([QUEUE, "empty"]) == {}
    for priority, seconds in ((5, 300), (0, 60), (-3, 30), (0, -10)):  # the last one is due already
        conn.execute("INSERT INTO jobs (queue, actor, priority, run_at) VALUES (%s, 'a', %s, now() + %s * interval '1 s')",
                     (QUEUE, priority, seconds))
    due = timer.next_due([QUEUE, "empty"])
    assert list(due) == [QUEUE] and 29 < due[QUEUE] <= 30


def test_ten_zero_backoff_retries_take_under_a_second(conn, broker, actors, worker):
    wait_for(lambda: broker.queue_capacity.get(QUEUE), 10, message="the consumer to start")
    message = actors.bounce.send(10)
    broker.join(QUEUE, timeout=10_000)
    took, attempts = conn.execute(
        "SELECT extract(epoch FROM finished_at - created_at), attempts FROM jobs WHERE id = %s",  # all 11 attempts
        (message.message_id,),
    ).fetchone()
    assert attempts == 11
    assert took < 1.0


def test_retries_look_like_dramatiq_s(conn, broker, actors, worker, caplog):
    caplog.set_level(logging.INFO, logger="dramatiq.middleware.retries")
    before = int(datetime.datetime.now().timestamp() * 1000)
    message = actors.retry_once.send(0)
    refused = actors.refuse.send()
    given_up = actors.give_up.send()
    broker.join(QUEUE, timeout=10_000, fail_fast=False)
    retried = runs(actors, "retry_once")[-1][1]
    assert retried.options["retries"] == 1
    assert retried.options["requeue_timestamp"] >= before
    assert "dramatiq.errors.Retry" in retried.options["traceback"]
    assert f"Aborting message {refused.message_id!r}." in caplog.messages
    assert f"Retrying message {message.message_id!r} in 0 milliseconds." in caplog.messages
    assert f"Retries exceeded for message {given_up.message_id!r}." in caplog.messages
    assert scalar(conn, "SELECT attempts FROM jobs WHERE id = %s", (refused.message_id,)) == 1
    [(_, data, info)] = runs(actors, "exhausted")
    assert data["message_id"] == given_up.message_id and info == {"retries": 1, "max_retries": 1}


def test_join_raises_only_with_fail_fast(conn, broker, actors, worker):
    refused = actors.refuse.send()
    broker.join(QUEUE, timeout=10_000, fail_fast=False)
    assert broker.dead_letters == [refused]
    with pytest.raises(ValueError, match="refused on purpose"):
        broker.join(QUEUE, timeout=10_000)
    broker.forget_failures()
    broker.join(QUEUE, timeout=10_000)
    assert broker.dead_letters == []
    stop_worker(broker, worker)
    actors.noop.send()
    with pytest.raises(QueueJoinTimeout):
        broker.join(QUEUE, timeout=200)


def test_a_producer_s_join_names_the_failed_job(conn, broker, actors, worker, database_url):
    producer = PostgresBroker(database_url)  # keeps no exception objects: reports the row's error
    try:
        producer.declare_queue(QUEUE)
        sent = actors.refuse.send()
        with pytest.raises(Exception, match=f"job {sent.message_id} \\(refuse\\) failed: ValueError: refused"):
            producer.join(QUEUE, timeout=10_000, fail_fast=True)
    finally:
        producer.close()


def test_the_pickle_encoder_works_end_to_end(conn, broker, actors, worker, database_url):
    dramatiq.set_encoder(PickleEncoder())
    try:
        day = datetime.date(2026, 11, 22)
        sent = actors.capture.send(day, when=datetime.datetime(2026, 1, 2, 3, 4, 5))
        retried = actors.retry_once.send(0)
        broker.join(QUEUE, timeout=10_000)
    finally:
        dramatiq.set_encoder(JSONEncoder())
    [(_, got, args)] = runs(actors, "capture")
    assert got == sent and args == (day,) and type(args[0]) is datetime.date
    assert runs(actors, "retry_once")[-1][1].options["retries"] == 1
    row = conn.execute("SELECT payload IS NOT NULL, args, kwargs FROM jobs WHERE id = %s",
                       (sent.message_id,)).fetchone()
    assert row == (True, [], {})
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (retried.message_id,)) == "succeeded"
    shown = cli("jobs", "show", sent.message_id, url=database_url)
    assert shown.returncode == 0 and "cannot render" in shown.stdout and "PickleEncoder" in shown.stdout


def test_a_message_enqueued_by_name_keeps_its_timestamp(conn, broker):
    message = Message(queue_name=QUEUE, actor_name="elsewhere", args=(), kwargs={}, options={},
                      message_timestamp=1_234_567_890_123)
    broker.enqueue(message)  # by name: the producer does not know the actor

    @dramatiq.actor(queue_name=QUEUE, actor_name="elsewhere", broker=broker)
    def elsewhere() -> None:
        """The worker side declares it (a row for an undeclared actor fails at claim)."""

    [claimed] = broker.claim(QUEUE, 1)
    try:
        assert claimed.message_timestamp == 1_234_567_890_123 and claimed == message
    finally:
        broker.requeue([claimed])


# --- the cases of Dramatiq's own suite (bench/dramatiq_suite.py) this broker failed ---


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_failed_attempt_s_exception_dies_with_its_attempt(conn, broker, caplog, kind, executor):
    """No reference to an actor's exception (its traceback, frames, their locals) outlives
    its attempt, so no cycle waits for a collection: join still raises the actor's type."""
    caplog.set_level(logging.CRITICAL)  # a captured record's exc_info would keep it alive
    raised: list[weakref.ref] = []

    class CustomError(Exception):
        def __init__(self, *args) -> None:
            super().__init__(*args)
            raised.append(weakref.ref(self))

    def failing():
        payload = bytearray(1024)  # a local of the frame the traceback holds
        raise CustomError("failed on purpose", len(payload))

    async def failing_async():
        failing()

    fn = failing if kind == "sync" else failing_async
    actor = dramatiq.actor(fn, broker=broker, queue_name=QUEUE, actor_name=f"leak_{kind}", max_retries=1,
                           min_backoff=0)
    broker.forget_failures()
    middleware = list(broker.middleware)
    if kind == "async":
        broker.add_middleware(AsyncIO())
    gc.disable()  # what a cycle holds stays alive: only freed-at-once objects die
    try:
        w = start_worker(broker, threads=1, executor=executor)
        try:
            actor.send()
            broker.join(QUEUE, timeout=10_000, fail_fast=False)
        finally:
            stop_worker(broker, w)
        assert len(raised) == 2  # the first attempt and its retry
        assert [ref() for ref in raised] == [None, None]
    finally:
        gc.enable()
        broker.middleware = middleware
    with pytest.raises(CustomError, match="failed on purpose") as info:
        broker.join(QUEUE, timeout=10_000)
    assert len(raised) == 2 and info.value.args == ("failed on purpose", 1024)
    assert isinstance(info.value.__cause__, RaisedInActor) and "in failing" in str(info.value.__cause__)


def test_a_consumer_hands_over_what_it_holds_by_actor_priority(conn, broker):
    """Dramatiq's actor priority (lower first) orders a claimed batch; claim order within one."""
    queue = "dropin_priority"
    hi = dramatiq.actor(lambda n: None, broker=broker, queue_name=queue, actor_name="prio_hi", priority=0)
    lo = dramatiq.actor(lambda n: None, broker=broker, queue_name=queue, actor_name="prio_lo", priority=10)
    for n in range(10):
        lo.send(n)
        hi.send(n)
    consumer = broker.consume(queue, prefetch=20, timeout=1000)
    held = [next(consumer) for _ in range(20)]
    try:
        assert [(m.actor_name, m.args[0]) for m in held] == \
            [("prio_hi", n) for n in range(10)] + [("prio_lo", n) for n in range(10)]
    finally:
        consumer.requeue(held)


def test_a_paused_worker_runs_every_higher_priority_job_first(conn, broker, executor):
    """Dramatiq's test_actors_can_prioritize_work: prefetch 20, one thread, sent while paused."""
    calls: list[str] = []
    queue = "dropin_paused"
    hi = dramatiq.actor(lambda: calls.append("hi"), broker=broker, queue_name=queue, actor_name="paused_hi",
                        priority=0)
    lo = dramatiq.actor(lambda: calls.append("lo"), broker=broker, queue_name=queue, actor_name="paused_lo",
                        priority=10)
    with mock.patch.object(dramatiq.worker, "QUEUE_PREFETCH", 20):
        w = EXECUTORS[executor](broker, queues={queue}, worker_threads=1, worker_timeout=100)
    w.start()
    # A pausing consumer thread waits this long before it looks again (3 s by default).
    with mock.patch.object(dramatiq.worker, "CONSUMER_RESTART_DELAY_SECS", 0.1):
        try:
            w.pause()
            for _ in range(10):
                lo.send()
                hi.send()
            w.resume()
            broker.join(queue, timeout=10_000)
        finally:
            stop_worker(broker, w)
    assert calls == ["hi"] * 10 + ["lo"] * 10


def test_a_job_of_a_missing_actor_is_a_dead_letter_equal_to_the_message_sent(conn, broker, worker):
    message = Message(queue_name=QUEUE, actor_name="nobody-here", args=(1, "two"), kwargs={"k": [3]},
                      options={"custom": True})
    broker.enqueue(message)
    with pytest.raises(ActorNotFound, match=r"^nobody-here$"):
        broker.join(QUEUE, timeout=10_000)
    [dead] = broker.dead_letters
    assert dead == message and dead.message_timestamp == message.message_timestamp
    assert "no actor named nobody-here" in scalar(conn, "SELECT last_error FROM jobs WHERE id = %s",
                                                   (message.message_id,))
