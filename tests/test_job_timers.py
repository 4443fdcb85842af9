"""Delayed plain jobs and delayed retries of log jobs wait in job_timers (migration 051,
sql/timers.py) and the workers' claim promotes them into the log at their run_at
(job_log_claim_due, consuming/timer_floors.py): they run once, at their time, through the log's
leases and fence; the views, cancel, flush, an edit through the jobs view and the live-id
check know them; a pause holds them; under a pinned horizon the floored promotion reads a
few pages however many timers were promoted since the pin."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import dramatiq
import psycopg
import pytest

from supervisor import admin
from supervisor.broker import PostgresBroker
from supervisor.broker.consuming import timer_floors
from supervisor.broker.sql import joblog, timers
from tests.conftest import in_process_worker, plan_buffers, scalar, wait_for
from tests.supervisor_helpers import assert_exactly_once, log_producer

QUEUE = "timed"
runs: list[tuple[str, float]] = []  # (job id, time.time() at its start)
ran_once = threading.Event()


def rows(n: int, *, priority: int = 0, delay_ms: int = 0) -> dict[str, Any]:
    """TIMER_INSERT's parameters for n no-op messages due ``delay_ms`` from now."""
    return {"id": [str(uuid.uuid4()) for _ in range(n)], "queue": [QUEUE] * n, "actor": ["noop"] * n,
            "args": [json.dumps([i]) for i in range(n)], "kwargs": ["{}"] * n, "options": ["{}"] * n,
            "payload": [None] * n, "priority": [priority] * n, "max_attempts": [None] * n,
            "max_lease_losses": [None] * n, "message_timestamp": [None] * n, "delay_ms": delay_ms}


def add(conn: psycopg.Connection, n: int, **kw: Any) -> list[str]:
    params = rows(n, **kw)
    conn.execute(timers.TIMER_INSERT, params)
    return params["id"]


def claim_params(n: int, tfloor: datetime | None = None, *, owner: str = "timers-host:1:aaaaaa") -> dict[str, Any]:
    return {"queue": QUEUE, "n": n, "owner": owner, "lease_s": 30.0, "relaxed": False, "tfloor": tfloor,
            "tlimit": 1000}


def claim(conn: psycopg.Connection, n: int, tfloor: datetime | None = None) -> tuple[list[Any], int, Any]:
    """Claimed rows, how many timers the claim promoted, and how far it read."""
    got = conn.execute(timers.LOG_CLAIM_DUE, claim_params(n, tfloor)).fetchall()
    return ([r for r in got if r[0] is not None], got[0][timers.PROMOTED_COLUMN] if got else 0,
            got[0][timers.UPTO_COLUMN] if got else None)


def ids(taken: list[Any]) -> list[str]:
    return [str(r[3]) for r in taken]


def test_a_timer_waits_until_due_then_one_claim_promotes_it_and_the_next_takes_it(conn: psycopg.Connection) -> None:
    (later,) = add(conn, 1, delay_ms=60_000)
    (due,) = add(conn, 1, delay_ms=-10)
    assert conn.execute("SELECT status, attempts, run_at > now() FROM jobs WHERE id = %s",
                        (later,)).fetchone() == ("pending", 0, True)
    # the dashboard's counts read jobs_live: a timer not yet due is scheduled
    assert conn.execute("SELECT status, run_at > now() FROM jobs_live WHERE id = %s", (later,)).fetchone() == (
        "pending", True)
    taken, promoted, upto = claim(conn, 10)
    assert promoted == 1 and upto is not None
    # the promoting claim's own rows are mostly in the next window (its transaction's xid is
    # past the snapshot it reads with, unless a later one ended first), so the consumer
    # claims again at once when it promoted (claims.py)
    assert ids(taken or claim(conn, 10)[0]) == [due]
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (due,)) == "running"
    assert [str(r[0]) for r in conn.execute("SELECT id FROM job_timers")] == [later]
    assert claim(conn, 10)[:2] == ([], 0)  # the later one is not due: nothing moves


