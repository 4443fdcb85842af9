"""Durable workflows (issue 41, item 3; migration 049): a diamond's join gets its parents'
results in order and runs once, after both; a workflow sent in a transaction that rolls
back runs nothing; the failure policies; cancel and retry of a workflow and of a step with
its descendants; in both stores (plain steps in the log, keyed or table ones in job_queue)."""

from __future__ import annotations

import threading
from typing import Any

import dramatiq
import psycopg
import pytest

import supervisor
from supervisor import workflow_ops
from supervisor.broker import PostgresBroker
from tests.conftest import in_process_worker, scalar, wait_for

STORES = [pytest.param("log", id="log"), pytest.param("table", id="table")]


@pytest.fixture(params=["log", "table"])
def store_broker(request: pytest.FixtureRequest, database_url: str):
    b = PostgresBroker(database_url, storage=request.param)
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

    made = {fn.__name__: actor(fn) for fn in (seed, square, join, boom, held, leaf)}
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
