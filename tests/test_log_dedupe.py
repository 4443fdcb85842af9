"""Deduped jobs in the log (issue 38, migration 052, sql/jobkeys.py): a job whose only extra is
a dedupe key is written to job_log (or job_timers) and takes its key in job_keys; a send of a
key a live job holds returns that job's id and writes nothing, on every path (single, small
batch, COPY batch, delayed, racing producers, a caller's transaction), across stores (a
job_queue job's key dedupes a log send and the other way round); the key is free once the
job ended for good and kept through a retry and a release; the upkeep prunes ended keys; and
a claim never reads job_keys, so a pinned horizon costs it nothing."""

from __future__ import annotations

import os
import signal
import threading
import uuid
from collections.abc import Iterator

import dramatiq
import psycopg
import pytest

from supervisor import admin
from supervisor.broker import PostgresBroker
from supervisor.broker.sql import jobkeys
from supervisor.registry import Registration
from supervisor.worker.upkeep import Upkeep, UpkeepSettings
from tests.conftest import in_process_worker, plan_buffers, scalar, wait_for
from tests.supervisor_helpers import log_producer

QUEUE = "deduped"
ran: list[int] = []
release = threading.Event()


@pytest.fixture
def broker(database_url: str, conn: psycopg.Connection) -> Iterator[PostgresBroker]:
    b = PostgresBroker(database_url, lease_seconds=30, poll_interval=0.2)

    @dramatiq.actor(broker=b, queue_name=QUEUE, actor_name="dd_record", max_retries=0)
    def dd_record(n: int) -> None:
        ran.append(n)

    @dramatiq.actor(broker=b, queue_name=QUEUE, actor_name="dd_broken", max_retries=0)
    def dd_broken(n: int) -> None:
        raise ValueError("always")

    @dramatiq.actor(broker=b, queue_name=QUEUE, actor_name="dd_flaky", max_retries=1, min_backoff=60_000,
                    max_backoff=60_000)
    def dd_flaky(n: int) -> None:
        ran.append(n)
        raise RuntimeError("retried after a minute")

    @dramatiq.actor(broker=b, queue_name=QUEUE, actor_name="dd_keyed", max_retries=0, dedupe_key="actor-key")
    def dd_keyed(n: int) -> None:
        ran.append(n)

    ran.clear()
    release.clear()
    yield b
    release.set()
    b.close()


def count(conn: psycopg.Connection, table: str) -> int:
    return int(scalar(conn, f"SELECT count(*) FROM {table}"))


def send(broker: PostgresBroker, n: int, key: str, **options) -> str:
    return broker.actors["dd_record"].send_with_options(args=(n,), dedupe_key=key, **options).message_id


def drain(broker: PostgresBroker) -> None:
    with in_process_worker(broker, [QUEUE], executor="own"):
        broker.join(QUEUE, timeout=20_000)


def test_a_deduped_send_goes_to_the_log_and_a_duplicate_returns_the_live_job(conn, broker) -> None:
    first = send(broker, 1, "welcome:1")
    assert scalar(conn, "SELECT dedupe_key FROM job_log WHERE id = %s", (first,)) == "welcome:1"
    assert count(conn, "job_queue") == 0
    assert send(broker, 2, "welcome:1") == first
    assert count(conn, "job_log") == 1
    assert scalar(conn, "SELECT job_id::text FROM job_keys WHERE key = 'welcome:1'") == first
    # the views and the search by key show it, pending
    assert conn.execute("SELECT id::text, status FROM jobs WHERE dedupe_key = 'welcome:1'").fetchall() == [
        (first, "pending")]
    # an actor's dedupe_key option keys its messages too
    keyed = broker.actors["dd_keyed"].send(3).message_id
    assert broker.actors["dd_keyed"].send(4).message_id == keyed
    assert scalar(conn, "SELECT dedupe_key FROM job_log WHERE id = %s", (keyed,)) == "actor-key"
    drain(broker)
    assert sorted(ran) == [1, 3]
    assert scalar(conn, "SELECT dedupe_key FROM jobs WHERE id = %s", (first,)) == "welcome:1"  # finished, shown


