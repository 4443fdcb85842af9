"""Jobs whose key carries a fairness weight live in the log (migration 056, sql/fair.py):
the claim parks them in job_blocked for their key's turn, and the keys of a queue take
turns, each key up to its weight a turn, from one cursor per queue shared by every process.
On the real database: shares follow the weights while the keys have a backlog, a late small
key is not starved, a key's jobs run first in first out, a parked job cancels, a key with a
concurrency limit too still holds it, real worker processes share the turns, and under a
pinned horizon the claim's reads stay flat while a plain queue's claim reads as before."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from supervisor import admin
from supervisor.broker import PostgresBroker
from supervisor.broker.sql import fair, joblog, slots, timers
from tests.conftest import plan_buffers, scalar, wait_for
from tests.run_notes import most_at_once
from tests.supervisor_helpers import log_producer

QUEUE = "fair"
ACTORS = "tests.fair_actors"
# the stand-ins a producer needs to key the messages as the workers' actors are keyed
OPTIONS: dict[str, dict[str, Any]] = {
    "tenant_job": {"max_retries": 0, "fairness_key": "tenant:{kwargs[tenant]}"},
    "capped_tenant": {"max_retries": 0, "fairness_key": "cap:{kwargs[tenant]}", "fairness_weight": 2,
                      "concurrency_limit": 1},
}


@contextmanager
def producer(database_url: str) -> Iterator[PostgresBroker]:
    with log_producer(database_url, QUEUE, OPTIONS) as p:
        yield p


def rows(n: int, key: str, *, limits: dict[str, int] | None = None, queue: str = QUEUE,
         start: int = 0) -> dict[str, Any]:
    """LOG_INSERT_KEYED's parameters for n no-op messages of one key (kwargs n: their order)."""
    return {"id": [str(uuid.uuid4()) for _ in range(n)], "queue": [queue] * n, "actor": ["noop"] * n,
            "args": ["[]"] * n, "kwargs": [json.dumps({"key": key, "n": start + i}) for i in range(n)],
            "options": ["{}"] * n, "payload": [None] * n, "priority": [0] * n, "max_attempts": [None] * n,
            "max_lease_losses": [None] * n, "message_timestamp": [None] * n, "flow_key": [key] * n,
            "flow": [json.dumps(limits or {})] * n}


def claim_params(n: int, queue: str = QUEUE) -> dict[str, Any]:
    return {"queue": queue, "n": n, "owner": "fair-host:1:aaaaaa", "lease_s": 30.0, "relaxed": False,
            "tfloor": None, "tlimit": 1000}


def claim(conn, n: int, queue: str = QUEUE) -> list[tuple]:
    return [r for r in conn.execute(timers.LOG_CLAIM_DUE, claim_params(n, queue)).fetchall() if r[0] is not None]


def ack_params(taken: list[tuple]) -> dict[str, Any]:
    """joblog.LOG_ACK's parameters for claimed rows (the worker's ack of their successes)."""
    n = len(taken)
    return {"seqs": [r[1] for r in taken], "days": [r[2] for r in taken], "ids": [r[3] for r in taken],
            "attempts": [r[7] for r in taken], "progress": [None] * n, "started_us": [0] * n, "ended_us": [0] * n,
            "batches": [r[0] for r in taken], "queues": [r[4] for r in taken], "actors": [r[5] for r in taken],
            "created": [r[14] for r in taken], "results": [None] * n, "owner": "fair-host:1:aaaaaa", "ended": []}


def ack(conn, taken: list[tuple]) -> None:
    """The worker's ack of claimed rows (LOG_ACK: the done rows carry the key from the lease)."""
    conn.execute(joblog.LOG_ACK, ack_params(taken))


def kwargs_of(taken: list[tuple]) -> list[tuple[str, int]]:
    """(key, n) of each claimed row, in the claim's order (its body: [args, kwargs, options])."""
    return [(json.loads(r[6])[1]["key"], json.loads(r[6])[1]["n"]) for r in taken]


def drain(conn, n: int, *, until: int) -> list[tuple[str, int]]:
    """Claims of n, each acked, until ``until`` rows were taken: (key, n) in claim order."""
    out: list[tuple[str, int]] = []
    while len(out) < until:
        taken = claim(conn, n)
        assert taken, out
        out += kwargs_of(taken)
        ack(conn, taken)
    return out


