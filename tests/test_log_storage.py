"""A broker with storage "log" (logstore.py) end to end, in one process against the real
server: what it sends goes to the log or to job_queue as the job needs, its workers run
both, and every outcome (success, failure, retry, requeue, release, cancel) is written
once, through LOG_FINISH for log rows, and read back through the jobs view."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import dramatiq
import psycopg
import pytest
from dramatiq.middleware import CurrentMessage

from supervisor import admin, error_groups
from supervisor.broker import PostgresBroker
from supervisor.broker.consuming.completer import Finish, ack_params, finish_params, successes_only
from tests.conftest import in_process_worker, scalar, wait_for

QUEUE = "logged"
ran: list[int] = []
started = threading.Event()
release = threading.Event()


@pytest.fixture
def broker(database_url: str, conn: psycopg.Connection) -> Iterator[PostgresBroker]:
    b = PostgresBroker(database_url, lease_seconds=30, poll_interval=0.2)

    @dramatiq.actor(broker=b, queue_name=QUEUE, actor_name="log_record", max_retries=0)
    def log_record(n: int) -> None:
        ran.append(n)

    @dramatiq.actor(broker=b, queue_name=QUEUE, actor_name="log_flaky", max_retries=1, min_backoff=10, max_backoff=10)
    def log_flaky(n: int) -> None:
        ran.append(n)
        if ran.count(n) == 1:
            raise RuntimeError(f"first try of {n}")

    @dramatiq.actor(broker=b, queue_name=QUEUE, actor_name="log_broken", max_retries=0)
    def log_broken() -> None:
        raise ValueError("always")

    @dramatiq.actor(broker=b, queue_name=QUEUE, actor_name="log_once", max_retries=0)
    def log_once(n: int) -> None:  # fails for good the first time, as a job no retry is allowed
        ran.append(n)
        if ran.count(n) == 1:
            raise RuntimeError(f"first try of {n}")

    @dramatiq.actor(broker=b, queue_name=QUEUE, actor_name="log_block", max_retries=0)
    def log_block() -> None:
        started.set()
        # Short waits: a cancel's interrupt (an async exception) lands between them; inside
        # one long wait it landed only when the wait ended, as the worker's stop gave up.
        for _ in range(200):
            if release.wait(0.05):
                break
        ran.append(-1)

    ran.clear()
    started.clear()
    release.clear()
    yield b
    release.set()
    b.close()


def job(conn: psycopg.Connection, job_id: str) -> tuple:
    return conn.execute("SELECT status, attempts, claimed_at <= started_at, started_at <= finished_at, last_error"
                        " FROM jobs WHERE id = %s", (job_id,)).fetchone()


def test_a_plain_job_goes_to_the_log_and_finishes_once(conn, broker) -> None:
    message = broker.actors["log_record"].send(7)
    assert scalar(conn, "SELECT count(*) FROM job_log WHERE id = %s", (message.message_id,)) == 1
    assert scalar(conn, "SELECT count(*) FROM job_queue") == 0
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (message.message_id,)) == "pending"
    with in_process_worker(broker, [QUEUE], executor="own"):
        broker.join(QUEUE, timeout=10_000)
    assert ran == [7]
    assert job(conn, message.message_id) == ("succeeded", 1, True, True, None)
    assert scalar(conn, "SELECT count(*) FROM job_lease") <= 1  # the last batch goes with the next beat


def test_every_kind_of_job_goes_to_the_log_and_the_order_of_a_batch_is_kept(conn, broker) -> None:
    actor = broker.actors["log_record"]
    # a fairness weight (056), a concurrency limit (053), a rate or a daily quota (054), a
    # dedupe key (052: job_keys): the log takes every one
    messages = [actor.message(1), actor.message_with_options(args=(2,), fairness_weight=2, dedupe_key="k"),
                actor.message(3), actor.message_with_options(args=(4,), dedupe_key="k"),
                actor.message_with_options(args=(5,), dedupe_key="d"), actor.message_with_options(args=(6,), dedupe_key="d")]
    sent = broker.enqueue_many(messages)
    assert [m.args for m in sent] == [(1,), (2,), (3,), (4,), (5,), (6,)]
    assert sent[3].message_id == sent[1].message_id  # the live job of its dedupe key
    assert sent[5].message_id == sent[4].message_id  # a key repeated in the batch: its first message
    assert scalar(conn, "SELECT count(*) FROM job_log") == 4
    assert scalar(conn, "SELECT dedupe_key FROM job_log WHERE id = %s", (sent[4].message_id,)) == "d"
    delayed = actor.send_with_options(args=(5,), delay=60_000)  # waits in job_timers (051)
    assert scalar(conn, "SELECT status FROM job_timers WHERE id = %s", (delayed.message_id,)) == "pending"
    assert scalar(conn, "SELECT count(*) FROM job_queue") == 0


def test_a_producer_s_transaction_decides(conn, broker, database_url) -> None:
    actor = broker.actors["log_record"]
    with psycopg.connect(database_url) as tx:
        with broker.transaction(tx):
            gone = actor.send(1)
        tx.rollback()
        with broker.transaction(tx):
            kept = actor.send(2)
        tx.commit()
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE id = %s", (gone.message_id,)) == 0
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE id = %s", (kept.message_id,)) == 1


def test_a_retry_waits_in_job_timers_and_runs_again_from_the_log(conn, broker) -> None:
    message = broker.actors["log_flaky"].send(3)
    with in_process_worker(broker, [QUEUE], executor="own"):
        wait_for(lambda: scalar(conn, "SELECT status FROM jobs WHERE id = %s", (message.message_id,)) == "succeeded",
                 10, message="the retry to succeed")
    assert ran == [3, 3]
    assert scalar(conn, "SELECT attempts FROM jobs WHERE id = %s", (message.message_id,)) == 2
    # both attempts in the log: the retry waited in job_timers, never in job_queue
    assert conn.execute("SELECT status FROM job_done ORDER BY finished_at").fetchall() == [("retried",), ("succeeded",)]
    assert scalar(conn, "SELECT count(*) FROM job_history") == 0
    events = conn.execute("SELECT to_status FROM job_events WHERE job_id = %s ORDER BY at",
                          (message.message_id,)).fetchall()
    assert events[0] == ("retryable",)


def test_a_failure_is_written_once_and_join_raises_it(conn, broker) -> None:
    message = broker.actors["log_broken"].send()
    # (JobFailed: this broker keeps no exceptions)
    with in_process_worker(broker, [QUEUE], executor="own"), pytest.raises(Exception, match="ValueError: always"):
        broker.join(QUEUE, timeout=10_000, fail_fast=True)
    status, attempts, _, _, error = job(conn, message.message_id)
    assert (status, attempts) == ("failed", 1) and "ValueError: always" in error
    assert [m.message_id for m in broker.dead_letters] == [message.message_id]
    assert scalar(conn, "SELECT error_type FROM job_events WHERE job_id = %s", (message.message_id,)) == "ValueError"


def test_an_operator_retries_a_job_that_ended_in_the_log(conn, broker) -> None:
    # A job that failed for good in the log (no retry allowed), and one cancelled there
    # before it ran: an operator's retry (the CLI, the API, the dashboard, an error group's
    # action: admin.retry_job) appends each to the log again; each runs and the jobs view
    # shows it once at every step. A second retry of a job that is not failed finds nothing.
    failing = broker.actors["log_once"].send(5)
    cancelled = broker.actors["log_record"].send(6)
    assert admin.cancel_job(conn, cancelled.message_id)
    with in_process_worker(broker, [QUEUE], executor="own"):
        wait_for(lambda: scalar(conn, "SELECT status FROM jobs WHERE id = %s", (failing.message_id,)) == "failed",
                 10, message="the job to fail")
        assert ran == [5]
        for message in (failing, cancelled):
            assert conn.execute("SELECT count(*) FROM jobs WHERE id = %s", (message.message_id,)).fetchone() == (1,)
            assert admin.retry_job(conn, message.message_id)
            assert not admin.retry_job(conn, message.message_id)  # pending now
        wait_for(lambda: conn.execute("SELECT array_agg(status ORDER BY id) FROM jobs WHERE id IN (%s, %s)",
                                      (failing.message_id, cancelled.message_id)).fetchone() == (["succeeded"] * 2,),
                 10, message="both jobs to run again")
    assert sorted(ran) == [5, 5, 6]
    assert job(conn, failing.message_id)[:2] == ("succeeded", 2)
    # the failed attempt's done row 'retried', the run after the retry's its own (in the log again)
    assert conn.execute("SELECT status FROM job_done WHERE id = %s ORDER BY finished_at",
                        (failing.message_id,)).fetchall() == [("retried",), ("succeeded",)]
    assert scalar(conn, "SELECT count(*) FROM job_history WHERE id = %s", (failing.message_id,)) == 0
    for message, was in ((failing, "failed"), (cancelled, "cancelled")):
        assert conn.execute("SELECT from_status, to_status FROM job_events WHERE job_id = %s"
                            " AND reason = 'retried by operator'", (message.message_id,)).fetchall() == [(was, "pending")]
        assert not admin.retry_job(conn, message.message_id)
    # A job failed in the log whose message was sent again (the same id) and waits: its
    # failed run is not retried beside it.
    again = broker.actors["log_once"].message(7)
    broker.enqueue(again)
    with in_process_worker(broker, [QUEUE], executor="own"):
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE id = %s AND status = 'failed'",
                                (again.message_id,)) == 1, 10, message="the job to fail")
    broker.enqueue(again)
    assert not admin.retry_job(conn, again.message_id)
    assert scalar(conn, "SELECT count(*) FROM job_queue WHERE id = %s", (again.message_id,)) == 0
    # The same in job_history: a failed row whose id is live again in job_queue stays (a
    # row written into job_queue itself: through the jobs view a live id is refused, 055).
    conn.execute("INSERT INTO jobs (id, queue, actor, status, finished_at) VALUES (%s, 'q', 'a', 'failed', now())",
                 (again.message_id,))
    conn.execute("INSERT INTO job_queue (id, queue, actor) VALUES (%s, 'q', 'a')", (again.message_id,))
    assert not admin.retry_job(conn, again.message_id)


def test_an_operator_s_retry_of_a_deduped_log_job_takes_its_key_again(conn, broker) -> None:
    # A deduped job failed for good in the log: the operator's retry appends it to the log
    # again holding its key (a send of the key then returns it), unless another live job
    # took the key meanwhile (then no retry: two live jobs would share a key).
    actor = broker.actors["log_once"]
    first = actor.send_with_options(args=(11,), dedupe_key="retry-me")
    with in_process_worker(broker, [QUEUE], executor="own"):
        wait_for(lambda: scalar(conn, "SELECT status FROM jobs WHERE id = %s", (first.message_id,)) == "failed",
                 10, message="the job to fail")
    assert admin.retry_job(conn, first.message_id)
    assert scalar(conn, "SELECT count(*) FROM job_queue") == 0
    assert actor.send_with_options(args=(12,), dedupe_key="retry-me").message_id == first.message_id
    with in_process_worker(broker, [QUEUE], executor="own"):
        wait_for(lambda: scalar(conn, "SELECT status FROM jobs WHERE id = %s", (first.message_id,)) == "succeeded",
                 10, message="the retried job to run")
    second = actor.send_with_options(args=(13,), dedupe_key="taken")
    with in_process_worker(broker, [QUEUE], executor="own"):
        wait_for(lambda: scalar(conn, "SELECT status FROM jobs WHERE id = %s", (second.message_id,)) == "failed",
                 10, message="the job to fail")
    other = broker.actors["log_record"].send_with_options(args=(14,), dedupe_key="taken")
    assert other.message_id != second.message_id  # the key was free: a new job holds it
    assert not admin.retry_job(conn, second.message_id)
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (second.message_id,)) == "failed"


def test_an_error_group_s_retry_reaches_the_failed_jobs_of_the_log(conn, broker) -> None:
    # The Errors page's action (and `POST /api/v1/errors/retry`): every job of the group
    # that failed for good in the log is matched and retried.
    sent = [broker.actors["log_broken"].send() for _ in range(2)]
    with in_process_worker(broker, [QUEUE], executor="own"):
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE actor = 'log_broken' AND status = 'failed'") == 2,
                 10, message="both jobs to fail")
    group = conn.execute("SELECT DISTINCT actor, error_type, error_where FROM job_events"
                         " WHERE error_type IS NOT NULL").fetchall()
    assert len(group) == 1 and group[0][:2] == ("log_broken", "ValueError")
    retried = error_groups.change_group(conn, "retry", error_groups.GroupKey(*group[0]), window_s=3600)
    assert (retried["matched"], retried["changed"], sorted(retried["ids"])) == (
        2, 2, sorted(m.message_id for m in sent))
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE actor = 'log_broken' AND status = 'pending'") == 2


def test_rows_given_back_unstarted_are_claimed_again_uncounted(conn, broker) -> None:
    actor = broker.actors["log_record"]
    sent = [actor.send(i) for i in range(3)]
    claimed = broker.claim(QUEUE, 3)
    assert len(claimed) == 3 and all(m.log_row is not None for m in claimed)
    assert broker.requeue(claimed) == 3
    with in_process_worker(broker, [QUEUE], executor="own"):
        broker.join(QUEUE, timeout=10_000)
    assert sorted(ran) == [0, 1, 2]
    assert [job(conn, m.message_id)[:2] for m in sent] == [("succeeded", 1)] * 3


def test_a_row_given_back_and_taken_again_at_once_by_this_process_is_held(conn, broker) -> None:
    """A row given back (requeue: appended again) can be claimed again by this process's
    next claim, on another thread, before the give-back's own bookkeeping has run: the new
    hold must survive it. Seen in a loaded CI run: the job given back was then held by no
    batch and no lease, and never ran."""
    first = broker.actors["log_record"].send(1)
    second = broker.actors["log_record"].send(2)
    running, given_back = broker.claim(QUEUE, 2)
    assert given_back.message_id == second.message_id
    taken: list = []
    claiming = threading.Thread(target=lambda: taken.extend(broker.claim(QUEUE, 1)))
    written = broker.batches.written

    def claimed_again_first(ids):  # the give-back has committed; its bookkeeping is next
        if given_back.message_id in ids and not claiming.is_alive() and not taken:
            claiming.start()
            wait_for(lambda: scalar(conn, "SELECT count(*) FROM job_lease WHERE %s = ANY(seqs)",
                                    (given_back.log_row.seq + 1,)), 10, message="the row claimed again")
        written(ids)

    broker.batches.written = claimed_again_first
    assert broker.requeue([given_back]) == 1
    claiming.join(10)
    broker.batches.written = written
    [again] = taken
    assert again.message_id == second.message_id and again.log_row.seq == given_back.log_row.seq + 1
    assert broker.batches.row(again.message_id) == again.log_row
    assert broker.leases.holds((again.message_id, again.attempts))
    broker.ack(running)
    broker.ack(again)
    assert broker.flush_acks(10)
    assert [job(conn, m.message_id)[:2] for m in (first, second)] == [("succeeded", 1)] * 2
    assert broker.leases.count() == 0 and not broker.batches.held()  # both batches ended
    broker.leases.heartbeat()  # an idle process's beat drops their lease rows (not their expiry)
    assert scalar(conn, "SELECT count(*) FROM job_lease") == 0


def test_a_lease_lost_is_released_elsewhere_and_the_late_ack_counts_nothing(conn, broker, database_url) -> None:
    message = broker.actors["log_record"].send(9)
    lost = PostgresBroker(database_url, owner="gone:1:aaaaaa", lease_seconds=0.1, pool_size=1)
    try:
        lost.actors.update(broker.actors)
        lost.declare_queue(QUEUE)
        [held] = lost.claim(QUEUE, 1)
        wait_for(lambda: scalar(conn, "SELECT bool_and(expires_at < now()) FROM job_lease"), 5,
                 message="its lease to run out (nothing renews it)")
        broker.leases.reap_margin = 0.0
        assert [r[0] for r in broker.leases.reap_expired()] == [message.message_id]
        with in_process_worker(broker, [QUEUE], executor="own"):
            broker.join(QUEUE, timeout=10_000)
        assert lost.completer.finish(conn, [Finish(held.message_id, held.attempts, "succeeded")]) == 0  # the fence
    finally:
        lost.close()
    assert ran == [9]
    assert job(conn, message.message_id)[:2] == ("succeeded", 2)
    assert conn.execute("SELECT status FROM job_done ORDER BY finished_at").fetchall() == [("released",),
                                                                                          ("succeeded",)]


def test_a_dead_owner_s_batches_go_back(conn, broker, database_url) -> None:
    message = broker.actors["log_record"].send(4)
    dead = PostgresBroker(database_url, owner="dead:1:aaaaaa", pool_size=1)
    try:
        dead.actors.update(broker.actors)
        dead.declare_queue(QUEUE)
        assert len(dead.claim(QUEUE, 1)) == 1
    finally:
        dead.close()
    assert broker.leases.release_owner("dead:1:aaaaaa") == [(message.message_id, "pending", "dead:1:aaaaaa")]
    with in_process_worker(broker, [QUEUE], executor="own"):
        broker.join(QUEUE, timeout=10_000)
    assert ran == [4]


def test_cancel_passes_over_a_pending_job_and_stops_a_running_one(conn, broker) -> None:
    pending = broker.actors["log_record"].send(1)
    assert admin.cancel_job(conn, pending.message_id)
    running = broker.actors["log_block"].send()
    with in_process_worker(broker, [QUEUE], executor="own"):
        assert started.wait(10)
        assert admin.cancel_job(conn, running.message_id)
        broker.join(QUEUE, timeout=10_000)
    assert ran == []  # neither ran to its end: the running one was interrupted
    assert job(conn, pending.message_id)[0] == job(conn, running.message_id)[0] == "cancelled"


def test_flush_drops_the_queue_s_pending_log_jobs(conn, broker) -> None:
    broker.actors["log_record"].send(1)
    broker.flush(QUEUE)
    with in_process_worker(broker, [QUEUE], executor="own"):
        broker.join(QUEUE, timeout=10_000)
    assert ran == []


def test_a_job_that_reads_its_message_sees_the_one_it_was_sent_as(conn, database_url) -> None:
    b = PostgresBroker(database_url, poll_interval=0.2)
    b.add_middleware(CurrentMessage())
    seen: list[tuple] = []

    @dramatiq.actor(broker=b, queue_name=QUEUE, actor_name="log_echo")
    def log_echo(*args, **kwargs) -> None:
        m = CurrentMessage.get_current_message()
        seen.append((m.message_id, m.args, m.kwargs, m.options.get("note")))

    try:
        message = log_echo.send_with_options(args=(1, "two"), kwargs={"k": [3]}, note="n")
        with in_process_worker(b, [QUEUE], executor="own"):
            b.join(QUEUE, timeout=10_000)
    finally:
        b.close()
    assert seen == [(message.message_id, (1, "two"), {"k": [3]}, "n")]


def test_the_old_storage_setting_is_ignored_and_said_once(conn, broker, database_url, monkeypatch, caplog) -> None:
    # A program written for storage "table" (SUPERVISOR_STORAGE, or storage= given) keeps
    # running: its jobs go where every job goes (the log), and one warning says to drop
    # the setting.
    from supervisor.broker import logstore

    monkeypatch.setattr(logstore, "_said_storage", [])
    monkeypatch.setenv("SUPERVISOR_STORAGE", "table")
    with caplog.at_level("WARNING", logger="supervisor.broker.logstore"):
        old = PostgresBroker(database_url, storage="table", lease_seconds=30, poll_interval=0.2)
        PostgresBroker(database_url).close()  # said once per process, not per broker
    assert [r.getMessage() for r in caplog.records] == [
        "storage 'table' is no longer a choice (every job the log takes lives in the log): the setting is ignored;"
        " remove storage="]
    dramatiq.actor(broker=old, queue_name=QUEUE, actor_name="log_record", max_retries=0)(ran.append)
    try:
        sent = old.actors["log_record"].send(2)
        assert scalar(conn, "SELECT count(*) FROM job_log WHERE id = %s", (sent.message_id,)) == 1
        with in_process_worker(old, [QUEUE], executor="own"):
            old.join(QUEUE, timeout=10_000)
        assert ran == [2]
    finally:
        old.close()


def test_a_job_given_up_unfinished_is_released_not_lost(conn, broker) -> None:
    """A job its process stopped without an outcome (fenced: say its lease was late) keeps
    its batch's lease row after the batch's other job is acked: the lease expires and the
    reaper releases the job, which runs again (a deleted lease would leave it nowhere)."""
    actor = broker.actors["log_record"]
    given_up, done = actor.send(1), actor.send(2)
    claimed = {m.message_id: m for m in broker.claim(QUEUE, 2)}
    actor.send(3)
    assert len({m.log_row.batch for m in claimed.values()}) == 1
    claimed[given_up.message_id].fenced = "lease lost"
    broker.ack(claimed[given_up.message_id])
    broker.ack(claimed[done.message_id])
    assert broker.flush_acks(5)
    [third] = broker.claim(QUEUE, 1)  # and one more outcome written: the batches ended go with it
    broker.ack(third)
    assert broker.flush_acks(5)
    seq = claimed[given_up.message_id].log_row.seq
    assert scalar(conn, "SELECT count(*) FROM job_lease WHERE %s = ANY(seqs)", (seq,)) == 1
    conn.execute("UPDATE job_lease SET expires_at = now() - interval '1 minute'")
    broker.leases.reap_margin = 0.0
    assert broker.leases.reap_expired() == [(given_up.message_id, "pending", broker.owner)]
    with in_process_worker(broker, [QUEUE], executor="own"):
        broker.join(QUEUE, timeout=10_000)
    assert ran == [1]
    assert job(conn, given_up.message_id)[:2] == ("succeeded", 2)


def test_a_message_sent_twice_while_live_runs_once(conn, broker) -> None:
    actor = broker.actors["log_record"]
    message = actor.message(5)
    broker.enqueue(message)
    broker.enqueue(message)
    assert broker.enqueue_many([message, actor.message(6)])[0] == message
    assert scalar(conn, "SELECT count(*) FROM job_log WHERE id = %s", (message.message_id,)) == 1
    with in_process_worker(broker, [QUEUE], executor="own"):
        broker.join(QUEUE, timeout=10_000)
    assert sorted(ran) == [5, 6]
    broker.enqueue(message)  # once finished, the id may run again (as job_queue's primary key allows)
    with in_process_worker(broker, [QUEUE], executor="own"):
        broker.join(QUEUE, timeout=10_000)
    assert sorted(ran) == [5, 5, 6]


def test_a_write_through_the_jobs_view_reaches_a_job_of_the_log(conn, broker) -> None:
    """An operator's UPDATE or DELETE through the jobs view applies to the log's job (moved
    through job_queue, where jobs_view_write applies it, and back: 057): an edited job
    waits in the log's timers, a deleted one is gone, a cancelled one is in the history;
    the claims pass its old log row over, and job_queue keeps nothing."""
    actor = broker.actors["log_record"]
    later, gone, cancelled = actor.send(1), actor.send(2), actor.send(3)
    assert conn.execute("UPDATE jobs SET run_at = now() + interval '1 hour', priority = 7 WHERE id = %s",
                        (later.message_id,)).rowcount == 1
    assert conn.execute("DELETE FROM jobs WHERE id = %s", (gone.message_id,)).rowcount == 1
    conn.execute("UPDATE jobs SET status = 'cancelled' WHERE id = %s", (cancelled.message_id,))
    assert conn.execute("SELECT status, priority, run_at > now() FROM job_timers WHERE id = %s",
                        (later.message_id,)).fetchone() == ("pending", 7, True)
    assert scalar(conn, "SELECT count(*) FROM job_queue") == 0
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE id = %s", (gone.message_id,)) == 0
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (cancelled.message_id,)) == "cancelled"
    assert conn.execute("SELECT id::text, status FROM jobs WHERE id = ANY(%s::uuid[]) ORDER BY 1",
                        ([later.message_id, gone.message_id, cancelled.message_id],)).fetchall() == sorted(
        [(later.message_id, "pending"), (cancelled.message_id, "cancelled")])
    assert broker.claim(QUEUE, 10) == []  # the log's rows passed over; the edited one is due in an hour


def test_a_stored_result_is_on_the_done_row(conn, database_url) -> None:
    from dramatiq.results import Results

    from supervisor.results import PostgresBackend

    b = PostgresBroker(database_url, poll_interval=0.2)
    backend = PostgresBackend(url=database_url)
    b.add_middleware(Results(backend=backend))

    @dramatiq.actor(broker=b, queue_name=QUEUE, actor_name="log_add", store_results=True)
    def log_add(x: int, y: int) -> int:
        return x + y

    try:
        message = log_add.send(20, 22)
        with in_process_worker(b, [QUEUE], executor="own"):
            assert message.get_result(backend=backend, block=True, timeout=10_000) == 42
            b.join(QUEUE, timeout=10_000)
    finally:
        b.close()
        backend.close()
    assert conn.execute("SELECT status, result FROM jobs WHERE id = %s",
                        (message.message_id,)).fetchone() == ("succeeded", 42)


def test_an_ack_that_meets_an_attempt_ended_by_another_writer_keeps_that_outcome(conn, broker) -> None:
    """Acks try the done rows without the fence first (LOG_ACK_FIRST: a batch of successes);
    one attempt of the batch already ended by another writer (a cancel here) makes that fail,
    and the fenced statement (LOG_ACK) then writes the others and leaves that one as it was."""
    actor = broker.actors["log_record"]
    cancelled, acked = actor.send(1), actor.send(2)
    claimed = {m.message_id: m for m in broker.claim(QUEUE, 2)}
    assert admin.cancel_job(conn, cancelled.message_id)
    for m in claimed.values():
        broker.ack(m)
    assert broker.flush_acks(5)
    assert job(conn, cancelled.message_id)[0] == "cancelled"
    assert job(conn, acked.message_id)[:2] == ("succeeded", 1)
    assert scalar(conn, "SELECT count(*) FROM job_done") == 2


def test_a_batch_of_successes_takes_the_ack_statement_and_any_other_outcome_the_full_one() -> None:
    """write_log_outcomes picks LOG_ACK only when every outcome is a success: the ack
    batcher's columns, or finish_params' of successes; a failure among them needs LOG_FINISH."""
    now = time.monotonic()
    assert successes_only(ack_params("w", ["a", "b"], [1, 1], [now, now], [now, now])["kinds"])
    ok = Finish("a", 1, "succeeded")
    assert successes_only(finish_params("w", [ok, Finish("b", 2, "succeeded")])["kinds"])
    for other in ("failed", "retry", "requeue", "limited"):
        assert not successes_only(finish_params("w", [ok, Finish("b", 1, other)])["kinds"]), other
