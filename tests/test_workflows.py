"""Durable workflows (issue 41, item 3; migration 049): a diamond's join gets its parents'
results in order and runs once, after both; a workflow sent in a transaction that rolls
back runs nothing; the failure policies; cancel and retry of a workflow and of a step with
its descendants; steps in the log (plain ones, and since 055 keyed ones: a dedupe key, a
concurrency limit, their limit held across steps and their cancel while waiting for a slot;
a rate-limited one paced there too)."""

from __future__ import annotations

import threading
import time
from typing import Any

import dramatiq
import psycopg
import pytest

import supervisor
from supervisor import workflow_ops
from supervisor.broker import PostgresBroker
from supervisor.broker.sql import slots
from tests import run_notes
from tests.conftest import in_process_worker, scalar, wait_for


@pytest.fixture
def store_broker(database_url: str):
    b = PostgresBroker(database_url)
    yield b
    b.close()


@pytest.fixture
def acts(store_broker: PostgresBroker) -> dict[str, Any]:
    broker = store_broker
    seen: list[Any] = []
    runs: dict[str, int] = {}
    lock = threading.Lock()
    gate = threading.Event()

    def actor(fn: Any, **options: Any) -> Any:
        options.setdefault("max_retries", 0)
        return dramatiq.actor(broker=broker, queue_name="wf", actor_name=f"wft_{fn.__name__}", **options)(fn)

    def count(name: str) -> None:
        with lock:
            runs[name] = runs.get(name, 0) + 1

    def seed(x: int) -> int:
        count("seed")
        return x

    def square(x: int, parents: list[int]) -> int:
        count("square")
        return parents[0] * parents[0] + x

    def join(parents: list[int]) -> list[int]:
        count("join")
        seen.append(parents)
        return parents

    def boom(parents: list[Any] | None = None) -> None:
        count("boom")
        raise RuntimeError("boom")

    def held(parents: list[Any] | None = None) -> str:
        count("held")
        gate.wait(30)
        return "held"

    def leaf(parents: list[Any] | None = None) -> str:
        count("leaf")
        return "leaf"

    def stuck(parents: list[Any] | None = None) -> str:
        # runs until its job is cancelled: the interrupt lands between two short waits
        count("stuck")
        try:
            while not gate.wait(0.05):
                pass
        except BaseException as exc:
            seen.append(type(exc).__name__)
            raise
        return "stuck"

    def boom_when_stuck(parents: list[Any] | None = None) -> None:
        while not runs.get("stuck"):
            gate.wait(0.05)
        count("boom")
        raise RuntimeError("boom")

    made = {fn.__name__: actor(fn) for fn in (seed, square, join, boom, held, leaf, stuck, boom_when_stuck)}
    return {**made, "seen": seen, "runs": runs, "gate": gate, "broker": broker}


def _diamond(a: dict[str, Any], broker: PostgresBroker, **options: Any) -> tuple[supervisor.Workflow, list[str]]:
    wf = supervisor.workflow("diamond", broker=broker, **options)
    s = wf.add(a["seed"].message(3))
    b = wf.add(a["square"].message(1), after=[s])
    c = wf.add(a["square"].message(2), after=[s])
    d = wf.add(a["join"].message(), after=[b, c])
    return wf, [s, b, c, d]


def test_a_diamonds_join_gets_both_results_in_order_and_runs_once(conn, acts):
    broker = acts["broker"]
    wf, (s, b, c, d) = _diamond(acts, broker)
    with in_process_worker(broker, ["wf"]):
        wf.send()
        assert wf.wait(30) == "succeeded"
    assert acts["seen"] == [[10, 11]]
    assert acts["runs"] == {"seed": 1, "square": 2, "join": 1}
    assert wf.results() == {s: 3, b: 10, c: 11, d: [10, 11]}
    # d started after both b and c ended
    ends = dict(conn.execute("SELECT id::text, finished_at FROM jobs WHERE id = ANY(%s::uuid[])", ([b, c],)).fetchall())
    started = scalar(conn, "SELECT started_at FROM jobs WHERE id = %s", (d,))
    assert started >= max(ends.values())
    shown = workflow_ops.show(conn, wf.id)
    assert shown["state"] == "succeeded" and [st["state"] for st in shown["steps"]] == ["succeeded"] * 4
    assert shown["steps"][3]["parents"] == [b, c]