@pytest.mark.parametrize("size", [5, 40])  # LOG_INSERT_KEYED (a small batch), the COPY path
def test_a_batch_writes_each_key_once_and_returns_the_live_holders(conn, broker, size) -> None:
    held = send(broker, -1, "k0")
    actor = broker.actors["dd_record"]
    messages = [actor.message_with_options(args=(i,), dedupe_key=f"k{i % 3}") for i in range(size)]
    messages += [actor.message(100 + i) for i in range(size)]  # plain ones beside them
    sent = broker.enqueue_many(messages)
    assert [m.args for m in sent] == [m.args for m in messages]
    assert all(sent[i].message_id == held for i in range(0, size, 3))  # k0: the live job
    assert all(sent[i].message_id == messages[1].message_id for i in range(1, size, 3))  # the batch's first
    assert all(sent[i].message_id == messages[2].message_id for i in range(2, size, 3))
    assert count(conn, "job_log") == 1 + 2 + size
    assert count(conn, "job_queue") == 0
    assert dict(conn.execute("SELECT key, job_id::text FROM job_keys").fetchall()) == {
        "k0": held, "k1": messages[1].message_id, "k2": messages[2].message_id}
    # a batch sent again (its connection lost after the commit: LOG_INSERT_KEYED_AGAIN) writes nothing
    again = broker.enqueue_many(messages)
    assert [m.message_id for m in again] == [m.message_id for m in sent]
    assert count(conn, "job_log") == 1 + 2 + size


def test_a_delayed_keyed_job_waits_in_job_timers_holding_its_key(conn, broker) -> None:
    first = send(broker, 1, "later", delay=60_000)
    assert scalar(conn, "SELECT dedupe_key FROM job_timers WHERE id = %s", (first,)) == "later"
    assert send(broker, 2, "later") == first
    assert send(broker, 3, "later", delay=1000) == first
    many = broker.enqueue_many([broker.actors["dd_record"].message_with_options(args=(4,), dedupe_key="later")],
                               delay=500)
    assert many[0].message_id == first
    assert count(conn, "job_timers") == 1 and count(conn, "job_log") == 0
    assert scalar(conn, "SELECT dedupe_key FROM jobs WHERE id = %s", (first,)) == "later"
    # promoted at its run_at, the log row keeps the key
    conn.execute("UPDATE job_timers SET run_at = now()")
    drain(broker)
    assert ran == [1]
    assert scalar(conn, "SELECT dedupe_key FROM job_log WHERE id = %s", (first,)) == "later"


@pytest.mark.parametrize("end", ["succeeded", "failed", "cancelled", "flushed", "flushed delayed"])
def test_the_key_is_free_once_the_job_ended_for_good(conn, broker, end) -> None:
    if end == "failed":
        first = broker.actors["dd_broken"].send_with_options(args=(1,), dedupe_key="k").message_id
    else:
        first = send(broker, 1, "k", **({"delay": 60_000} if end == "flushed delayed" else {}))
    if end == "cancelled":
        assert admin.cancel_job(conn, first)
    elif end.startswith("flushed"):
        broker.flush(QUEUE)
    else:
        drain(broker)
    assert scalar(conn, "SELECT count(*) FROM jobs_live WHERE id = %s", (first,)) == 0
    if not end.startswith("flushed"):
        assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (first,)) == end
    second = send(broker, 2, "k")
    assert second != first
    assert scalar(conn, "SELECT job_id::text FROM job_keys WHERE key = 'k'") == second
    assert send(broker, 3, "k") == second