def test_a_weighted_job_is_appended_to_the_log_with_its_key(conn, database_url) -> None:
    with producer(database_url) as p:
        m = p.actors["tenant_job"].send_with_options(kwargs={"tenant": "t1", "n": 1}, fairness_weight=3)
        one = p.actors["tenant_job"].send(tenant="t2", n=1)  # weight 1: a key with no limit written
        capped = p.actors["capped_tenant"].send(tenant="t1", n=1)
    got = dict((r[0], (r[1], r[2])) for r in conn.execute("SELECT id::text, flow_key, flow FROM job_log"))
    assert got == {m.message_id: ("tenant:t1", {"w": 3}), one.message_id: ("tenant:t2", {}),
                   capped.message_id: ("cap:t1", {"c": 1, "w": 2})}
    assert scalar(conn, "SELECT count(*) FROM job_queue") == 0
    assert conn.execute("SELECT DISTINCT status FROM jobs").fetchall() == [("pending",)]


def test_a_delayed_or_deduped_weighted_job_keeps_its_key_and_takes_its_turn(conn, database_url) -> None:
    with producer(database_url) as p:
        job = p.actors["tenant_job"]
        later = job.send_with_options(kwargs={"tenant": "t", "n": 1}, delay=60_000, fairness_weight=2)
        once = p.enqueue(job.message_with_options(kwargs={"tenant": "t", "n": 2}, dedupe_key="once"))
        twin = p.enqueue(job.message_with_options(kwargs={"tenant": "t", "n": 3}, dedupe_key="once"))
    # the delayed one waits in job_timers with its key and limits, the deduped one in the log with both keys
    assert conn.execute("SELECT flow_key, flow FROM job_timers WHERE id = %s", (later.message_id,)).fetchall() == [
        ("tenant:t", {"w": 2})]
    assert conn.execute("SELECT dedupe_key, flow_key FROM job_log").fetchall() == [("once", "tenant:t")]
    assert twin.message_id == once.message_id or scalar(conn, "SELECT count(*) FROM job_log") == 1
    conn.execute("UPDATE job_timers SET run_at = now() WHERE id = %s", (later.message_id,))  # due now
    taken = claim(conn, 10)
    taken += claim(conn, 10)  # (a claim that promoted takes its rows at the next)
    assert sorted(r[3] for r in taken) == sorted([later.message_id, once.message_id])
    assert scalar(conn, "SELECT count(*) FROM job_events WHERE to_status = 'pending' AND from_status = 'waiting'") == 2
    assert scalar(conn, "SELECT count(*) FROM job_queue") == 0


def test_two_keys_of_weights_1_and_3_share_the_starts_1_to_3_while_both_have_a_backlog(conn) -> None:
    conn.execute(slots.LOG_INSERT_KEYED, rows(40, "a"))
    conn.execute(slots.LOG_INSERT_KEYED, rows(60, "b", limits={"w": 3}))
    order = drain(conn, 4, until=80)
    shares = Counter(k for k, _ in order[:80])
    assert shares == {"a": 20, "b": 60}, shares  # b's backlog ends with its 60th: a's 20th alongside
    for i in range(0, 80, 4):  # every turn: one of a, three of b
        assert Counter(k for k, _ in order[i:i + 4]) == {"a": 1, "b": 3}, order[i:i + 4]
    for key in ("a", "b"):  # a key's own jobs first in, first out
        assert [n for k, n in order if k == key] == sorted(n for k, n in order if k == key)
    assert drain(conn, 4, until=20) == [("a", n) for n in range(20, 40)]  # then a alone
    assert claim(conn, 4) == []
    assert scalar(conn, fair.LOG_TURNS, {"queue": QUEUE}) == 0


def test_a_turn_cut_short_by_a_claim_goes_on_in_the_next_claim(conn) -> None:
    """Claims of one row each (a consumer's prefetch of 1) keep the shares: the key whose turn
    a claim cut short is the next claim's."""
    conn.execute(slots.LOG_INSERT_KEYED, rows(10, "a"))
    conn.execute(slots.LOG_INSERT_KEYED, rows(30, "b", limits={"w": 3}))
    order = drain(conn, 1, until=40)
    assert [k for k, _ in order] == ["a", "b", "b", "b"] * 10


def test_a_late_small_key_is_not_starved_behind_a_large_backlog(conn) -> None:
    conn.execute(slots.LOG_INSERT_KEYED, rows(2000, "big"))
    assert len(drain(conn, 10, until=50)) == 50
    conn.execute(slots.LOG_INSERT_KEYED, rows(5, "small"))
    order = drain(conn, 10, until=10)
    # the next claim parks small's rows and gives each key a turn: big 1, small 1, ...
    assert Counter(k for k, _ in order) == {"big": 5, "small": 5}, order
    assert scalar(conn, fair.LOG_TURNS, {"queue": QUEUE}) == 2000 - 55
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE flow_key = 'big' AND status = 'waiting'") == 2000 - 55