def test_sent_in_a_transaction_that_rolls_back_nothing_runs(conn, acts, database_url):
    broker = acts["broker"]
    wf, _ = _diamond(acts, broker)
    with psycopg.connect(database_url) as c:
        with broker.transaction(c):
            wf.send()
        c.rollback()
    assert scalar(conn, "SELECT count(*) FROM workflows") == 0
    assert scalar(conn, "SELECT count(*) FROM jobs") == 0
    wf2, _ = _diamond(acts, broker)
    with psycopg.connect(database_url) as c:
        with broker.transaction(c):
            wf2.send()
        assert scalar(conn, "SELECT count(*) FROM jobs") == 0  # not before the commit
        c.commit()
    with in_process_worker(broker, ["wf"]):
        assert wf2.wait(30) == "succeeded"
    assert acts["seen"] == [[10, 11]]


def _states(conn: psycopg.Connection, wf: supervisor.Workflow) -> dict[str, str]:
    return {s["id"]: s["state"] for s in workflow_ops.show(conn, wf.id)["steps"]}


def test_cancel_rest_cancels_every_step_not_ended_and_says_why(conn, acts):
    broker = acts["broker"]
    wf = supervisor.workflow("policy", broker=broker)  # cancel_rest, the default
    root = wf.add(acts["seed"].message(1))
    bad = wf.add(acts["boom"].message(), after=[root])
    after_bad = wf.add(acts["leaf"].message(), after=[bad])
    other = wf.add(acts["leaf"].message(), after=[bad, root])
    independent = wf.add(acts["held"].message(), after=[root])
    after_independent = wf.add(acts["leaf"].message(), after=[independent])
    with in_process_worker(broker, ["wf"]):
        wf.send()
        wait_for(lambda: _states(conn, wf)[bad] == "failed", 30, message="the failing step")
        assert wf.wait(30) == "failed"  # the running independent step cancelled too
        acts["gate"].set()
    states = _states(conn, wf)
    assert states == {root: "succeeded", bad: "failed", after_bad: "cancelled", other: "cancelled",
                      independent: "cancelled", after_independent: "cancelled"}
    shown = workflow_ops.show(conn, wf.id)
    assert f"step {bad} (wft_boom) failed: RuntimeError: boom" in shown["reason"]
    reasons = {s["id"]: s["reason"] for s in shown["steps"]}
    assert reasons[after_independent].startswith(f"cancelled: step {bad}")
    assert "leaf" not in acts["runs"]


def test_continue_cancels_only_the_descendants(conn, acts):
    broker = acts["broker"]
    wf = supervisor.workflow("policy", broker=broker, on_failure="continue")
    root = wf.add(acts["seed"].message(1))
    bad = wf.add(acts["boom"].message(), after=[root])
    after_bad = wf.add(acts["leaf"].message(), after=[bad])
    side = wf.add(acts["leaf"].message(), after=[root])
    after_side = wf.add(acts["leaf"].message(), after=[side])
    with in_process_worker(broker, ["wf"]):
        wf.send()
        assert wf.wait(30) == "failed"
    assert _states(conn, wf) == {root: "succeeded", bad: "failed", after_bad: "cancelled", side: "succeeded",
                                 after_side: "succeeded"}
    assert acts["runs"]["leaf"] == 2