def test_priorities_hold_across_the_promotion(conn: psycopg.Connection) -> None:
    (low,) = add(conn, 1, delay_ms=-20)
    (high,) = add(conn, 1, delay_ms=-10, priority=5)
    with conn.transaction():  # promoted alone (a claim may take its own rows at once)
        assert scalar(conn, "SELECT promoted FROM job_timers_promote(%s, NULL, 10)", (QUEUE,)) == 2
    assert ids(claim(conn, 1)[0]) == [high]
    assert ids(claim(conn, 1)[0]) == [low]


def test_a_paused_queue_promotes_nothing(conn: psycopg.Connection) -> None:
    (job,) = add(conn, 1, delay_ms=-10)
    conn.execute("INSERT INTO queue_pauses (queue) VALUES (%s)", (QUEUE,))
    assert claim(conn, 10) == ([], 0, None)
    assert scalar(conn, "SELECT count(*) FROM job_timers WHERE id = %s", (job,)) == 1
    conn.execute("DELETE FROM queue_pauses")
    taken, promoted, _ = claim(conn, 10)
    assert promoted == 1 and ids(taken or claim(conn, 10)[0]) == [job]


def test_a_row_behind_the_floor_waits_for_the_full_read(conn: psycopg.Connection) -> None:
    upto = claim(conn, 10)[2]  # nothing due: read up to now
    (late,) = add(conn, 1, delay_ms=-60_000)  # a long transaction's: due a minute before the floor
    assert claim(conn, 10, upto - timedelta(seconds=1))[:2] == ([], 0)
    taken, promoted, _ = claim(conn, 10)
    assert promoted == 1 and ids(taken or claim(conn, 10)[0]) == [late]


def test_cancel_flush_edit_and_a_repeated_id_of_a_waiting_timer(conn: psycopg.Connection) -> None:
    cancelled, edited, flushed = add(conn, 3, delay_ms=60_000)
    assert admin.cancel_job(conn, cancelled)
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (cancelled,)) == "cancelled"
    assert conn.execute("SELECT from_status, to_status FROM job_events WHERE job_id = %s",
                        (cancelled,)).fetchall() == [("pending", "cancelled")]
    # an edit through the jobs view: the write applies (in job_queue, where the job passes
    # through) and the job waits in the timers again (057), as edited
    conn.execute("UPDATE jobs SET priority = 7 WHERE id = %s", (edited,))
    assert scalar(conn, "SELECT count(*) FROM job_queue WHERE id = %s", (edited,)) == 0
    assert conn.execute("SELECT status, priority, run_at > now() FROM job_timers WHERE id = %s",
                        (edited,)).fetchone() == ("pending", 7, True)
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE id = %s", (edited,)) == 1
    # the same id sent again while it waits: not written again, to the log or the timers
    again = rows(1)
    again["id"] = [flushed]
    conn.execute(joblog.LOG_INSERT_ONE, again)
    conn.execute(joblog.LOG_INSERT, again)
    conn.execute(timers.TIMER_INSERT, {**again, "delay_ms": 5})
    assert scalar(conn, "SELECT count(*) FROM job_log WHERE id = %s", (flushed,)) == 0
    assert conn.execute("SELECT i::text FROM job_ids_live(%s::uuid[]) AS i", ([flushed],)).fetchall() == [(flushed,)]
    assert scalar(conn, "SELECT run_at > now() + interval '30 seconds' FROM job_timers WHERE id = %s", (flushed,))
    conn.execute(timers.TIMER_FLUSH, {"queue": QUEUE})
    # (the edited one too: it waits in the timers, where the flush reaches it)
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE queue = %s AND status = 'pending'", (QUEUE,)) == 0


# The promoter's read alone (job_log_claim_due's first step): nothing due from the floor.
PROMOTE = "SELECT * FROM job_timers_promote(%s, %s, 1000)"


