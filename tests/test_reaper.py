"""The reaper (sql.REAP_EXPIRED) reads only the owners whose leases can have run out: a
process that beats renewed all it holds just before its beat, so its rows (and, under a
pinned horizon, the dead index entries of every job it ran) are skipped. Others' expired
leases are released, and so are a beating process's own orphans once it says it may have
some. Real PostgreSQL, real workers rows."""

from __future__ import annotations

from collections.abc import Iterator

import dramatiq
import psycopg
import pytest

from supervisor.broker import PostgresBroker, sql
from supervisor.broker.consuming.leases import reap_params
from supervisor.registry import Registration
from tests.conftest import plan_buffers, run_rounds, scalar, wait_for

QUEUE = "reap"
pytestmark = pytest.mark.broker(lease_seconds=1, owner="reap-host:1:aaaaaa")


@pytest.fixture
def beating(broker: PostgresBroker) -> Iterator[PostgresBroker]:
    """The broker with an actor on QUEUE, registered as a process that beats every 10 s."""

    @dramatiq.actor(broker=broker, queue_name=QUEUE, actor_name="reap_noop")
    def reap_noop() -> None:
        pass

    registration = Registration(broker.pool, broker.owner, role="t", queues=[QUEUE], beat_seconds=10.0)
    registration.register()
    yield broker
    registration.stop()


def _running(conn: psycopg.Connection, owner: str, *, expired_s: float = 60.0) -> str:
    """A running row of ``owner`` whose lease ran out ``expired_s`` ago (nobody holds it)."""
    return str(scalar(conn, "INSERT INTO job_queue (queue, actor, status, attempts, lease_owner, claimed_at,"
                            " lease_expires_at) VALUES (%s, 'reap_noop', 'running', 1, %s, now(),"
                            " now() - %s * interval '1 second') RETURNING id", (QUEUE, owner, expired_s)))


def _reap(conn: psycopg.Connection, me: str | None = None) -> set[str]:
    return {str(r[0]) for r in conn.execute(sql.REAP_EXPIRED, reap_params("t", margin_s=1.0, me=me)).fetchall()}


def test_the_reaper_releases_others_expired_leases_and_leaves_a_beating_process_its_own(conn, beating):
    orphan = _running(conn, beating.owner)  # a claim of the beating process whose answer was lost
    unregistered = _running(conn, "cli-host:7:bbbbbb")  # e.g. a dramatiq CLI worker that died
    silent = _running(conn, "old-host:8:cccccc")  # a process whose beat stopped (frozen, host gone)
    conn.execute("INSERT INTO workers (id, host, pid, role, queues, state, beat_seconds, heartbeat_at)"
                 " VALUES ('old-host:8:cccccc', 'old-host', 8, 't', '{}', 'running', 10, now() - interval '1 minute')")
    lower = _running(conn, "a-host:9:dddddd")  # owners on both sides of the beating one's key
    assert _reap(conn) == {unregistered, silent, lower}
    assert scalar(conn, "SELECT status FROM job_queue WHERE id = %s", (orphan,)) == "running"
    # The process itself reads its own rows once it says some may be orphaned, until a
    # reap ran after their leases (1 s here) and the margin had passed.
    assert beating.leases.reap_expired() == []
    beating.leases.may_have_orphaned()
    assert [job for job, _, _ in beating.leases.reap_expired()] == [orphan]
    wait_for(lambda: (beating.leases.reap_expired(), beating.leases._orphaned_at is None)[1], 10)
    assert scalar(conn, "SELECT count(*) FROM job_queue WHERE status = 'running'") == 0


def test_a_process_that_stopped_or_never_beat_is_reaped_whatever_its_last_beat(conn, beating):
    stopped = _running(conn, "gone-host:3:eeeeee")
    conn.execute("INSERT INTO workers (id, host, pid, role, queues, state, beat_seconds, stopped_at)"
                 " VALUES ('gone-host:3:eeeeee', 'gone-host', 3, 't', '{}', 'stopped', 10, now())")
    pooled = _running(conn, "pool-host:4:ffffff")  # registered with no beat interval: left to its lease
    conn.execute("INSERT INTO workers (id, host, pid, role, queues, state)"
                 " VALUES ('pool-host:4:ffffff', 'pool-host', 4, 't', '{}', 'running')")
    assert _reap(conn) == {stopped, pooled}