def test_a_waiting_weighted_job_cancels(conn) -> None:
    conn.execute(slots.LOG_INSERT_KEYED, rows(3, "c", limits={"w": 2}))
    (first,) = claim(conn, 1)  # the other two parked for their turn
    ids = conn.execute("SELECT id::text FROM job_log ORDER BY seq").fetchall()
    parked = ids[1][0]
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (parked,)) == "waiting"
    assert admin.cancel_job(conn, parked)
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (parked,)) == "cancelled"
    assert conn.execute("SELECT from_status, to_status FROM job_events WHERE job_id = %s ORDER BY id",
                        (parked,)).fetchall() == [("pending", "waiting"), ("waiting", "cancelled")]
    assert scalar(conn, "SELECT count(*) FROM job_blocked WHERE id = %s", (parked,)) == 0
    (last,) = claim(conn, 10)
    assert last[3] == ids[2][0]
    # its turn written: parked, then pending again as its key's turn came, claimed
    assert conn.execute("SELECT from_status, to_status FROM job_events WHERE job_id = %s ORDER BY id",
                        (last[3],)).fetchall() == [("pending", "waiting"), ("waiting", "pending")]
    ack(conn, [first, last])
    assert claim(conn, 10) == []
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 2


def test_a_flush_cancels_the_jobs_waiting_for_a_turn(conn, database_url) -> None:
    conn.execute(slots.LOG_INSERT_KEYED, rows(5, "f"))
    claim(conn, 1)
    assert scalar(conn, fair.LOG_TURNS, {"queue": QUEUE}) == 4
    with producer(database_url) as p:
        p.flush(QUEUE)
    assert scalar(conn, fair.LOG_TURNS, {"queue": QUEUE}) == 0
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'cancelled'") == 4
    assert claim(conn, 10) == []


def test_a_key_with_a_weight_and_a_concurrency_limit_takes_turns_and_slots(conn) -> None:
    conn.execute(slots.LOG_INSERT_KEYED, rows(4, "x", limits={"w": 2, "c": 1}))
    conn.execute(slots.LOG_INSERT_KEYED, rows(4, "y"))
    taken = claim(conn, 10)
    # x's turn took two rows: one got the slot, the other parked for a slot; y's four ran
    assert sorted(kwargs_of(taken)) == [("x", 0), ("y", 0), ("y", 1), ("y", 2), ("y", 3)]
    assert scalar(conn, slots.LOG_PARKED, {"queue": QUEUE}) == 3
    assert scalar(conn, "SELECT count(*) FROM job_blocked WHERE NOT turn") == 1
    x1 = conn.execute("SELECT id::text FROM job_blocked WHERE NOT turn").fetchone()[0]
    assert conn.execute("SELECT from_status, to_status FROM job_events WHERE job_id = %s ORDER BY id",
                        (x1,)).fetchall() == [("pending", "waiting"), ("waiting", "pending"), ("pending", "waiting")]
    seen: list[tuple[str, int]] = []
    for _ in range(10):
        ack(conn, taken)  # x's end hands its slot to x1, appended again holding it
        taken = claim(conn, 10)
        if not taken:
            break
        assert [k for k, _ in kwargs_of(taken)] == ["x"]  # one at a time
        seen += kwargs_of(taken)
    assert seen == [("x", 1), ("x", 2), ("x", 3)]
    assert scalar(conn, "SELECT count(*) FROM job_concurrency WHERE job_id IS NOT NULL") == 0
    assert scalar(conn, "SELECT count(*) FROM job_blocked") == 0