def test_under_a_pinned_horizon_the_floored_promotion_reads_a_few_pages(conn: psycopg.Connection,
                                                                        database_url: str) -> None:
    with psycopg.connect(database_url) as pin:
        pin.execute("SELECT txid_current()")  # vacuum and pruning remove nothing from here on
        reads = {}
        for rnd in range(1, 41):  # 4,000 timers promoted (and claimed) since the pin
            add(conn, 100, delay_ms=-1500)
            taken, promoted, upto = claim(conn, 1000)
            assert (promoted, len(taken) + len(claim(conn, 1000)[0])) == (100, 100)
            if rnd in (10, 40):
                floor = upto - timedelta(seconds=timer_floors.SLACK_SECONDS)
                reads[rnd] = (plan_buffers(conn, PROMOTE, (QUEUE, floor)), plan_buffers(conn, PROMOTE, (QUEUE, None)),
                              plan_buffers(conn, timers.LOG_CLAIM_DUE, claim_params(10, floor)),
                              plan_buffers(conn, timers.LOG_CLAIM_DUE, claim_params(10)))
    (floored_10, full_10, _, _), (floored_40, full_40, claim_floored, claim_full) = reads[10], reads[40]
    # the full read passes over every dead entry since the pin (the heap pages of 3,000 more
    # rows: consecutive entries share a page, a buffer hit each page); the floored one over
    # none of them: flat. (The whole claim adds the log's windows, whose reads vary with the
    # transactions other sessions of the server have running.)
    assert full_40 > full_10 + 30, reads
    assert floored_40 <= floored_10 + 2, reads
    assert claim_floored + 30 < claim_full, reads


@pytest.fixture
def broker(database_url: str, conn: psycopg.Connection) -> Iterator[PostgresBroker]:
    b = PostgresBroker(database_url, lease_seconds=30, poll_interval=5.0)

    @dramatiq.actor(broker=b, queue_name=QUEUE, actor_name="timed_record", max_retries=0)
    def timed_record() -> None:
        runs.append(("record", time.time()))
        ran_once.set()

    @dramatiq.actor(broker=b, queue_name=QUEUE, actor_name="timed_broken", max_retries=2, min_backoff=50,
                    max_backoff=50)
    def timed_broken() -> None:
        runs.append(("broken", time.time()))
        raise ValueError("always")

    @dramatiq.actor(broker=b, queue_name=QUEUE, actor_name="timed_later", max_retries=1, min_backoff=600_000,
                    max_backoff=600_000)
    def timed_later() -> None:
        raise ValueError("again in ten minutes")

    runs.clear()
    ran_once.clear()
    yield b
    b.close()


def test_a_delayed_job_waits_in_job_timers_and_runs_once_at_its_time(conn, broker) -> None:
    with in_process_worker(broker, [QUEUE], executor="own"):
        message = broker.actors["timed_record"].send_with_options(delay=400)
        due = scalar(conn, "SELECT extract(epoch FROM run_at) FROM job_timers WHERE id = %s", (message.message_id,))
        assert due is not None and scalar(conn, "SELECT count(*) FROM job_queue") == 0
        assert ran_once.wait(10)
        broker.join(QUEUE, timeout=10_000)
    assert [r[0] for r in runs] == ["record"]
    late = runs[0][1] - float(due)
    assert 0 <= late < 1.0, late  # not before its time; woken by its timer, not by the 5 s poll
    assert conn.execute("SELECT status FROM job_done WHERE id = %s", (message.message_id,)).fetchall() == [
        ("succeeded",)]
    assert scalar(conn, "SELECT count(*) FROM job_timers") == 0


