"""The broker's middleware signals (broker/signals.py) keep Dramatiq's contract while
calling only real hooks, and a claimed message reads its fields without MessageProxy's
__getattr__. Real broker on real PostgreSQL; a real Dramatiq Worker for the end-to-end
case."""

from __future__ import annotations

import dataclasses
import logging

import dramatiq
import pytest
from dramatiq.message import Message
from dramatiq.middleware import Middleware, SkipMessage

from tests.conftest import in_process_worker, scalar, wait_for

QUEUE = "signals"


class Recorder(Middleware):
    """Records the hooks it defines, with its name, into a shared list."""

    def __init__(self, name: str, calls: list[tuple[str, str]]) -> None:
        self.name = name
        self.calls = calls

    def before_process_message(self, broker, message) -> None:
        self.calls.append((self.name, "before_process_message"))

    def after_process_message(self, broker, message, *, result=None, exception=None) -> None:
        self.calls.append((self.name, "after_process_message"))


class Failing(Middleware):
    def before_ack(self, broker, message) -> None:
        raise RuntimeError("hook failed")

    def before_enqueue(self, broker, message, delay) -> None:
        raise SkipMessage("a MiddlewareError goes through")


def test_hooks_run_in_dramatiq_order_and_follow_the_middleware_list(broker):
    calls: list[tuple[str, str]] = []
    broker.add_middleware(Recorder("a", calls))
    broker.add_middleware(Recorder("b", calls))
    broker.emit_before("process_message", None)
    broker.emit_after("process_message", None, result=None)
    # before_*: list order; after_*: reversed, as Dramatiq's Broker does.
    assert calls == [("a", "before_process_message"), ("b", "before_process_message"),
                     ("b", "after_process_message"), ("a", "after_process_message")]

    calls.clear()
    broker.add_middleware(Recorder("c", calls), before=Recorder)  # added after the first emit
    broker.emit_before("process_message", None)
    assert calls == [("c", "before_process_message"), ("a", "before_process_message"),
                     ("b", "before_process_message")]


def test_a_hook_set_on_an_instance_is_called(broker):
    calls: list[str] = []
    plain = Middleware()
    plain.before_nack = lambda broker, message: calls.append("before_nack")  # type: ignore[method-assign]
    broker.add_middleware(plain)
    broker.emit_before("nack", None)
    assert calls == ["before_nack"]


def test_a_failing_hook_is_logged_and_a_middleware_error_raised(broker, caplog):
    broker.add_middleware(Failing())
    with caplog.at_level(logging.CRITICAL):
        broker.emit_before("ack", None)  # logged, not raised
    assert any("Unexpected failure in before_ack" in r.getMessage() for r in caplog.records)
    with pytest.raises(SkipMessage):
        broker.emit_before("enqueue", None, None)


def test_claimed_message_fields_are_the_messages(broker, conn):
    @dramatiq.actor(broker=broker, queue_name=QUEUE, actor_name="signals_fields")
    def fields(x, y=None):
        pass

    broker.declare_queue(QUEUE)
    sent = fields.send_with_options(args=(1,), kwargs={"y": 2}, priority=3)
    [claimed] = broker.claim(QUEUE, 5)
    inner = claimed._message  # noqa: SLF001  (Dramatiq's MessageProxy keeps the message there)
    for name in ("message_id", "queue_name", "actor_name", "args", "kwargs", "options", "message_timestamp"):
        assert getattr(claimed, name) == getattr(inner, name), name
    assert claimed.message_id == sent.message_id and claimed.args == (1,) and claimed.kwargs == {"y": 2}
    # Built field by field (message._message): the Message Dramatiq's own constructor makes,
    # every field of it (a field Dramatiq adds would be missing here: this fails then).
    assert type(inner) is Message
    assert set(vars(inner)) == {f.name for f in dataclasses.fields(Message)}
    assert inner == Message(**{f.name: getattr(inner, f.name) for f in dataclasses.fields(Message)})
    assert inner == sent.copy(options=inner.options)  # the claim drops nothing but what it adds to options
    # Middleware (Retries) writes into options: one dict, seen through both.
    claimed.options["retries"] = 1
    assert inner.options["retries"] == 1
    assert claimed.asdict()["options"]["retries"] == 1
    broker.requeue([claimed])


def test_a_worker_runs_every_job_once_through_the_signals(broker, conn):
    runs: list[int] = []

    @dramatiq.actor(broker=broker, queue_name=QUEUE, actor_name="signals_count", max_retries=0)
    def count(i):
        runs.append(i)

    calls: list[tuple[str, str]] = []
    broker.add_middleware(Recorder("r", calls))
    broker.declare_queue(QUEUE)
    broker.enqueue_many([count.message(i) for i in range(200)])
    worker = dramatiq.Worker(broker, queues={QUEUE}, worker_threads=4, worker_timeout=100)
    worker.start()
    try:
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE queue = %s AND status = 'succeeded'",
                                (QUEUE,)) == 200, 60)
    finally:
        worker.stop()
    assert sorted(runs) == list(range(200))
    assert calls.count(("r", "before_process_message")) == 200
    assert calls.count(("r", "after_process_message")) == 200


def _planned(broker, signal: str, message) -> list[str]:
    hooks = broker._hooks(signal, reverse=signal.startswith("after_"))
    return [type(m).__name__ for m, _ in broker._planned(signal, hooks, message)]


