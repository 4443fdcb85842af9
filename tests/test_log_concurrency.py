"""Jobs whose key carries a concurrency limit alone live in the log (migration 053,
sql/slots.py): the claim gives each a slot of its own key or parks it in job_blocked, and a
job's end hands its slot to the key's oldest parked job. Real worker processes on the real
database: the limits hold across two processes, first in first out per key, a parked job
starts once the running one ends however it ends, a SIGKILLed worker's job runs again
within the limit, a parked job cancels, the sweep closes the claim's one open window, and
under a pinned horizon the claim's reads stay flat."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from supervisor import admin
from supervisor.broker import PostgresBroker
from supervisor.broker.sql import joblog, slots, timers
from tests.conftest import plan_buffers, scalar, wait_for
from tests.run_notes import most_at_once
from tests.supervisor_helpers import log_producer

QUEUE = "keyed"
ACTORS = "tests.keyed_actors"
# the stand-ins a producer needs to key the messages as the workers' actors are keyed
OPTIONS: dict[str, dict[str, Any]] = {
    "one_at_a_time": {"max_retries": 0, "concurrency_key": "acct:{kwargs[account]}"},
    "three_at_a_time": {"max_retries": 0, "concurrency_limit": 3, "concurrency_key": "three"},
    "retried_once": {"max_retries": 1, "min_backoff": 300, "max_backoff": 300,
                     "concurrency_key": "acct:{kwargs[account]}"},
}


@contextmanager
def producer(database_url: str) -> Iterator[PostgresBroker]:
    with log_producer(database_url, QUEUE, OPTIONS) as p:
        yield p


def fleet(workers, conn, n: int = 2, threads: int = 4, **kw: Any) -> list:
    procs = [workers(queues=QUEUE, actors=ACTORS, threads=threads, extra_env={"SUPERVISOR_NODE_NAME": f"node-{i}"},
                     **kw) for i in range(n)]
    for p in procs:
        p.wait_ready(conn)
    return procs


def runs(conn, tag: str) -> list[tuple]:
    """(n, started, finished) of each run of ``tag``, in start order."""
    return conn.execute("SELECT n, started, finished FROM test_results WHERE tag = %s ORDER BY started, id",
                        (tag,)).fetchall()


def ended(conn, count: int, timeout: float = 60) -> None:
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE queue = %s AND status IN ('succeeded', 'failed',"
                                  " 'cancelled')", (QUEUE,)) >= count, timeout, message=f"{count} keyed jobs to end")


def settled(conn) -> None:
    """Nothing holds a slot and nothing is parked once every job ended."""
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM job_concurrency WHERE job_id IS NOT NULL") == 0, 10,
             message="every slot freed")
    assert scalar(conn, slots.LOG_PARKED, {"queue": QUEUE}) == 0


def test_a_concurrency_keyed_job_is_appended_to_the_log_with_its_key(conn, database_url) -> None:
    with producer(database_url) as p:
        m = p.actors["one_at_a_time"].send(account="a", n=1)
        d = p.actors["one_at_a_time"].send_with_options(kwargs={"account": "a", "n": 2}, delay=60_000)
    assert conn.execute("SELECT flow_key, flow, flow_held FROM job_log WHERE id = %s", (m.message_id,)).fetchall() == [
        ("acct:a", {"c": 1}, None)]
    assert scalar(conn, "SELECT count(*) FROM job_queue WHERE id = %s", (m.message_id,)) == 0
    # shown pending with its key; a delayed one waits in job_timers with its key and limits
    assert conn.execute("SELECT status, concurrency_key, flow_key FROM jobs WHERE id = %s",
                        (m.message_id,)).fetchall() == [("pending", "acct:a", "acct:a")]
    assert conn.execute("SELECT status, flow_key, flow FROM job_timers WHERE id = %s",
                        (d.message_id,)).fetchall() == [("pending", "acct:a", {"c": 1})]
    assert scalar(conn, "SELECT count(*) FROM job_queue") == 0


def test_limits_hold_across_two_workers_first_in_first_out_per_key(conn, database_url, workers) -> None:
    fleet(workers, conn)
    accounts, per_account, threes = ("a", "b", "c"), 8, 15
    with producer(database_url) as p:
        one, three = p.actors["one_at_a_time"], p.actors["three_at_a_time"]
        p.enqueue_many([one.message(account=a, n=i) for i in range(per_account) for a in accounts]
                       + [three.message(n=i, sleep_s=0.05) for i in range(threes)])
    ended(conn, len(accounts) * per_account + threes)
    for a in accounts:
        spans = runs(conn, a)
        assert [n for n, _, _ in spans] == list(range(per_account)), a  # first in, first out
        assert most_at_once([(s, e) for _, s, e in spans]) == 1, a
    assert most_at_once([(s, e) for _, s, e in runs(conn, "three")]) == 3  # held, and used (8 threads)
    # every job ran from the log, none from job_queue
    assert scalar(conn, "SELECT count(*) FROM job_done WHERE status = 'succeeded' AND flow_key IS NOT NULL") == \
        len(accounts) * per_account + threes
    assert scalar(conn, "SELECT count(*) FROM job_queue") == 0
    settled(conn)


@pytest.mark.parametrize("how", ["failure", "cancel", "retry"])
def test_a_parked_job_starts_once_the_running_one_ends(conn, database_url, workers, how) -> None:
    fleet(workers, conn, n=1)
    with producer(database_url) as p:
        one = p.actors["one_at_a_time"]
        if how == "retry":
            first = p.actors["retried_once"].send(account="a", n=0)
        else:
            first = one.send(account="a", n=0, sleep_s=30 if how == "cancel" else 1.0, fail=how == "failure")
        wait_for(lambda: runs(conn, "a"), 20, message="the first job to start")
        second = one.send(account="a", n=1)
        wait_for(lambda: scalar(conn, "SELECT status FROM jobs WHERE id = %s", (second.message_id,)) == "waiting",
                 10, message="the second job to be parked")
        if how == "cancel":
            assert admin.cancel_job(conn, first.message_id)
        wait_for(lambda: scalar(conn, "SELECT status FROM jobs WHERE id = %s", (second.message_id,)) == "succeeded",
                 20, message="the parked job to run")
    spans = runs(conn, "a")
    first_end = scalar(conn, "SELECT max(finished_at) FROM job_done WHERE id = %s AND status <> 'requeued'",
                       (first.message_id,))
    second_start = next(s for n, s, _ in spans if n == 1)
    if how == "retry":  # the retry gave the slot up for its backoff: the parked job ran in it
        assert [n for n, _, _ in spans][:2] == [0, 1]
        ended(conn, 2)
        assert [n for n, _, _ in runs(conn, "a")] == [0, 1, 0]
    else:
        assert second_start >= first_end
        assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (first.message_id,)) == \
            {"failure": "failed", "cancel": "cancelled"}[how]
    settled(conn)


def test_a_killed_workers_keyed_job_runs_again_holding_its_slot(conn, database_url, workers) -> None:
    (w1,) = fleet(workers, conn, n=1, lease=1, heartbeat=0.3)
    with producer(database_url) as p:
        one = p.actors["one_at_a_time"]
        held = one.send(account="k", n=0, sleep_s=3)
        wait_for(lambda: runs(conn, "k"), 20, message="the first job to start")
        rest = [one.send(account="k", n=i) for i in (1, 2)]
    wait_for(lambda: scalar(conn, slots.LOG_PARKED, {"queue": QUEUE}) == 2, 10, message="two jobs parked")
    os.kill(w1.pid, signal.SIGKILL)
    w1.proc.wait()
    fleet(workers, conn, n=1, lease=1, heartbeat=0.3)
    ended(conn, 3)
    spans = runs(conn, "k")
    assert [n for n, _, _ in spans] == [0, 0, 1, 2]  # released, it ran again first: it kept its slot
    finished = [(s, e) for _, s, e in spans[1:]]
    assert most_at_once(finished) == 1
    assert spans[0][2] is None  # the killed run never finished
    assert [s for s, in conn.execute("SELECT status FROM job_done WHERE id = %s ORDER BY finished_at",
                                     (held.message_id,))] == ["released", "succeeded"]
    assert all(scalar(conn, "SELECT status FROM jobs WHERE id = %s", (m.message_id,)) == "succeeded" for m in rest)
    settled(conn)


def test_a_parked_job_cancels(conn, database_url, workers) -> None:
    fleet(workers, conn, n=1)
    with producer(database_url) as p:
        one = p.actors["one_at_a_time"]
        one.send(account="c", n=0, sleep_s=1.0)
        wait_for(lambda: runs(conn, "c"), 20, message="the first job to start")
        parked = one.send(account="c", n=1)
        one.send(account="c", n=2)
    wait_for(lambda: scalar(conn, slots.LOG_PARKED, {"queue": QUEUE}) == 2, 10, message="two jobs parked")
    assert admin.cancel_job(conn, parked.message_id)
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (parked.message_id,)) == "cancelled"
    assert conn.execute("SELECT from_status, to_status FROM job_events WHERE job_id = %s ORDER BY id",
                        (parked.message_id,)).fetchall() == [("pending", "waiting"), ("waiting", "cancelled")]
    assert scalar(conn, "SELECT count(*) FROM job_blocked WHERE id = %s", (parked.message_id,)) == 0
    ended(conn, 3)
    assert [n for n, _, _ in runs(conn, "c")] == [0, 2]
    settled(conn)


def log_rows(n: int, key: str, *, limit: int = 1) -> dict[str, Any]:
    """LOG_INSERT_KEYED's parameters for n no-op messages of one key."""
    return {"id": [str(uuid.uuid4()) for _ in range(n)], "queue": [QUEUE] * n, "actor": ["noop"] * n,
            "args": ["[]"] * n, "kwargs": ["{}"] * n, "options": ["{}"] * n, "payload": [None] * n,
            "priority": [0] * n, "max_attempts": [None] * n, "max_lease_losses": [None] * n,
            "message_timestamp": [None] * n, "flow_key": [key] * n, "flow": [json.dumps({"c": limit})] * n}


