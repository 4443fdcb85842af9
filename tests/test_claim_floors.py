"""Claim floors (broker/consuming/floors.py): a process's claims start where its last claim of each
priority level ended, so entries a pinned xmin horizon keeps in the claim index are
not read again; sweeps (no floors) find the rows behind a floor. Real PostgreSQL."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from datetime import UTC, timedelta

import dramatiq
import psycopg
import pytest

from supervisor.broker import PostgresBroker, sql
from supervisor.broker.consuming.floors import SWEEP, ClaimFloors, SweepSignal
from supervisor.broker.consuming.gates import first_turn
from tests.conftest import plan_buffers, run_rounds, scalar, wait_for

QUEUE = "floors"


@contextlib.contextmanager
def _floored(database_url: str, floors: ClaimFloors) -> Iterator[PostgresBroker]:
    """A broker with an actor on QUEUE and these floors (shared by its claims, outcomes and
    straggler probe, so given when it is made), closed after."""
    broker = PostgresBroker(database_url, floors=floors)

    @dramatiq.actor(broker=broker, queue_name=QUEUE, actor_name="floors_noop")
    def floors_noop() -> None:
        pass

    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture
def floored(database_url: str) -> Iterator[PostgresBroker]:
    """The broker with an actor on QUEUE, and floors that never sweep by the clock."""
    with _floored(database_url, ClaimFloors(slack=0, sweep_every=3600)) as broker:  # rows of the last second
        yield broker


def _insert(conn: psycopg.Connection, n: int, *, ago_s: float = 0.0, priority: int = 0) -> list[str]:
    return [str(r[0]) for r in conn.execute(
        "INSERT INTO job_queue (queue, actor, priority, run_at) SELECT %s, 'floors_noop', %s,"
        " now() - %s * interval '1 second' FROM generate_series(1, %s) RETURNING id",
        (QUEUE, priority, ago_s, n)).fetchall()]


def _claim_params(broker: PostgresBroker) -> dict:
    """sql.claim's parameters for 16 rows of QUEUE, without the floors."""
    return {"queue": QUEUE, "n": 16, "owner": broker.owner, "lease_s": 30.0, "relaxed": False, **first_turn(16),
            **broker.claims._budgets()}


def _claim_ids(broker: PostgresBroker, n: int = 50) -> set[str]:
    return {m.message_id for m in broker.claim(QUEUE, n)}


def test_a_floored_claim_skips_rows_behind_its_floor_and_a_sweep_finds_them(conn, floored):
    first = _insert(conn, 3)
    assert _claim_ids(floored) == set(first)  # the first claim of a queue is a sweep
    assert floored.floors.params(QUEUE)[1] is False  # then claims start at the floor
    # A row whose enqueue committed long after its run_at (a long transaction's now()):
    # behind the floor, left by floored claims; a row enqueued now is claimed.
    straggler = _insert(conn, 1, ago_s=3600)
    fresh = _insert(conn, 1)
    assert _claim_ids(floored) == set(fresh)
    assert _claim_ids(floored) == set()
    floored.floors.reset(QUEUE)  # a requeue, or the sweep interval
    assert _claim_ids(floored) == set(straggler)


def test_each_priority_level_has_its_own_floor_and_a_new_higher_level_is_found_at_once(conn, floored):
    low = _insert(conn, 2, ago_s=60, priority=0)
    assert _claim_ids(floored) == set(low)
    # older than the level-0 floor, but at a level this process never claimed from and
    # above every level it knows: the probe above the known levels finds it
    high = _insert(conn, 1, ago_s=120, priority=5)
    again = _insert(conn, 1, priority=0)
    claimed = [m.message_id for m in floored.claim(QUEUE, 10)]
    assert claimed == high + again  # priority order kept


def test_a_requeue_by_any_process_makes_every_process_sweep(conn, floored, database_url):
    rows = _insert(conn, 2, ago_s=30)
    other = PostgresBroker(database_url)
    try:

        @dramatiq.actor(broker=other, queue_name=QUEUE, actor_name="floors_noop")
        def floors_noop() -> None:
            pass

        taken = other.claim(QUEUE, 1)
        assert _claim_ids(floored) == set(rows) - {taken[0].message_id}
        with psycopg.connect(database_url, autocommit=True) as listener:
            listener.execute("LISTEN actor_supervisor_jobs")
            assert other.requeue(taken) == 1
            payloads = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    finally:
        other.close()
    assert payloads == ["!" + QUEUE]  # back in line, behind the floors: sweep
    wake = SweepSignalTarget()
    SweepSignal(floored.floors, QUEUE, wake).set()  # what the listener does with '!floors'
    assert wake.woken and floored.floors.params(QUEUE)[1] is True
    assert _claim_ids(floored) == {taken[0].message_id}