def test_cancel_and_retry_of_a_step_and_of_a_workflow(conn, acts):
    broker = acts["broker"]
    wf = supervisor.workflow("steer", broker=broker, on_failure="continue")
    root = wf.add(acts["seed"].message(2))
    slow = wf.add(acts["held"].message(), after=[root])
    below = wf.add(acts["leaf"].message(), after=[slow])
    side = wf.add(acts["square"].message(1), after=[root])
    with in_process_worker(broker, ["wf"]):
        wf.send()
        wait_for(lambda: acts["runs"].get("held") == 1 and _states(conn, wf)[side] == "succeeded", 30,
                 message="the held step running, the side one done")
        # the running step and its descendant: interrupted, cancelled
        assert workflow_ops.cancel(conn, wf.id, step=slow) == {"cancelled": 2, "interrupted": 1}
        assert wf.wait(30) == "cancelled"
        assert _states(conn, wf) == {root: "succeeded", slow: "cancelled", below: "cancelled", side: "succeeded"}
        # retry: the cancelled ones run again; the root and the side step keep their results
        acts["gate"].set()
        assert workflow_ops.retry(conn, wf.id) == {"retried": 2, "released": 1}
        assert wf.wait(30) == "succeeded"
        assert acts["runs"]["seed"] == 1 and acts["runs"]["square"] == 1 and acts["runs"]["leaf"] == 1
        # retry of one step and its descendants, though all succeeded
        assert workflow_ops.retry(conn, wf.id, step=slow)["retried"] == 2
        assert wf.wait(30) == "succeeded"
        assert acts["runs"]["leaf"] == 2 and acts["runs"]["seed"] == 1
        assert wf.results()[below] == "leaf"
        # a whole workflow's cancel: every step not ended
        wf2 = supervisor.workflow("whole", broker=broker)
        acts["gate"].clear()
        r = wf2.add(acts["held"].message())
        k = wf2.add(acts["leaf"].message(), after=[r])
        wf2.send()
        wait_for(lambda: acts["runs"].get("held") == 4, 30, message="the second workflow's root running")
        assert workflow_ops.cancel(conn, wf2.id) == {"cancelled": 2, "interrupted": 1}
        assert wf2.wait(30) == "cancelled"
        assert _states(conn, wf2) == {r: "cancelled", k: "cancelled"}
        acts["gate"].set()
    with pytest.raises(workflow_ops.WorkflowError, match="no workflow"):
        workflow_ops.cancel(conn, "00000000-0000-0000-0000-000000000000")
    with pytest.raises(workflow_ops.WorkflowError, match="not a workflow or step id"):
        workflow_ops.retry(conn, "nope")


def test_a_step_with_a_dedupe_key_and_a_step_whose_job_is_cancelled_fails_the_rest(conn, acts):
    broker = acts["broker"]
    wf = supervisor.workflow("keyed", broker=broker)
    root = wf.add(acts["seed"].message_with_options(args=(4,), dedupe_key="wf-keyed"))
    held = wf.add(acts["held"].message(), after=[root])
    below = wf.add(acts["leaf"].message(), after=[held])
    with in_process_worker(broker, ["wf"]):
        wf.send()
        wait_for(lambda: acts["runs"].get("held") == 1, 30, message="the held step running")
        from supervisor.admin import cancel_job
        assert cancel_job(conn, held)  # an operator's cancel of the job itself
        assert wf.wait(30) == "cancelled"
        acts["gate"].set()
    assert _states(conn, wf) == {root: "succeeded", held: "cancelled", below: "cancelled"}
    assert "cancelled by an operator" in workflow_ops.show(conn, wf.id)["reason"]


def test_a_step_whose_queue_is_flushed_ends_cancelled_and_the_policy_applies(conn, acts):
    # Broker.flush deletes job_queue's rows (no history row for a trigger) and cancels the
    # log's: either way the step ends cancelled, says why, and its workflow ends.
    broker = acts["broker"]
    wf = supervisor.workflow("flushed", broker=broker)
    root = wf.add(acts["seed"].message(1))
    below = wf.add(acts["leaf"].message(), after=[root])
    wf.send()  # no worker: the root waits in its queue
    broker.flush("wf")
    assert wf.wait(10) == "cancelled"
    assert _states(conn, wf) == {root: "cancelled", below: "cancelled"}
    shown = workflow_ops.show(conn, wf.id)
    assert shown["reason"] == f"step {root} (wft_seed) cancelled: its queue was flushed"
    assert shown["steps"][1]["reason"].startswith(f"cancelled: step {root}")


def test_cancel_rest_interrupts_the_running_steps(conn, acts):
    # A step fails for good while another runs: "cancel the rest" cancels that one's job too
    # (its process interrupts it), so the workflow ends without waiting for it.
    broker = acts["broker"]
    wf = supervisor.workflow("interrupt", broker=broker)
    root = wf.add(acts["seed"].message(1))
    running = wf.add(acts["stuck"].message(), after=[root])
    bad = wf.add(acts["boom_when_stuck"].message(), after=[root])
    below = wf.add(acts["leaf"].message(), after=[running])
    with in_process_worker(broker, ["wf"]):
        wf.send()
        assert wf.wait(30) == "failed"
        wait_for(lambda: acts["seen"] == ["JobCancelled"], 10, message="the running step interrupted")
    assert not acts["gate"].is_set()
    assert _states(conn, wf) == {root: "succeeded", running: "cancelled", bad: "failed", below: "cancelled"}
    reasons = {s["id"]: s["reason"] for s in workflow_ops.show(conn, wf.id)["steps"]}
    assert reasons[running].startswith(f"cancelled: step {bad} (wft_boom_when_stuck) failed")
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (running,)) == "cancelled"
    assert acts["runs"]["stuck"] == 1 and "leaf" not in acts["runs"]