def test_weighted_jobs_take_turns_across_two_worker_processes(conn, database_url, workers) -> None:
    procs = [workers(queues=QUEUE, actors=ACTORS, threads=2, extra_env={"SUPERVISOR_NODE_NAME": f"node-{i}"})
             for i in range(2)]
    for p in procs:
        p.wait_ready(conn)
    with producer(database_url) as p:
        job = p.actors["tenant_job"]
        p.enqueue_many([job.message_with_options(kwargs={"tenant": "heavy", "n": i, "sleep_s": 0.02},
                                                 fairness_weight=3) for i in range(150)]
                       + [job.message(tenant="light", n=i, sleep_s=0.02) for i in range(100)])
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 250, 90,
             message="250 jobs to succeed")
    starts = conn.execute("SELECT tag, n, pid FROM test_results ORDER BY started, id").fetchall()
    # while both have a backlog (heavy's 150 end near the 200th start): ~1 light to 3 heavy
    first = Counter(tag for tag, _, _ in starts[:160])
    assert 25 <= first["light"] <= 55, first
    assert len({pid for _, _, pid in starts}) == 2  # both processes ran them
    for tag in ("heavy", "light"):  # a key's jobs get their turns in their order (and start as threads free)
        ns = [r[0] for r in conn.execute(
            "SELECT (j.kwargs->>'n')::int FROM job_events e JOIN jobs j ON j.id = e.job_id"
            " WHERE e.from_status = 'waiting' AND e.to_status = 'pending' AND j.flow_key = %s ORDER BY e.id",
            (f"tenant:{tag}",))]
        # (a job requeued by its process, as under load, is parked and gets a turn again: its first counts)
        first_turns = list(dict.fromkeys(ns))
        assert first_turns == list(range(len(first_turns))) and len(first_turns) >= 90, (tag, ns)
    assert scalar(conn, "SELECT count(*) FROM job_queue") == 0
    assert scalar(conn, "SELECT count(*) FROM job_done WHERE status = 'succeeded' AND flow_key IS NOT NULL") == 250


def test_capped_weighted_jobs_hold_their_limit_in_real_processes(conn, database_url, workers) -> None:
    procs = [workers(queues=QUEUE, actors=ACTORS, threads=4) for _ in range(2)]
    for p in procs:
        p.wait_ready(conn)
    with producer(database_url) as p:
        capped = p.actors["capped_tenant"]
        p.enqueue_many([capped.message(tenant=t, n=i) for i in range(8) for t in ("a", "b")])
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 16, 60,
             message="16 capped jobs to succeed")
    for t in ("a", "b"):
        spans = conn.execute("SELECT n, started, finished FROM test_results WHERE tag = %s ORDER BY started",
                             (t,)).fetchall()
        assert [n for n, _, _ in spans] == list(range(8)), t
        assert most_at_once([(s, e) for _, s, e in spans]) == 1, t
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM job_concurrency WHERE job_id IS NOT NULL") == 0, 10)
    assert scalar(conn, "SELECT count(*) FROM job_blocked") == 0


def test_under_a_pinned_horizon_the_fair_claim_reads_stay_flat(conn, database_url) -> None:
    """Rounds of 5 jobs for each of 20 weighted keys, claimed (the turns take 100) and acked:
    under a pin the claim reads its window and, per key, its newest floor and its parked rows
    after it, and an ack one parked entry per job: the reads stay flat as the dead rows of
    the jobs taken pile up."""
    keys = [f"k{i}" for i in range(20)]
    reads: dict[int, tuple[int, int]] = {}
    # statistics of nearly empty tables (as a worker's upkeep leaves them): a plan that reads
    # a whole index of job_blocked, its dead entries too, would then be chosen
    conn.execute(slots.LOG_INSERT_KEYED, rows(5, "warm", limits={"w": 2}))
    ack(conn, claim(conn, 10))
    conn.execute("ANALYZE job_blocked, job_fair_floor, job_cursor, job_log, job_done")
    with psycopg.connect(database_url) as pin:
        pin.execute("SELECT txid_current()")  # vacuum and pruning remove nothing from here on
        for rnd in range(1, 51):
            for k in keys:
                conn.execute(slots.LOG_INSERT_KEYED, rows(5, k, limits={"w": 2}, start=5 * rnd))
            claimed = plan_buffers(conn, timers.LOG_CLAIM_DUE, claim_params(60)) if rnd in (10, 50) else 0
            taken = claim(conn, 60)
            taken += claim(conn, 60)
            assert len(taken) == 100
            if rnd in (10, 50):  # and the worker's ack of them (each done row's key: 053's trigger)
                reads[rnd] = (claimed, plan_buffers(conn, joblog.LOG_ACK, ack_params(taken)))
            ack(conn, taken)
    # 40 rounds more: 4,000 jobs parked and taken since round 10
    (claim_10, ack_10), (claim_50, ack_50) = reads[10], reads[50]
    assert claim_50 <= claim_10 * 1.5 + 20, reads
    assert ack_50 <= ack_10 * 1.5 + 40, reads


# Reads of the fair pass's tables (index and sequential scans), as this session's statistics count them.
FAIR_READS = """
SELECT coalesce(sum(coalesce(s.idx_scan, 0) + coalesce(s.seq_scan, 0)), 0) FROM pg_stat_user_tables s
 WHERE s.relname IN ('job_fair_floor', 'job_blocked')
"""


def fair_reads(conn) -> int:
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return int(scalar(conn, FAIR_READS))