class SweepSignalTarget:
    woken = False

    def set(self) -> None:
        self.woken = True


def test_under_a_pinned_horizon_a_floored_claim_reads_a_few_pages_where_a_sweep_reads_them_all(
        conn, floored, database_url):
    with psycopg.connect(database_url) as pin:
        pin.execute("SELECT txid_current()")  # vacuum and pruning can remove nothing from here on
        run_rounds(conn, floored, QUEUE, "floors_noop", rounds=30)
        _insert(conn, 10)
        floors, sweep = floored.floors.params(QUEUE)
        assert not sweep
        params = _claim_params(floored)
        read = {name: _buffers(conn, {**params, **f}) for name, f in (("floored", floors), ("sweep", SWEEP))}
        pin.rollback()
    # 3,000 rows claimed since the pin, each an entry of the claim index no scan can skip
    # by itself; the floored claim starts past them
    assert read["sweep"] > 10 * read["floored"], read
    assert scalar(conn, "SELECT count(*) FROM job_queue WHERE status = 'pending'") == 10


def _buffers(conn: psycopg.Connection, params: dict) -> int:
    return plan_buffers(conn, sql.claim(16), params)


def test_a_slow_sweep_makes_the_next_come_later_and_a_quick_one_brings_back_the_interval():
    """A sweep stalls the queue's claims while it runs (under a pinned horizon it reads every
    entry claimed since the pin): the next comes no sooner than its duration / SWEEP_SHARE;
    a quick sweep keeps SWEEP_SECONDS."""
    from datetime import datetime

    from supervisor.broker.consuming.floors import SWEEP_SECONDS, SWEEP_SHARE

    now = [100.0]
    floors = ClaimFloors(clock=lambda: now[0])
    row = ("id", QUEUE, "a", "[]", 1, 1, None, 0, 0, None, 0, datetime.now(UTC), False)
    assert floors.params(QUEUE)[1] is True  # the first claim sweeps
    floors.claimed(QUEUE, [row], sweep=True, seconds=0.002)
    now[0] += SWEEP_SECONDS - 0.01
    assert floors.params(QUEUE)[1] is False
    now[0] += 0.01
    assert floors.params(QUEUE)[1] is True  # a quick sweep: again after SWEEP_SECONDS
    floors.claimed(QUEUE, [row], sweep=True, seconds=0.065)  # 65 ms: 13 s to the next
    later = 0.065 / SWEEP_SHARE
    assert later > SWEEP_SECONDS
    now[0] += later - 0.01
    assert floors.params(QUEUE)[1] is False
    now[0] += 0.01
    assert floors.params(QUEUE)[1] is True
    floors.claimed(QUEUE, [row], sweep=True, seconds=0.001)  # the pin is gone: 2 s again
    now[0] += SWEEP_SECONDS
    assert floors.params(QUEUE)[1] is True
    floors.claimed(QUEUE, [row], sweep=True, seconds=1.0)  # a slow one: 200 s to the next ...
    assert floors.params(QUEUE)[1] is False
    floors.reset(QUEUE)  # ... but a requeue ('!queue') sweeps at once, whatever the last took
    assert floors.params(QUEUE)[1] is True


def test_the_straggler_probe_makes_a_claim_sweep_only_when_a_row_waits_behind_a_floor(conn, floored, monkeypatch):
    """Off the claim's path, the probe asks whether a runnable row waits behind a floor;
    only then does the queue's next claim sweep (it is woken, too). While the probe finds
    none, the claims do not sweep on the clock (under a pinned horizon a sweep reads every
    entry claimed since the pin)."""
    from supervisor.broker.consuming import floors as floors_module
    from supervisor.broker.consuming.floors import PROBE_VALID_SECONDS, StragglerProbe

    now = [1000.0]
    floored.floors.clock = lambda: now[0]
    floored.floors.sweep_every = 0.0  # on the clock, every claim would sweep ...
    monkeypatch.setattr(floors_module, "SWEEP_SHARE", 1.0)  # ... however long the last took
    probe = StragglerProbe(floored.pool, floored.floors)
    wakeup = threading.Event()
    probe.watch(QUEUE, SweepSignal(floored.floors, QUEUE, wakeup))
    assert probe.check() == []  # no floors yet: nothing to ask
    first = _insert(conn, 3)
    assert _claim_ids(floored) == set(first)
    assert probe.check() == [] and not wakeup.is_set()
    now[0] += PROBE_VALID_SECONDS - 0.5
    assert floored.floors.params(QUEUE)[1] is False  # the probe answered: no sweep on the clock
    now[0] += 1.0
    assert floored.floors.params(QUEUE)[1] is True  # it stopped answering: on the clock again
    probe.check()
    straggler = _insert(conn, 1, ago_s=3600)
    fresh = _insert(conn, 1)
    assert _claim_ids(floored) == set(fresh)  # floored: the straggler is not read
    assert probe.check() == [QUEUE] and wakeup.is_set()
    assert _claim_ids(floored) == set(straggler)  # the next claim swept
    assert probe.check() == []


