"""The waiting floor (broker/consuming/floors.py, sql/flow.py's WAITING_FLOOR): a keyed claim reads a
queue's waiting rows from the oldest one the process's probe saw, so under a pinned horizon
it no longer passes over every row that waited since the pin; a row behind the floor (a
long transaction's, one put back in its place) is found by the probe's next round or at
once after a requeue."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import dramatiq
import psycopg

from supervisor.broker import sql
from supervisor.broker.consuming.floors import ClaimFloors, StragglerProbe, SweepSignal
from supervisor.broker.consuming.gates import NO_FLOOR, first_turn
from supervisor.broker.middleware import claim_budgets
from tests.conftest import plan_buffers

QUEUE = "wfloor"


def _add(conn: psycopg.Connection, key: str, n: int = 1, *, ago_s: float = 0.0) -> set[str]:
    """n rows of QUEUE waiting for ``key`` (no limits), run_at ``ago_s`` ago."""
    return {str(r[0]) for r in conn.execute(
        "INSERT INTO job_queue (queue, actor, max_attempts, flow_key, flow, status, run_at)"
        " SELECT %s, 'wfloor_noop', 3, %s, %s, 'waiting', now() - %s * interval '1 second'"
        " FROM generate_series(1, %s) RETURNING id",
        (QUEUE, key, json.dumps({}), ago_s, n)).fetchall()}


def _params(n: int, kfloor: object = NO_FLOOR) -> dict:
    return {"queue": QUEUE, "n": n, "owner": "me", "lease_s": 30.0, "relaxed": False, "floor_levels": None,
            "floor_at": None, **first_turn(n), **claim_budgets({}, None), "kfloor": kfloor}


def _claim(conn: psycopg.Connection, n: int, kfloor: object = NO_FLOOR) -> set[str]:
    """The ids a keyed claim of n took, committed."""
    with conn.transaction():
        rows = conn.execute(sql.claim(n, keyed=True), _params(n, kfloor)).fetchall()
    return {str(r[0]) for r in rows if r[0] is not None}


def _probe(url: str, floors: ClaimFloors) -> StragglerProbe:
    """A probe of QUEUE through a pool of its own."""
    from psycopg_pool import ConnectionPool

    pool = ConnectionPool(url, min_size=1, max_size=1, open=True)
    probe = StragglerProbe(pool, floors)
    probe.watch(QUEUE, SweepSignal(floors, QUEUE, threading.Event()))
    return probe


def test_under_a_pinned_horizon_a_keyed_claim_from_the_floor_reads_a_few_pages(conn, database_url):
    with psycopg.connect(database_url) as pin:
        pin.execute("SELECT txid_current()")  # vacuum and pruning remove nothing from here on
        for _ in range(60):  # 6,000 rows of 10 keys waited, ran and left since the pin
            for key in range(10):
                _add(conn, f"k{key}", 10)
            while _claim(conn, 100):
                pass
            conn.execute("DELETE FROM job_queue WHERE queue = %s AND status = 'running'", (QUEUE,))
        fresh = set().union(*(_add(conn, f"k{key}", 1) for key in range(10)))
        oldest = conn.execute(sql.WAITING_FLOOR_AT, {"queue": QUEUE}).fetchone()[0]
        floored, unfloored = _params(16, oldest - timedelta(seconds=0.1)), _params(16)
        read = {name: plan_buffers(conn, sql.claim(16, keyed=True), p)
                for name, p in (("floored", floored), ("unfloored", unfloored))}
        assert _claim(conn, 16, oldest) == fresh  # the floor hides none of the waiting rows
        pin.rollback()
    # each key's descent passed over its 600 dead entries, a heap visit each; from the
    # floor the entries are passed over in the index
    assert read["unfloored"] > 4 * read["floored"], read


def test_the_probe_sets_the_floor_and_finds_a_row_behind_it_in_its_next_round(conn, database_url):
    floors = ClaimFloors(slack=0)
    probe = _probe(database_url, floors)
    try:
        assert floors.params(QUEUE)[0]["kfloor"] == NO_FLOOR  # nothing read yet: every row
        first = _add(conn, "a", 2, ago_s=5)
        probe.check()
        kfloor = floors.params(QUEUE)[0]["kfloor"]
        assert kfloor == conn.execute("SELECT min(run_at) FROM job_queue WHERE queue = %s", (QUEUE,)).fetchone()[0]
        assert _claim(conn, 10, kfloor) == first
        # a row whose run_at is older than the floor (a long transaction's now()), and one of now
        straggler = _add(conn, "b", ago_s=3600)
        fresh = _add(conn, "c")
        assert _claim(conn, 10, floors.params(QUEUE)[0]["kfloor"]) == fresh
        probe.check()  # the next round reads the oldest waiting row again
        assert _claim(conn, 10, floors.params(QUEUE)[0]["kfloor"]) == straggler
        probe.check()  # nothing waits: the floor is the probe's now
        assert floors.params(QUEUE)[0]["kfloor"] > kfloor
        floors.reset(QUEUE)  # a requeue: every waiting row again until the next round
        assert floors.params(QUEUE)[0]["kfloor"] == NO_FLOOR
    finally:
        probe.pool.close()


def test_a_reading_taken_before_a_reset_is_not_kept():
    floors = ClaimFloors(slack=0)
    from datetime import UTC, datetime

    resets = floors.resets(QUEUE)
    floors.reset(QUEUE)  # a requeue while the probe was reading
    floors.waiting_floor(QUEUE, datetime.now(UTC), resets)
    assert floors.params(QUEUE)[0]["kfloor"] == NO_FLOOR
    floors.waiting_floor(QUEUE, at := datetime.now(UTC), floors.resets(QUEUE))
    assert floors.params(QUEUE)[0]["kfloor"] == at


def test_a_waiting_row_put_back_tells_every_process_to_read_from_the_start(conn, broker, database_url):
    @dramatiq.actor(broker=broker, queue_name=QUEUE, actor_name="wfloor_noop")
    def wfloor_noop() -> None:
        pass

    row = _add(conn, "a", ago_s=60)
    taken = broker.claim(QUEUE, 1) or broker.claim(QUEUE, 1)  # the first claim probes for keys
    assert {m.message_id for m in taken} == row
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN actor_supervisor_jobs")
        assert broker.requeue(taken) == 1
        payloads = {n.payload for n in listener.notifies(timeout=5, stop_after=2)}
    # waiting again, in its place (run_at kept, a minute old): '+' for the keyed claim, '!'
    # for the floors (broker/consuming/floors.py's SweepSignal resets the waiting floor too)
    assert payloads == {"+" + QUEUE, "!" + QUEUE}
    assert conn.execute("SELECT status FROM job_queue WHERE queue = %s", (QUEUE,)).fetchone()[0] == "waiting"


def test_a_floor_newer_than_the_statistics_keeps_the_claim_on_the_key_index(conn):
    """An ANALYZE taken while older rows waited: the floor (now) lies past the statistics'
    last run_at. The keyed claim must still read waiting rows key by key (jobs_waiting), not
    every row since the floor by time (jobs_waiting_due), which it then sorts by key."""
    for key in range(20):
        _add(conn, f"k{key}", 100, ago_s=3600)
    conn.execute("ANALYZE job_queue")
    conn.execute("DELETE FROM job_queue WHERE queue = %s", (QUEUE,))
    for key in range(20):
        _add(conn, f"k{key}", 50)
    kfloor = conn.execute(sql.WAITING_FLOOR_AT, {"queue": QUEUE}).fetchone()[0] - timedelta(seconds=0.1)
    with conn.transaction(force_rollback=True):
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + sql.claim(16, keyed=True), _params(16, kfloor)))
    assert "jobs_waiting_due" not in plan, plan
    assert "jobs_waiting" in plan