def test_an_operators_cancel_interrupts_a_running_step(conn, acts):
    broker = acts["broker"]
    wf = supervisor.workflow("operator", broker=broker)
    running = wf.add(acts["stuck"].message())
    below = wf.add(acts["leaf"].message(), after=[running])
    with in_process_worker(broker, ["wf"]):
        wf.send()
        wait_for(lambda: acts["runs"].get("stuck") == 1, 30, message="the step running")
        assert workflow_ops.cancel(conn, wf.id) == {"cancelled": 2, "interrupted": 1}
        assert wf.wait(10) == "cancelled"
        wait_for(lambda: acts["seen"] == ["JobCancelled"], 10, message="the running step interrupted")
    assert _states(conn, wf) == {running: "cancelled", below: "cancelled"}
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (running,)) == "cancelled"


def test_a_big_fan_in_gets_every_result_in_order_gathered_near_its_end(conn, acts):
    # 700 parents: the join's count falls past 512 in some ack, which gathers the results so
    # far (migration 049's workflow_gather); its release reads only the rest.
    broker = acts["broker"]
    wf = supervisor.workflow("fan-in", broker=broker)
    root = wf.add(acts["seed"].message(0))
    mids = [wf.add(acts["square"].message(i), after=[root]) for i in range(700)]
    wf.add(acts["join"].message(), after=mids)
    with in_process_worker(broker, ["wf"]):
        wf.send()
        assert wf.wait(60) == "succeeded"
    assert acts["seen"] == [list(range(700))]
    assert scalar(conn, "SELECT count(*) FROM workflow_steps WHERE gathered IS NOT NULL") == 0


def test_a_release_after_a_gather_reads_the_parents_missing_then(conn, store_broker):
    # The gather and the release alone, in SQL: parents 1..3 of 5 succeeded at the gather
    # (one with JSON null), 4 and 5 after it; the join's argument has all five in order.
    act = dramatiq.actor(broker=store_broker, queue_name="wfg", actor_name="wfg_step")(lambda *a: None)
    wf = supervisor.workflow("gather", broker=store_broker)
    parents = [wf.add(act.message(i)) for i in range(5)]
    join = wf.add(act.message("j"), after=parents)
    wf.send()

    def succeed(ids: list[str], results: list[str]) -> None:
        conn.execute("UPDATE workflow_steps s SET state = 'succeeded', result = r.v::jsonb FROM unnest(%s::uuid[],"
                     " %s::text[]) AS r(id, v) WHERE s.id = r.id", (ids, results))
        conn.execute("UPDATE workflow_steps SET remaining = remaining - %s WHERE id = %s", (len(ids), join))

    succeed(parents[:3], ['"a"', "null", '{"b": 1}'])
    conn.execute("SELECT workflow_gather(ARRAY[%s]::uuid[])", (join,))
    assert conn.execute("SELECT gathered_missing FROM workflow_steps WHERE id = %s", (join,)).fetchone()[0] == [4, 5]
    succeed(parents[3:], ["4", '"e"'])
    assert scalar(conn, "SELECT workflow_release(ARRAY[%s]::uuid[])", (join,)) == 1
    args = scalar(conn, "SELECT args FROM jobs WHERE id = %s", (join,))
    assert args == ["j", ["a", None, {"b": 1}, 4, "e"]]
    assert conn.execute("SELECT gathered, gathered_missing FROM workflow_steps WHERE id = %s",
                        (join,)).fetchone() == (None, None)