def test_hooks_that_do_nothing_for_a_message_are_skipped_only_when_nothing_asks_for_them(broker):
    """Dramatiq's own AgeLimit, ShutdownNotifications, Pipelines, Callbacks, Retries and
    Results do nothing for a message of an actor without their options: skipped for it;
    an actor's or the message's own option brings each one back."""
    @dramatiq.actor(broker=broker, queue_name=QUEUE, actor_name="plan_plain")
    def plain():
        pass

    @dramatiq.actor(broker=broker, queue_name=QUEUE, actor_name="plan_asks", max_age=60_000, notify_shutdown=True,
                    store_results=True, on_success="plan_plain")
    def asks():
        pass

    every_before = [type(m).__name__ for m, _ in broker._hooks("before_process_message", reverse=False)]
    every_after = [type(m).__name__ for m, _ in broker._hooks("after_process_message", reverse=True)]
    assert {"AgeLimit", "ShutdownNotifications"} <= set(every_before)
    assert {"ShutdownNotifications", "Pipelines", "Callbacks", "Retries", "Results"} <= set(every_after)

    message = plain.message()
    assert _planned(broker, "before_process_message", message) == [
        n for n in every_before if n not in {"AgeLimit", "ShutdownNotifications"}]
    # GroupCallbacks and GroupSteps (issue 41): nothing without a group's options; WorkflowSteps
    # nothing without a workflow's
    skipped_after = {"ShutdownNotifications", "Pipelines", "Callbacks", "Retries", "Results", "GroupCallbacks",
                     "GroupSteps", "WorkflowSteps"}
    assert {"GroupCallbacks", "GroupSteps", "WorkflowSteps"} <= set(every_after)
    assert _planned(broker, "after_process_message", message) == [n for n in every_after if n not in skipped_after]
    # The actor's options bring back the hooks that read them (Retries: exceptions only).
    assert _planned(broker, "before_process_message", asks.message()) == every_before
    assert _planned(broker, "after_process_message", asks.message()) == [n for n in every_after if n not in
                                                                       {"Pipelines", "Retries", "GroupCallbacks",
                                                                        "GroupSteps", "WorkflowSteps"}]
    # So do the message's own options, whatever its actor says.
    for option in ("max_age", "notify_shutdown", "pipe_target", "on_success", "store_results",
                   "group_completion_uuid", "pipe_fanout", "pipe_fanin", "workflow"):
        own = plain.message_with_options(**{option: "plan_plain" if option == "on_success" else 1})
        assert _planned(broker, "before_process_message", own) == every_before, option
        assert _planned(broker, "after_process_message", own) == every_after, option


def test_a_run_that_raised_or_returned_a_value_meets_every_after_hook(broker):
    """The plan is used after a run that returned None without an exception only: an
    exception reaches Retries, a value reaches Results' warning."""
    calls: list[str] = []

    class Seen(dramatiq.middleware.Retries):  # a subclass of a skippable one is never skipped
        def after_process_message(self, broker, message, *, result=None, exception=None):
            calls.append(f"{result}/{type(exception).__name__}")

    broker.add_middleware(Seen())

    @dramatiq.actor(broker=broker, queue_name=QUEUE, actor_name="plan_runs")
    def runs():
        pass

    message = runs.message()
    broker.emit_after("process_message", message, result=None)
    broker.emit_after("process_message", message, result=7)
    broker.emit_after("process_message", message, exception=ValueError("x"))
    assert calls == ["None/NoneType", "7/NoneType", "None/ValueError"]
    planned = _planned(broker, "after_process_message", message)
    assert "Seen" in planned and "Retries" not in planned


@pytest.mark.parametrize("executor", ["own", "dramatiq"])
def test_a_skipped_hook_changes_nothing_end_to_end(broker, conn, executor):
    """Real workers (both executors): a message older than its actor's max_age is still
    failed by AgeLimit without running, a message piped to another actor still reaches it."""
    seen: list[str] = []

    @dramatiq.actor(broker=broker, queue_name=QUEUE, actor_name="plan_aged", max_age=1000, max_retries=0)
    def aged():
        seen.append("aged")

    @dramatiq.actor(broker=broker, queue_name=QUEUE, actor_name="plan_first")
    def first():
        return "piped"

    @dramatiq.actor(broker=broker, queue_name=QUEUE, actor_name="plan_second")
    def second(value):
        seen.append(value)

    broker.declare_queue(QUEUE)
    old = broker.enqueue(aged.message().copy(message_timestamp=1))
    dramatiq.pipeline([first.message(), second.message()], broker=broker).run()
    with in_process_worker(broker, [QUEUE], executor=executor):
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE queue = %s AND finished_at IS NOT NULL",
                                (QUEUE,)) == 3, 30)
    assert seen == ["piped"]
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (old.message_id,)) == "failed"


def test_a_middleware_of_ours_says_which_hooks_a_plan_may_skip(broker):
    """RunResults (a scheduled run's rows_affected) reports nothing for a run that returned
    None: skipped then; a subclass that does not say so itself is called."""
    from supervisor.broker.consuming.fencing import Fence
    from supervisor.worker.scheduler import RunResults

    class Counting(RunResults):
        pass

    broker.add_middleware(RunResults(), before=Fence)
    broker.add_middleware(Counting(), before=Fence)

    @dramatiq.actor(broker=broker, queue_name=QUEUE, actor_name="plan_scheduled")
    def scheduled():
        pass

    planned = _planned(broker, "after_process_message", scheduled.message())
    assert "Counting" in planned and "RunResults" not in planned