def claim_params(n: int) -> dict[str, Any]:
    return {"queue": QUEUE, "n": n, "owner": "keyed-host:1:aaaaaa", "lease_s": 30.0, "relaxed": False,
            "tfloor": None, "tlimit": 1000}


def claim(conn, n: int) -> list[tuple]:
    return [r for r in conn.execute(timers.LOG_CLAIM_DUE, claim_params(n)).fetchall() if r[0] is not None]


# The ends of a claim's batch as the worker's ack writes them (LOG_ACK's done rows: the key
# from the lease), in one statement.
ACK_ALL = """
INSERT INTO job_done (seq, day, id, queue, actor, created_at, status, attempt, flow_key, flow_slot)
SELECT l.seq, l.day, l.id, l.queue, l.actor, l.created_at, 'succeeded', l.attempts + 1, x.keys[u.i], x.slots[u.i]
  FROM job_lease x CROSS JOIN LATERAL unnest(x.seqs, x.days) WITH ORDINALITY AS u(seq, day, i)
  JOIN job_log l ON l.seq = u.seq AND l.day = u.day
 WHERE NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = l.seq AND d.day = l.day)
"""


def ack_params(taken: list[tuple], owner: str = "keyed-host:1:aaaaaa") -> dict[str, Any]:
    """joblog.LOG_ACK's parameters for claimed rows (the worker's ack of their successes)."""
    n = len(taken)
    return {"seqs": [r[1] for r in taken], "days": [r[2] for r in taken], "ids": [r[3] for r in taken],
            "attempts": [r[7] for r in taken], "progress": [None] * n, "started_us": [0] * n, "ended_us": [0] * n,
            "batches": [r[0] for r in taken], "queues": [r[4] for r in taken], "actors": [r[5] for r in taken],
            "created": [r[14] for r in taken], "results": [None] * n, "owner": owner, "ended": []}