def test_a_retry_keeps_the_key(conn, broker) -> None:
    first = broker.actors["dd_flaky"].send_with_options(args=(1,), dedupe_key="k").message_id
    with in_process_worker(broker, [QUEUE], executor="own"):
        wait_for(lambda: scalar(conn, "SELECT status FROM jobs WHERE id = %s", (first,)) == "retryable", 20,
                 message="the first attempt to fail and wait for its retry")
    assert scalar(conn, "SELECT dedupe_key FROM job_timers WHERE id = %s", (first,)) == "k"
    assert send(broker, 2, "k") == first
    assert broker.enqueue_many([broker.actors["dd_record"].message_with_options(args=(3,), dedupe_key="k")
                                for _ in range(40)])[0].message_id == first


def test_racing_producers_of_one_key_make_one_job(conn, broker, database_url) -> None:
    n = 8
    gate = threading.Barrier(n)
    ids: list[str] = []
    errors: list[BaseException] = []

    def producer(i: int) -> None:
        try:
            with psycopg.connect(database_url) as tx:
                with broker.transaction(tx):
                    gate.wait(10)
                    ids.append(send(broker, i, "race"))
                tx.commit()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=producer, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert len(ids) == n and len(set(ids)) == 1
    assert count(conn, "job_log") == 1
    assert scalar(conn, "SELECT id::text FROM job_log") == ids[0]


def test_a_rolled_back_send_frees_the_key_and_a_transaction_sees_its_own(conn, broker, database_url) -> None:
    with psycopg.connect(database_url) as tx:
        with broker.transaction(tx):
            gone = send(broker, 1, "k")
            assert send(broker, 2, "k") == gone  # its own live job, not yet committed
        tx.rollback()
    kept = send(broker, 3, "k")
    assert kept != gone
    assert count(conn, "job_log") == 1 and scalar(conn, "SELECT id::text FROM job_log") == kept


def test_a_job_queue_job_s_key_dedupes_a_log_send_and_the_other_way_round(conn, broker) -> None:
    # (rows of job_queue itself: through the jobs view an SQL insert goes to the log, 055)
    queued = str(scalar(conn, "INSERT INTO job_queue (queue, actor, dedupe_key) VALUES (%s, 'dd_record', 'q')"
                              " RETURNING id", (QUEUE,)))
    assert send(broker, 1, "q") == queued
    assert broker.enqueue_many([broker.actors["dd_record"].message_with_options(args=(2,), dedupe_key="q")
                                for _ in range(40)])[0].message_id == queued
    assert count(conn, "job_log") == 0
    logged = send(broker, 3, "l")
    conn.execute("INSERT INTO job_queue (queue, actor, dedupe_key) VALUES (%s, 'dd_record', 'l')", (QUEUE,))
    assert count(conn, "job_queue") == 1  # the log job holds 'l': the row was not written
    # a job_queue job with a concurrency key (it stays there) meets the log's key too
    c = broker.actors["dd_record"].send_with_options(args=(4,), dedupe_key="l", concurrency_key="c")
    assert c.message_id == logged
    assert count(conn, "job_queue") == 1


def test_a_pinned_horizon_leaves_nothing_the_claim_reads_growing(conn, broker, database_url) -> None:
    """Deduped jobs sent and drained under a session idle in transaction: none goes to
    job_queue, the claim's functions never name job_keys, and the log's claim reads as few
    buffers after 1,200 keyed jobs (the same 20 keys over and over, as cron fires) as after 200."""
    for name in ("job_log_claim", "job_log_claim_due", "job_timers_promote"):
        assert "job_keys" not in scalar(conn, "SELECT string_agg(prosrc, '') FROM pg_proc WHERE proname = %s",
                                        (name,))
    claim = ("SELECT * FROM job_log_claim(%(queue)s, 100, 'pin-test:1:a', 30.0)", {"queue": QUEUE})
    inserted = scalar(conn, "SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 'job_queue'")
    actor = broker.actors["dd_record"]
    with psycopg.connect(database_url) as pin:
        pin.execute("SELECT txid_current()")  # idle in transaction: the xmin horizon held from here
        buffers = []
        for rounds in (1, 5):
            for _ in range(rounds):
                broker.enqueue_many([actor.message_with_options(args=(i,), dedupe_key=f"cron:{i % 20}")
                                     for i in range(40)])
                for i in range(20):
                    send(broker, i, f"cron:{i}")
                drain(broker)
                assert scalar(conn, "SELECT count(*) FROM jobs_live") == 0
            buffers.append(plan_buffers(conn, *claim))
        assert scalar(conn, "SELECT backend_xid IS NOT NULL FROM pg_stat_activity WHERE pid = %s",
                      (pin.info.backend_pid,))
    assert len(ran) == 6 * 20
    assert buffers[1] <= buffers[0] + 2, buffers
    conn.execute("SELECT pg_stat_clear_snapshot()")
    assert scalar(conn, "SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 'job_queue'") == inserted


