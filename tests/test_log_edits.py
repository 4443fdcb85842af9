"""An operator's edit through the jobs view, and an operator's retry of a job archived in
job_history, leave the job in the log (migration 057): it passes through job_queue inside the
statement (where jobs_view_write applies the write) and comes back, with its keys, due now
into job_log or later into job_timers. job_queue keeps nothing; the job runs once, as edited."""

from __future__ import annotations

from collections.abc import Iterator

import dramatiq
import psycopg
import pytest

from supervisor import admin
from supervisor.broker import PostgresBroker
from tests.conftest import in_process_worker, scalar, wait_for

QUEUE = "edited"
ran: list[int] = []


@pytest.fixture
def broker(database_url: str) -> Iterator[PostgresBroker]:
    b = PostgresBroker(database_url, lease_seconds=30, poll_interval=0.2)

    @dramatiq.actor(broker=b, queue_name=QUEUE, actor_name="edit_record", max_retries=0)
    def edit_record(n: int) -> None:
        ran.append(n)

    @dramatiq.actor(broker=b, queue_name=QUEUE, actor_name="edit_keyed", max_retries=0, concurrency_key="k")
    def edit_keyed(n: int) -> None:
        ran.append(n)

    ran.clear()
    yield b
    b.close()


def live_rows(conn: psycopg.Connection, job_id: str) -> dict[str, int]:
    """Where the job's live rows are: job_queue, job_timers, the log (no outcome)."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM job_queue WHERE id = %(id)s),"
        " (SELECT count(*) FROM job_timers WHERE id = %(id)s),"
        " (SELECT count(*) FROM job_log l WHERE l.id = %(id)s"
        "   AND NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = l.seq AND d.day = l.day))",
        {"id": job_id}).fetchone()
    assert row is not None
    return dict(zip(("job_queue", "job_timers", "job_log"), row, strict=True))


def drain(broker: PostgresBroker) -> None:
    with in_process_worker(broker, [QUEUE], executor="own"):
        broker.join(QUEUE, timeout=10_000)


def test_an_edited_pending_job_stays_in_the_log_and_runs_once_as_edited(conn, broker) -> None:
    job = broker.actors["edit_record"].send(1)
    assert conn.execute("UPDATE jobs SET args = '[41]', priority = 3 WHERE id = %s", (job.message_id,)).rowcount == 1
    assert live_rows(conn, job.message_id) == {"job_queue": 0, "job_timers": 0, "job_log": 1}
    assert conn.execute("SELECT status, priority, args FROM jobs WHERE id = %s", (job.message_id,)).fetchall() == [
        ("pending", 3, [41])]
    drain(broker)
    assert ran == [41]
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (job.message_id,)) == "succeeded"
    # the first row's attempt ended 'retried' (the fence: a claim passes it over), the edited one ran
    assert conn.execute("SELECT status FROM job_done WHERE id = %s ORDER BY finished_at",
                        (job.message_id,)).fetchall() == [("retried",), ("succeeded",)]


def test_an_edit_that_delays_a_job_puts_it_in_the_timers_and_one_that_brings_it_forward_in_the_log(
        conn, broker) -> None:
    now, later = broker.actors["edit_record"].send(2), broker.actors["edit_record"].send_with_options(
        args=(3,), delay=3_600_000)
    assert live_rows(conn, later.message_id)["job_timers"] == 1
    conn.execute("UPDATE jobs SET run_at = now() + interval '1 hour' WHERE id = %s", (now.message_id,))
    conn.execute("UPDATE jobs SET run_at = now() - interval '1 second' WHERE id = %s", (later.message_id,))
    assert live_rows(conn, now.message_id) == {"job_queue": 0, "job_timers": 1, "job_log": 0}
    assert live_rows(conn, later.message_id) == {"job_queue": 0, "job_timers": 0, "job_log": 1}
    with in_process_worker(broker, [QUEUE], executor="own"):  # (a join would wait the hour)
        wait_for(lambda: scalar(conn, "SELECT status FROM jobs WHERE id = %s", (later.message_id,)) == "succeeded",
                 10, message="the job brought forward to run")
    assert ran == [3]
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (now.message_id,)) == "pending"


def test_an_edited_deduped_job_keeps_its_key(conn, broker) -> None:
    actor = broker.actors["edit_record"]
    job = actor.send_with_options(args=(4,), dedupe_key="edit-once")
    conn.execute("UPDATE jobs SET priority = 5 WHERE id = %s", (job.message_id,))
    assert live_rows(conn, job.message_id) == {"job_queue": 0, "job_timers": 0, "job_log": 1}
    assert scalar(conn, "SELECT dedupe_key FROM jobs WHERE id = %s AND status = 'pending'",
                  (job.message_id,)) == "edit-once"
    assert actor.send_with_options(args=(5,), dedupe_key="edit-once").message_id == job.message_id
    drain(broker)
    assert ran == [4]


def test_an_edited_concurrency_keyed_job_keeps_its_key_and_its_gate(conn, broker) -> None:
    actor = broker.actors["edit_keyed"]
    jobs = [actor.send(n) for n in (6, 7)]
    conn.execute("UPDATE jobs SET priority = 1 WHERE id = %s", (jobs[1].message_id,))
    assert live_rows(conn, jobs[1].message_id) == {"job_queue": 0, "job_timers": 0, "job_log": 1}
    assert conn.execute("SELECT flow_key, flow FROM job_log l WHERE id = %s AND NOT EXISTS"
                        " (SELECT 1 FROM job_done d WHERE d.seq = l.seq AND d.day = l.day)",
                        (jobs[1].message_id,)).fetchone() == ("k", {"c": 1})
    drain(broker)
    assert sorted(ran) == [6, 7]
    assert scalar(conn, "SELECT count(*) FROM job_concurrency WHERE job_id IS NOT NULL") == 0


def test_an_operator_s_retry_of_a_job_in_the_history_goes_to_the_log(conn, broker) -> None:
    # a job archived in job_history (as retention archives the log's failed jobs, or an
    # earlier version's job_queue did): the retry writes it back as it stood, into the log
    conn.execute("INSERT INTO jobs (queue, actor, args, status, attempts, max_attempts, finished_at, last_error)"
                 " VALUES (%s, 'edit_record', '[8]', 'failed', 1, 1, now(), 'boom')", (QUEUE,))
    job_id = str(scalar(conn, "SELECT id FROM job_history WHERE queue = %s", (QUEUE,)))
    assert admin.retry_job(conn, job_id)
    assert not admin.retry_job(conn, job_id)  # live now
    assert live_rows(conn, job_id) == {"job_queue": 0, "job_timers": 0, "job_log": 1}
    drain(broker)
    assert ran == [8]
    wait_for(lambda: scalar(conn, "SELECT status FROM jobs WHERE id = %s", (job_id,)) == "succeeded", 5,
             message="the retried job's outcome")


def test_an_operator_s_retry_of_a_keyed_log_job_keeps_its_limit_key(conn, broker) -> None:
    # A concurrency-keyed job cancelled in the log: its retry is appended holding its key and
    # limits, so its claim gates it as the first run's did.
    job = broker.actors["edit_keyed"].send(9)
    assert admin.cancel_job(conn, job.message_id)
    assert admin.retry_job(conn, job.message_id)
    assert conn.execute("SELECT flow_key, flow FROM job_log l WHERE id = %s AND NOT EXISTS"
                        " (SELECT 1 FROM job_done d WHERE d.seq = l.seq AND d.day = l.day)",
                        (job.message_id,)).fetchone() == ("k", {"c": 1})
    drain(broker)
    assert ran == [9]


@pytest.mark.parametrize("flow", [{}, {"c": 1}, {"w": 2}, {"r": 1.0, "b": 1}, {"q": 5}, {"c": 2, "w": 3, "q": 9},
                                  {"x": 1}])
def test_the_database_takes_back_what_a_producer_sends_to_the_log(conn, flow) -> None:
    # job_queue_to_log's rule (057's job_log_takes) and the producer's (logstore.log_limits)
    # are one rule written twice, in SQL and Python: they must agree on every limit letter
    import json

    from supervisor.broker import logstore

    assert scalar(conn, "SELECT job_log_takes('k', %s::jsonb)", (json.dumps(flow),)) == logstore.log_limits(
        json.dumps(flow))