def test_the_sweep_hands_a_slot_freed_while_a_claim_parked(conn, database_url, workers) -> None:
    """The one window the claim's locks leave: a slot row being freed (locked by the end that
    frees it) is passed over by the claim's SKIP LOCKED, which parks its row; the end, not
    seeing the row parked yet, frees the slot. The upkeep's sweep hands it within a second."""
    conn.execute(slots.LOG_INSERT_KEYED, log_rows(1, "race"))
    (first,) = claim(conn, 10)
    with psycopg.connect(database_url) as ender:
        # the end of the first job, its slot row locked and not yet freed
        ender.execute("SELECT 1 FROM job_concurrency WHERE key = 'race' FOR UPDATE")
        conn.execute(slots.LOG_INSERT_KEYED, log_rows(1, "race"))
        assert claim(conn, 10) == []  # the slot row locked: parked
        ender.execute("UPDATE job_concurrency SET job_id = NULL, freed_at = now() WHERE key = 'race'")
        ender.execute("INSERT INTO job_done (seq, day, id, queue, actor, created_at, status, attempt)"
                      " SELECT seq, day, id, queue, actor, created_at, 'succeeded', 1 FROM job_log"
                      " WHERE seq = %s AND day = %s", (first[1], first[2]))
    assert scalar(conn, slots.LOG_PARKED, {"queue": QUEUE}) == 1  # a parked row behind a free slot
    assert scalar(conn, slots.LOG_SWEEP_BLOCKED) == 1
    assert scalar(conn, slots.LOG_PARKED, {"queue": QUEUE}) == 0
    (handed,) = claim(conn, 10)
    assert str(scalar(conn, "SELECT job_id FROM job_concurrency WHERE key = 'race'")) == handed[3]
    assert scalar(conn, slots.LOG_SWEEP_BLOCKED) == 0

    # the same window with a worker running: its upkeep's sweep hands the slot in about a second
    conn.execute(ACK_ALL)
    with psycopg.connect(database_url) as ender:
        ender.execute("SELECT 1 FROM job_concurrency WHERE key = 'race' FOR UPDATE")
        conn.execute(slots.LOG_INSERT_KEYED, {**log_rows(1, "race"), "actor": ["one_at_a_time"],
                                              "kwargs": [json.dumps({"account": "race", "n": 7})]})
        assert claim(conn, 10) == []
        ender.execute("UPDATE job_concurrency SET job_id = NULL, freed_at = now() WHERE key = 'race'")
    fleet(workers, conn, n=1)
    started = time.monotonic()
    wait_for(lambda: runs(conn, "race"), 10, message="the parked job to run")
    assert time.monotonic() - started < 2 * slots.SWEEP_SECONDS + 1.0