def test_the_upkeep_prunes_the_keys_of_ended_jobs(conn, broker) -> None:
    ended = [send(broker, i, f"e{i}") for i in range(5)]
    drain(broker)
    live = [send(broker, 10 + i, f"l{i}") for i in range(3)]
    queued = str(scalar(conn, "INSERT INTO jobs (queue, actor, dedupe_key) VALUES (%s, 'dd_record', 'q')"
                              " RETURNING id", (QUEUE,)))
    assert count(conn, "job_keys") == 9 and len(ended) == 5
    assert conn.execute(jobkeys.PRUNE_KEYS, {"after": None, "limit": 2}).fetchone() == (2, "e1")  # e0, e1 read
    registration = Registration(broker.pool, broker.owner, role="t", queues=[QUEUE])
    upkeep = Upkeep(broker, registration, settings=UpkeepSettings(prune_batch=2), state=lambda: "running")
    assert upkeep.prune()["keys"] == 3  # batches of 2, read through in key order
    assert dict(conn.execute("SELECT key, job_id::text FROM job_keys").fetchall()) == {
        **{f"l{i}": live[i] for i in range(3)}, "q": queued}
    assert send(broker, 20, "e0") not in ended  # a pruned key is taken anew


def test_a_job_killed_mid_run_keeps_its_key_until_it_ends(conn, workers, database_url) -> None:
    w1 = workers(threads=2, lease=1, heartbeat=0.3)
    w1.wait_ready(conn, timeout=90)
    with log_producer(database_url, "tests", {"record": {}}) as producer:
        def again() -> str:
            return producer.actors["record"].send_with_options(args=(1, 1.5), dedupe_key="killed").message_id

        first = again()
        assert scalar(conn, "SELECT count(*) FROM job_log WHERE id = %s", (first,)) == 1
        wait_for(lambda: scalar(conn, "SELECT status FROM jobs WHERE id = %s", (first,)) == "running", 30,
                 message="the job to run")
        os.kill(w1.pid, signal.SIGKILL)
        w1.proc.wait()
        assert again() == first  # running, its owner dead: its lease not yet expired
        w2 = workers(threads=2, lease=1, heartbeat=0.3)
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM job_done WHERE id = %s AND status = 'released'",
                                (first,)), 30, message="the reaper to release the killed job")
        if scalar(conn, "SELECT status FROM jobs WHERE id = %s", (first,)) != "succeeded":
            assert again() == first  # released: appended again, same job, same key
        wait_for(lambda: scalar(conn, "SELECT status FROM jobs WHERE id = %s", (first,)) == "succeeded", 30,
                 message="the job to run again and succeed: " + str(conn.execute(
                     "SELECT status, attempt, owner, last_error FROM job_done WHERE id = %s", (first,)).fetchall())
                 + w2.stderr()[-2000:])
        assert scalar(conn, "SELECT count(*) FROM job_done WHERE id = %s AND status = 'succeeded'", (first,)) == 1
        assert scalar(conn, "SELECT count(*) FROM test_results WHERE job_id = %s", (first,)) == 1
        fresh = again()
        assert fresh != first
        assert uuid.UUID(fresh)