def test_under_a_pinned_horizon_the_reap_skips_the_entries_of_processes_that_beat(conn, beating, database_url):
    with psycopg.connect(database_url) as pin:
        pin.execute("SELECT txid_current()")  # vacuum and pruning can remove nothing from here on
        run_rounds(conn, beating, QUEUE, "reap_noop", rounds=30)  # 3,000 jobs: each leaves a dead entry in jobs_running
        expired = _running(conn, "cli-host:7:bbbbbb")
        conn.execute("ANALYZE job_queue")  # as autovacuum may have
        read = {name: _entries(conn, me) for name, me in (("skipping", None), ("reading it", beating.owner))}
        assert _reap(conn) == {expired}
        pin.rollback()
    # Read whole, the beating process's key range is an entry (and a heap visit) per job it ran
    assert read["reading it"] >= 3000 and read["skipping"] < 10, read


def _entries(conn: psycopg.Connection, me: str | None) -> int:
    """Entries of jobs_running a reap reads, dead or alive (its idx_tup_read). Through the
    index, as on a table of any size: on statistics of a small one (autovacuum's, on CI's
    embedded server) the planner may read every running row by a scan of the table."""
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL enable_seqscan = off")
        conn.execute("SET LOCAL jit = off")  # priced-out scans pass jit_above_cost; compiling is not checked
        conn.execute(sql.REAP_EXPIRED, reap_params("t", margin_s=1.0, me=me)).fetchall()
        return int(scalar(conn, "SELECT pg_stat_get_xact_tuples_returned('jobs_running'::regclass)"))


def test_under_a_pinned_horizon_releases_and_renewals_with_little_to_do_read_little(conn, beating, database_url):
    """Planned on statistics taken under the pin, the release statements once walked the
    whole primary key (every version of every job since) to find the few rows to release."""
    with psycopg.connect(database_url) as pin:
        pin.execute("SELECT txid_current()")
        run_rounds(conn, beating, QUEUE, "reap_noop", rounds=30)
        # Statistics taken now count no live row (the upkeep's ANALYZE or a vacuum can take
        # them at such a moment): the planner then takes the table for empty.
        conn.execute("ANALYZE job_queue")
        conn.execute("INSERT INTO job_queue (queue, actor) SELECT %s, 'reap_noop' FROM generate_series(1, 50)", (QUEUE,))
        held = beating.claim(QUEUE, 50)
        budget = {"who": "t", "why": "test", "default_max_losses": 3}
        read = {
            "reap": plan_buffers(conn, sql.REAP_EXPIRED, reap_params("t", margin_s=1.0)),
            "release dead": plan_buffers(conn, sql.RELEASE_DEAD, {**budget, "stale_beats": 2.0}),
            "release owner": plan_buffers(conn, sql.RELEASE_OWNER, {**budget, "owner": "nobody:1:x"}),
            "heartbeat": plan_buffers(conn, sql.HEARTBEAT, {"ids": [m.message_id for m in held], "owner": beating.owner,
                                                        "lease_s": 30.0}),
        }
        pin.rollback()
    # Walking the primary key read 10,600-10,800 buffers each (a heartbeat 6,000), here
    # with 3,050 jobs since the pin; by the key, a few (a heartbeat, ~15 a row it renews)
    assert max(read["reap"], read["release dead"], read["release owner"]) < 50, read
    assert read["heartbeat"] < 20 * len(held), read


def test_a_job_its_process_stopped_is_left_to_that_process_s_own_reaps(conn, beating):
    """A job interrupted by its fence writes no outcome; its row stays this process's, its
    lease renewed until the job let go. The process then reads its own rows in its reaps
    (others skip it while it beats) until that lease has run out."""
    conn.execute("INSERT INTO job_queue (queue, actor) VALUES (%s, 'reap_noop')", (QUEUE,))
    [message] = beating.claim(QUEUE, 1)
    assert beating.leases._orphaned_at is None
    message.fenced = "overdue"  # as fencing.py marks a job it interrupted
    beating.ack(message)
    assert beating.leases.count() == 0 and beating.leases._orphaned_at is not None
    conn.execute("UPDATE job_queue SET lease_expires_at = now() - interval '1 minute' WHERE id = %s",
                 (message.message_id,))
    assert _reap(conn) == set()  # another process's reap: this one beats
    assert [job for job, _, _ in beating.leases.reap_expired()] == [message.message_id]