def test_under_a_pinned_horizon_the_claim_reads_stay_flat(conn, database_url) -> None:
    """A stream of keyed jobs (20 keys, limit 1): each round appends 5 jobs a key, claims
    (one a key runs, the rest park), and acks, which hands each slot to its key's oldest
    parked job. Under a pin the claim reads only its window and one key's slot rows per
    keyed row, and a hand-off reads its key's parked rows from the key's floor: the reads
    stay flat as the dead rows pile up."""
    keys = [f"k{i}" for i in range(20)]
    reads: dict[int, tuple[int, int]] = {}
    with psycopg.connect(database_url) as pin:
        pin.execute("SELECT txid_current()")  # vacuum and pruning remove nothing from here on
        for rnd in range(1, 51):
            for k in keys:
                conn.execute(slots.LOG_INSERT_KEYED, log_rows(5, k))
            claimed = plan_buffers(conn, timers.LOG_CLAIM_DUE, claim_params(100)) if rnd in (15, 50) else 0
            taken = claim(conn, 100)
            assert 0 < len(taken) <= len(keys)  # one a key at most: the rest parked
            if rnd in (15, 50):  # the worker's ack of them, each end handing its slot on
                reads[rnd] = (claimed, plan_buffers(conn, joblog.LOG_ACK, ack_params(taken)))
            conn.execute(joblog.LOG_ACK, ack_params(taken))
    (claim_15, ack_15), (claim_50, ack_50) = reads[15], reads[50]
    # 35 rounds more: 3,500 jobs parked and handed, 7,000 slot updates since round 15
    assert claim_50 <= claim_15 * 1.5 + 20, reads
    assert ack_50 <= ack_15 * 1.5 + 40, reads


