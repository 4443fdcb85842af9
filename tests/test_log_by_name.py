"""A job sent by actor name from a process that does not know the actor lives in the log
(migration 055): its row carries no max_attempts, and the worker that knows the actor fills
its budget in (the message's options, else its actor's, as job_queue's claim does) and runs
it once; if its actor has limits the worker keys it late, into the log again with its key
(every limit the log takes), as its producer would have had it known
the actor. job_queue gets no row of a job the log can hold."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
from dramatiq import Message

from supervisor.broker import PostgresBroker
from tests.conftest import in_process_worker, scalar, wait_for
from tests.run_notes import most_at_once

QUEUE = "by-name"


@pytest.fixture
def blind(database_url: str) -> Iterator[PostgresBroker]:
    """A producer that declares no actor (a web app sending by name, the API, the CLI)."""
    b = PostgresBroker(database_url)
    yield b
    b.close()


@pytest.fixture
def worker_broker(database_url: str) -> Iterator[PostgresBroker]:
    b = PostgresBroker(database_url)
    yield b
    b.close()


def by_name(producer: PostgresBroker, actor: str, *args: Any, **options: Any) -> str:
    return producer.enqueue(Message(queue_name=QUEUE, actor_name=actor, args=args, kwargs={},
                                    options=options)).message_id


def test_a_job_sent_by_name_lives_in_the_log_and_runs_once_on_the_worker_that_knows_it(conn, blind,
                                                                                      worker_broker):
    runs: list[int] = []

    @dramatiq.actor(broker=worker_broker, queue_name=QUEUE, actor_name="bn_record", max_retries=0)
    def record(n: int) -> None:
        runs.append(n)
        if n < 0:
            raise ValueError("no retry: the actor's budget is one attempt")

    ok = by_name(blind, "bn_record", 1)
    bad = by_name(blind, "bn_record", -1)
    twice = by_name(blind, "bn_record", -2, max_retries=1, min_backoff=10, max_backoff=10)  # the message's budget
    ids = [ok, bad, twice]
    assert scalar(conn, "SELECT count(*) FROM job_log WHERE id = ANY(%s::uuid[]) AND max_attempts IS NULL",
                  (ids,)) == 3
    shown = conn.execute("SELECT status, queue, actor, priority FROM jobs WHERE id = %s", (ok,)).fetchone()
    assert shown == ("pending", QUEUE, "bn_record", 0)
    with in_process_worker(worker_broker, [QUEUE]):
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE id = ANY(%s::uuid[])"
                                      " AND status IN ('succeeded', 'failed')", (ids,)) == 3, 30,
                 message="the three jobs to end")
    assert sorted(runs) == [-2, -2, -1, 1]
    assert dict(conn.execute("SELECT id::text, status FROM jobs WHERE id = ANY(%s::uuid[])", (ids,)).fetchall()) \
        == {ok: "succeeded", bad: "failed", twice: "failed"}
    assert scalar(conn, "SELECT count(*) FROM job_queue") == 0
    assert scalar(conn, "SELECT count(*) FROM job_history WHERE id = ANY(%s::uuid[])", (ids,)) == 0


def test_a_job_sent_by_name_of_an_actor_with_a_concurrency_limit_is_keyed_late_in_the_log(conn, blind,
                                                                                         worker_broker):
    spans: list[tuple[float, float]] = []
    lock = threading.Lock()

    @dramatiq.actor(broker=worker_broker, queue_name=QUEUE, actor_name="bn_one", max_retries=0,
                    concurrency_key="bn:{args[0]}")
    def one(key: str, n: int) -> None:
        began = time.monotonic()
        time.sleep(0.1)
        with lock:
            spans.append((began, time.monotonic()))

    ids = [by_name(blind, "bn_one", "a", n) for n in range(4)]
    assert scalar(conn, "SELECT count(*) FROM job_log WHERE id = ANY(%s::uuid[]) AND flow_key IS NULL", (ids,)) == 4
    with in_process_worker(worker_broker, [QUEUE], threads=4):
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE id = ANY(%s::uuid[]) AND status = 'succeeded'",
                                (ids,)) == 4, 30, message="the keyed jobs to end")
    assert len(spans) == 4 and most_at_once(spans) == 1
    assert conn.execute("SELECT DISTINCT concurrency_key, attempts FROM jobs WHERE id = ANY(%s::uuid[])",
                        (ids,)).fetchall() == [("bn:a", 1)]  # keyed; the claim that keyed it not counted
    assert scalar(conn, "SELECT count(*) FROM job_queue") == 0
    reasons = {r[0] for r in conn.execute("SELECT reason FROM job_events WHERE job_id = ANY(%s::uuid[])"
                                          " AND from_status = 'running' AND to_status = 'pending'", (ids,))}
    assert reasons == {"keyed by its actor's limits (its producer did not know them)"}
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM job_concurrency WHERE job_id IS NOT NULL") == 0, 10,
             message="every slot freed")


def test_a_job_sent_by_name_of_a_rate_limited_actor_is_keyed_late_in_the_log(conn, blind, worker_broker):
    runs: list[float] = []

    @dramatiq.actor(broker=worker_broker, queue_name=QUEUE, actor_name="bn_rated", max_retries=0,
                    rate_limit="100/s", rate_limit_key="bn-rated")
    def rated() -> None:
        runs.append(time.monotonic())

    job = by_name(blind, "bn_rated")
    with in_process_worker(worker_broker, [QUEUE]):
        wait_for(lambda: scalar(conn, "SELECT status FROM jobs WHERE id = %s", (job,)) == "succeeded", 30,
                 message="the rate-limited job to end")
    assert len(runs) == 1
    assert conn.execute("SELECT flow_key, attempts FROM jobs WHERE id = %s", (job,)).fetchone() == ("bn-rated", 1)
    assert scalar(conn, "SELECT count(*) FROM job_queue") == 0  # the log paces a rate (054)