def test_keyed_steps_their_limit_holds_across_steps_and_their_dedupe_key_refuses_a_second_job(conn, store_broker):
    # Released steps with a concurrency key (limit 1) never run two at once, across the steps
    # of one release; a step whose dedupe key a live job holds gets no job of its own. They
    # are log jobs with their keys (055): no job_queue row. A rate-limited step's job is
    # paced in the log (054) and runs too.
    broker = store_broker
    spans: dict[int, tuple[float, float]] = {}

    @dramatiq.actor(broker=broker, queue_name="wf", actor_name="wft_spanned", max_retries=0)
    def spanned(n: int, parents: list[Any] | None = None) -> int:
        began = time.monotonic()
        time.sleep(0.15)
        spans[n] = (began, time.monotonic())
        return n

    holder = broker.enqueue(dramatiq.Message(queue_name="wf-idle", actor_name="wft_spanned", args=(0,), kwargs={},
                                             options={"dedupe_key": "wf-dup"}))
    wf = supervisor.workflow("keyed-steps", broker=broker, on_failure="continue")
    root = wf.add(spanned.message(1))
    one = [wf.add(spanned.message_with_options(args=(i,), concurrency_key="wf-one"), after=[root])
           for i in range(10, 14)]
    dup = wf.add(spanned.message_with_options(args=(9,), dedupe_key="wf-dup"), after=[root])
    rated = wf.add(spanned.message_with_options(args=(20,), rate_limit="50/s", rate_limit_key="wf-rate"), after=[root])
    with in_process_worker(broker, ["wf"]):
        wf.send()
        wait_for(lambda: all(_states(conn, wf)[s] == "succeeded" for s in [*one, rated]), 30,
                 message="the keyed steps run")
    assert run_notes.most_at_once([spans[n] for n in range(10, 14)]) == 1 and sorted(spans) == [1, 10, 11, 12, 13, 20]
    assert scalar(conn, "SELECT count(*) FROM job_log WHERE id = %s AND flow_key = 'wf-rate'", (rated,)) >= 1
    shown = conn.execute("SELECT status, concurrency_key FROM jobs WHERE id = ANY(%s::uuid[])", (one,)).fetchall()
    assert shown == [("succeeded", "wf-one")] * 4
    # the dedupe key's holder is the one live job of it: the step wrote none
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE id = %s", (dup,)) == 0
    assert [str(r[0]) for r in conn.execute("SELECT id FROM jobs WHERE dedupe_key = 'wf-dup'")] == [holder.message_id]
    assert scalar(conn, "SELECT count(*) FROM job_queue WHERE id = ANY(%s::uuid[])", (one + [dup],)) == 0
    assert scalar(conn, "SELECT count(*) FROM job_log WHERE id = ANY(%s::uuid[]) AND flow_key = 'wf-one'",
                  (one,)) >= 4
    broker.flush("wf-idle")


def test_a_workflows_cancel_cancels_a_keyed_step_waiting_for_its_slot(conn, acts):
    # Two released steps of one concurrency key (limit 1): one runs, the other waits for the
    # slot (parked in the log, 055; 'waiting' in job_queue). The workflow's cancel cancels
    # both, interrupts the running one, and the waiting one never runs; the slot is freed.
    broker = acts["broker"]
    wf = supervisor.workflow("keyed-cancel", broker=broker)
    root = wf.add(acts["seed"].message(1))
    first = wf.add(acts["stuck"].message_with_options(concurrency_key="wf-slot"), after=[root])
    second = wf.add(acts["stuck"].message_with_options(concurrency_key="wf-slot"), after=[root])
    with in_process_worker(broker, ["wf"]):
        wf.send()
        wait_for(lambda: acts["runs"].get("stuck") == 1 and scalar(
            conn, "SELECT count(*) FROM jobs WHERE id = ANY(%s::uuid[]) AND status = 'waiting'", ([first, second],)) == 1,
            30, message="one step running, the other waiting for the slot")
        assert workflow_ops.cancel(conn, wf.id)["cancelled"] == 2
        assert wf.wait(10) == "cancelled"
        wait_for(lambda: acts["seen"] == ["JobCancelled"], 10, message="the running step interrupted")
        # (a workflow's cancel writes the done rows without the key: the workers' sweep, which
        # no in-process worker runs, frees the slot and drops the parked entry: slots.py)
        wait_for(lambda: conn.execute(slots.LOG_SWEEP_BLOCKED) and scalar(
            conn, "SELECT count(*) FROM job_concurrency WHERE key = 'wf-slot' AND job_id IS NOT NULL") == 0, 10,
            message="the slot freed")
        assert scalar(conn, "SELECT count(*) FROM job_blocked") == 0
        time.sleep(0.3)  # a hand-off would have started the waiting step by now
    assert acts["runs"]["stuck"] == 1
    assert _states(conn, wf) == {root: "succeeded", first: "cancelled", second: "cancelled"}
    assert conn.execute("SELECT DISTINCT status FROM jobs WHERE id = ANY(%s::uuid[])",
                        ([first, second],)).fetchall() == [("cancelled",)]