def test_the_limits_read_shows_a_log_keys_parked_and_running_jobs(conn) -> None:
    from supervisor import limits

    conn.execute(slots.LOG_INSERT_KEYED, log_rows(3, "acct:seen"))
    assert len(claim(conn, 10)) == 1  # one runs, two parked
    (seen,) = [k for k in limits.seen(conn).keys if k["key"] == "acct:seen"]
    assert (seen["queues"], seen["waiting"], seen["running"], seen["concurrency"], seen["gated_by"]) == \
        ([QUEUE], 2, 1, 1, "concurrency")
    assert conn.execute("SELECT status, count(*) FROM jobs WHERE concurrency_key = 'acct:seen' GROUP BY 1"
                        " ORDER BY 1").fetchall() == [("running", 1), ("waiting", 2)]
    conn.execute(ACK_ALL)  # the running one ends; its slot goes to the next
    assert conn.execute("SELECT status, count(*) FROM jobs WHERE concurrency_key = 'acct:seen' GROUP BY 1"
                        " ORDER BY 1").fetchall() == [("pending", 1), ("succeeded", 1), ("waiting", 1)]


def test_an_operators_override_of_the_limit_applies_to_the_log_key(conn) -> None:
    from supervisor import limits

    conn.execute(slots.LOG_INSERT_KEYED, log_rows(6, "acct:tuned", limit=3))
    assert len(claim(conn, 10)) == 3  # the jobs' own limit, three parked
    limits.set_override(conn, "acct:tuned", limits.parse({"concurrency": "1"}), "test")
    conn.execute(ACK_ALL)  # three ends: slots 1 and 2 are past the limit now, and go free
    assert len(claim(conn, 10)) == 1
    assert scalar(conn, slots.LOG_PARKED, {"queue": QUEUE}) == 2
    assert scalar(conn, "SELECT count(*) FROM job_concurrency WHERE key = 'acct:tuned' AND job_id IS NOT NULL") == 1
    limits.set_override(conn, "acct:tuned", limits.parse({"concurrency": "2"}), "test")
    conn.execute(slots.LOG_INSERT_KEYED, log_rows(1, "acct:tuned", limit=3))
    assert len(claim(conn, 10)) == 1  # a free slot under the raised limit: the new row takes it


def test_a_flush_cancels_the_parked_jobs_and_the_running_one_frees_its_slot(conn) -> None:
    conn.execute(slots.LOG_INSERT_KEYED, log_rows(3, "acct:flushed"))
    (running,) = claim(conn, 10)
    conn.execute(joblog.LOG_FLUSH, {"queue": QUEUE})
    assert scalar(conn, slots.LOG_PARKED, {"queue": QUEUE}) == 0
    assert scalar(conn, "SELECT count(*) FROM job_blocked") == 0
    assert conn.execute("SELECT status, count(*) FROM jobs WHERE concurrency_key = 'acct:flushed' GROUP BY 1"
                        " ORDER BY 1").fetchall() == [("cancelled", 2), ("running", 1)]
    conn.execute(joblog.LOG_ACK, ack_params([running]))
    assert scalar(conn, "SELECT count(*) FROM job_concurrency WHERE job_id IS NOT NULL") == 0
    assert claim(conn, 10) == []  # nothing handed: the parked jobs were flushed


def test_retention_appends_a_parked_job_of_a_dropped_day_again_with_its_key(conn) -> None:
    old = "2000-01-01"
    conn.execute("SELECT job_log_add_day(%s::date)", [old])
    today = log_rows(1, "acct:old")
    conn.execute(slots.LOG_INSERT_KEYED, today)
    parked = str(uuid.uuid4())
    conn.execute("INSERT INTO job_log (day, id, queue, actor, flow_key, flow)"
                 " VALUES (%s, %s, %s, 'noop', 'acct:old', '{\"c\": 1}')", (old, parked, QUEUE))
    (running,) = claim(conn, 10)  # a level's first window reads every day
    assert running[3] == today["id"][0] and scalar(conn, slots.LOG_PARKED, {"queue": QUEUE}) == 1
    conn.execute("SELECT job_log_drop_before(%s::date)", ["2000-01-02"])  # no lease names the old day
    assert scalar(conn, "SELECT to_regclass('job_log_d20000101')") is None
    assert scalar(conn, "SELECT count(*) FROM job_blocked") == 0
    assert conn.execute("SELECT flow_key, flow, flow_held, day = job_log_today() FROM job_log WHERE id = %s",
                        (parked,)).fetchall() == [("acct:old", {"c": 1}, None, True)]
    assert claim(conn, 10) == []  # appended again, gated again: parked behind the running one
    conn.execute(joblog.LOG_ACK, ack_params([running]))
    (handed,) = claim(conn, 10)
    assert handed[3] == parked