def test_while_a_transaction_holds_the_horizon_claims_take_the_held_slack(conn, database_url):
    """The probe reads how long the oldest transaction has held the horizon back; past the
    moving slack, claims start only the held slack behind their floors: under a pin the
    entries of rows claimed in the slack cannot be marked dead, and each costs a heap visit."""
    from supervisor.broker.consuming.floors import StragglerProbe

    floors = ClaimFloors(slack=0.5, held_slack=0.005, sweep_every=3600)
    with _floored(database_url, floors) as floored:
        probe = StragglerProbe(floored.pool, floors)
        probe.watch(QUEUE, SweepSignal(floors, QUEUE, threading.Event()))
        assert _claim_ids(floored) == set()  # the first claim sweeps; floors come with rows
        _insert(conn, 1)
        assert len(_claim_ids(floored)) == 1
        probe.check()
        assert floors.slack == floors.moving_slack  # no transaction holds the horizon
        with psycopg.connect(database_url) as pin:
            pin.execute("SELECT txid_current()")  # vacuum and pruning can remove nothing from here on
            started = time.monotonic()
            run_rounds(conn, floored, QUEUE, "floors_noop", rounds=30)
            _insert(conn, 10)
            # A moving slack that spans every row above, however slow this machine wrote them
            # (at 0.5 s a loaded machine spent 1.5 s: the slack then passed over a third of them).
            floors.moving_slack = timedelta(seconds=time.monotonic() - started + 0.5)
            # The pin's age passes the moving slack; the probe reads it from pg_stat_activity
            # (the server's clock, not this test's).
            wait_for(lambda: probe.check() == [] and floors.slack == floors.held_slack, 30)
            params = _claim_params(floored)
            held = _buffers(conn, {**params, **floors.params(QUEUE)[0]})
            floors.slack = floors.moving_slack
            moving = _buffers(conn, {**params, **floors.params(QUEUE)[0]})
            pin.rollback()
        # 3,000 rows claimed in the last moments: the moving slack passes over most of their
        # entries, the held one over the last few
        assert moving > 5 * held, (moving, held)
        probe.check()
        assert floors.slack == floors.moving_slack  # the horizon moves again
        assert len(floored.claim(QUEUE, 16)) == 10  # behind no floor: the rows written last


def test_a_slow_probe_round_makes_the_next_come_later_and_its_answer_stand_as_long(conn, floored, monkeypatch):
    """Under a pinned horizon a probe round reads every entry claimed since the pin below the
    floors, on one of the pool's two connections: its rounds take at most PROBE_SHARE of
    the time, and a clean answer stands a few of its intervals, so the claims do not sweep
    on the clock between slow rounds."""
    from supervisor.broker.consuming import floors as floors_module
    from supervisor.broker.consuming.floors import PROBE_VALID_ROUNDS, StragglerProbe

    now = [1000.0]
    floored.floors.clock = lambda: now[0]
    floored.floors.sweep_every = 0.0  # on the clock, every claim would sweep ...
    monkeypatch.setattr(floors_module, "SWEEP_SHARE", 1.0)  # ... however long the last took
    probe = StragglerProbe(floored.pool, floored.floors)
    probe.watch(QUEUE, SweepSignal(floored.floors, QUEUE, threading.Event()))
    _insert(conn, 3)
    assert len(_claim_ids(floored)) == 3
    assert probe.check() == []
    assert probe.interval == probe.every  # a quick round: the next in SWEEP_SECONDS
    monkeypatch.setattr(floors_module, "PROBE_SHARE", 1e-6)  # the same round, as if it had been slow
    assert probe.check() == []
    assert probe.interval > probe.every
    now[0] += PROBE_VALID_ROUNDS * probe.interval - 0.5
    assert floored.floors.params(QUEUE)[1] is False  # its answer stands until the next rounds
    now[0] += 1.0
    assert floored.floors.params(QUEUE)[1] is True