def test_a_plain_queues_claim_does_no_fair_work_beside_a_weighted_backlog(conn) -> None:
    """The fair work is the weighted queue's: a plain queue's claim reads neither job_blocked
    nor the floors, and reads what it read before another queue had jobs parked for turns."""
    def plain_claim() -> tuple[int, int]:
        conn.execute(joblog.LOG_INSERT, {k: v for k, v in rows(20, "p", queue="plain").items()
                                         if k not in ("flow_key", "flow")})
        before = fair_reads(conn)
        taken = claim(conn, 10, queue="plain")
        touched = fair_reads(conn) - before
        ack(conn, taken)
        reads = plan_buffers(conn, timers.LOG_CLAIM_DUE, claim_params(10, queue="plain"))
        ack(conn, claim(conn, 10, queue="plain"))
        return touched, reads

    plain_claim()  # (the first reads the catalog for its plans)
    _, alone = plain_claim()
    conn.execute(slots.LOG_INSERT_KEYED, rows(500, "w", limits={"w": 2}))
    claim(conn, 5)
    assert scalar(conn, fair.LOG_TURNS, {"queue": QUEUE}) == 495
    touched, beside = plain_claim()
    assert touched == 0
    assert beside <= alone + 15, (alone, beside)  # (its own log grew: a page here or there)
    assert not scalar(conn, "SELECT bool_or(fair) FROM job_cursor WHERE queue = 'plain'")
    before = fair_reads(conn)
    claim(conn, 5)
    assert fair_reads(conn) > before  # (the counters do count the weighted queue's claim)


@pytest.mark.parametrize("weight", [1, 4])
def test_the_prune_keeps_a_keys_newest_floor_and_drops_idle_keys(conn, weight) -> None:
    conn.execute(slots.LOG_INSERT_KEYED, rows(12, "k", limits={"w": weight}))
    drain(conn, 2, until=12)
    assert scalar(conn, "SELECT count(*) FROM job_fair_floor") > 1
    newest = scalar(conn, "SELECT max(pos) FROM job_fair_floor")
    conn.execute(fair.LOG_PRUNE_FLOORS, {"idle_s": 3600})
    assert conn.execute("SELECT key, pos, weight FROM job_fair_floor").fetchall() == [("k", newest, weight)]
    conn.execute(fair.LOG_PRUNE_FLOORS, {"idle_s": 0})
    assert scalar(conn, "SELECT count(*) FROM job_fair_floor") == 0
    conn.execute(slots.LOG_INSERT_KEYED, rows(2, "k", limits={"w": weight}, start=12))  # the key comes back
    assert drain(conn, 2, until=2) == [("k", 12), ("k", 13)]


def test_the_limits_read_shows_a_weighted_keys_waiting_jobs_and_its_override_applies(conn) -> None:
    from supervisor import limits

    conn.execute(slots.LOG_INSERT_KEYED, rows(6, "seen", limits={"w": 2}))
    conn.execute(slots.LOG_INSERT_KEYED, rows(6, "other"))
    assert [k for k, _ in kwargs_of(claim(conn, 3))] == ["other", "seen", "seen"]
    (seen,) = [k for k in limits.seen(conn).keys if k["key"] == "seen"]
    assert (seen["queues"], seen["waiting"], seen["running"], seen["weight"]) == ([QUEUE], 4, 2, 2)
    # the operator's weight wins over the rows' (the table's claim reads the same override)
    limits.set_override(conn, "seen", {"w": 4}, "test")
    assert [k for k, _ in kwargs_of(claim(conn, 5))] == ["other", "seen", "seen", "seen", "seen"]


def test_a_row_held_by_a_cancel_that_rolls_back_is_not_left_behind_the_keys_floor(conn, database_url) -> None:
    conn.execute(slots.LOG_INSERT_KEYED, rows(4, "h", limits={"w": 3}))
    assert kwargs_of(claim(conn, 1)) == [("h", 0)]  # the rest parked for their turns
    held = conn.execute("SELECT id::text FROM job_blocked WHERE turn ORDER BY pos LIMIT 1").fetchone()[0]
    with psycopg.connect(database_url) as canceller:  # a cancel's trigger holds the parked row
        canceller.execute("SELECT 1 FROM job_blocked WHERE id = %s FOR UPDATE", (held,))
        assert kwargs_of(claim(conn, 10)) == [("h", 2), ("h", 3)]  # passed over
        canceller.rollback()
    assert kwargs_of(claim(conn, 10)) == [("h", 1)]  # its turn comes after all
    assert scalar(conn, fair.LOG_TURNS, {"queue": QUEUE}) == 0