def test_a_failing_log_job_s_retries_wait_in_job_timers(conn, broker) -> None:
    message = broker.actors["timed_broken"].send()
    with in_process_worker(broker, [QUEUE], executor="own"):
        wait_for(lambda: scalar(conn, "SELECT status FROM jobs WHERE id = %s", (message.message_id,)) == "failed",
                 20, message="the job to fail for good")
    assert len(runs) == 3  # max_retries=2
    assert [r[0] for r in conn.execute("SELECT status FROM job_done WHERE id = %s ORDER BY finished_at",
                                       (message.message_id,))] == ["retried", "retried", "failed"]
    assert conn.execute("SELECT attempt FROM job_done WHERE id = %s ORDER BY finished_at",
                        (message.message_id,)).fetchall() == [(1,), (2,), (3,)]
    assert scalar(conn, "SELECT attempts FROM jobs WHERE id = %s", (message.message_id,)) == 3
    assert scalar(conn, "SELECT count(*) FROM job_queue") + scalar(conn, "SELECT count(*) FROM job_timers") == 0
    assert [r[0] for r in conn.execute("SELECT to_status FROM job_events WHERE job_id = %s ORDER BY at",
                                       (message.message_id,))] == ["retryable", "retryable", "failed"]


def test_a_worker_killed_right_after_promoting_loses_nothing_and_runs_nothing_twice(conn, workers, database_url):
    w1 = workers(threads=4, lease=1, heartbeat=0.3)
    w1.wait_ready(conn, timeout=90)
    with log_producer(database_url, "tests", {"record": {}}) as producer:
        sent = producer.enqueue_many([producer.actors["record"].message(i, 1.5) for i in range(8)], delay=300)
    assert scalar(conn, "SELECT count(*) FROM job_timers") == len(sent)
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM job_timers") == 0, 30, interval=0.005,
             message="the timers to be promoted")
    os.kill(w1.pid, signal.SIGKILL)  # the promoted jobs claimed or pending in the log, none finished
    w1.proc.wait()
    workers(threads=8, lease=1, heartbeat=0.3)
    assert_exactly_once(conn, len(sent))


def test_the_floor_follows_the_reads_and_the_full_read_is_paced_by_its_cost(monkeypatch) -> None:
    floors, now, clock = timer_floors.TimerFloors(), datetime.now(UTC), [100.0]
    monkeypatch.setattr(timer_floors.time, "monotonic", lambda: clock[0])
    assert floors.params("q")["tfloor"] is None  # nothing read yet: from the start
    floors.read("q", now, full=True, took_s=0.05)  # a slow full read (a pin's dead entries)
    assert floors.params("q")["tfloor"] == now - timedelta(seconds=timer_floors.SLACK_SECONDS)
    floors.read("q", now + timedelta(seconds=1), full=False)
    floors.read("q", None, full=False)  # paused: read nothing
    assert floors.params("q")["tfloor"] == now + timedelta(seconds=1 - timer_floors.SLACK_SECONDS)
    clock[0] += timer_floors.SWEEP_SECONDS + 1
    assert floors.params("q")["tfloor"] is not None  # 0.05 s a read: not before 10 s (SWEEP_SHARE)
    clock[0] += 0.05 / timer_floors.SWEEP_SHARE
    assert floors.params("q")["tfloor"] is None


def test_a_workflow_s_cancel_cancels_a_step_whose_retry_waits_in_job_timers(conn, broker) -> None:
    import supervisor
    from supervisor import workflow_ops

    wf = supervisor.workflow("timed", broker=broker)
    step = wf.add(broker.actors["timed_later"].message())
    with in_process_worker(broker, [QUEUE], executor="own"):
        wf.send()
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM job_timers WHERE id = %s AND status = 'retryable'",
                                (step,)) == 1, 20,
                 message="the step's retry to wait in job_timers")
        # not taken for a running step (it would run at its run_at, the workflow cancelled)
        assert workflow_ops.cancel(conn, wf.id) == {"cancelled": 1, "interrupted": 0}
        assert wf.wait(30) == "cancelled"
    assert scalar(conn, "SELECT count(*) FROM job_timers") == 0
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (step,)) == "cancelled"
