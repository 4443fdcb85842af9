"""One worker's own statements never deadlock each other (issue 23, item 8).

The heartbeat (every lease this process holds) and the ack batch (every ack that
arrived meanwhile) update the same running rows from two connections of the
process. Two multi-row UPDATEs that lock the same rows in different orders
deadlock; PostgreSQL then kills one after deadlock_timeout. Each statement that
updates several job rows locks them in id order, so neither can wait for a row
while holding one the other needs first.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from supervisor import db
from supervisor.broker import Leases

OWNER = "lockorder:1:abc"
pytestmark = pytest.mark.broker(owner=OWNER, pool_size=2)
ROWS = 32
ROUNDS = 1000

# Make the rows running under OWNER, as a claim leaves them (attempt 1).
RESET = """
UPDATE jobs SET status = 'running', attempts = 1, lease_owner = %(owner)s, claimed_at = now(),
                heartbeat_at = now(), lease_expires_at = now() + interval '30 seconds', finished_at = NULL
 WHERE queue = 'lockorder'
"""


@pytest.fixture
def rows(conn) -> list[str]:
    conn.execute("ALTER DATABASE " + conn.info.dbname + " SET deadlock_timeout = '20ms'")
    # Beside finished rows, as in production: the planner then finds the rows by id
    # (by a bitmap of the primary key, in the order of the table, or one by one in the
    # order of an array), not by reading a table of a few rows.
    conn.execute("INSERT INTO jobs (queue, actor, status, finished_at)"
                 " SELECT 'done', 'noop', 'succeeded', now() FROM generate_series(1, 5000)")
    ids = [str(r[0]) for r in conn.execute(
        "INSERT INTO jobs (queue, actor) SELECT 'lockorder', 'noop' FROM generate_series(1, %s) RETURNING id",
        (ROWS,))]
    conn.execute("ANALYZE jobs")
    yield ids
    conn.execute("ALTER DATABASE " + conn.info.dbname + " RESET deadlock_timeout")


def test_heartbeats_and_ack_batches_over_the_same_rows_never_deadlock(conn, database_url, rows, broker):
    """A thousand rounds, each a heartbeat and an ack batch released together over
    the same rows, from two connections: the heartbeat sends the ids in claim order,
    the acks come in the order the jobs finished (here: reversed)."""
    pool = ConnectionPool(database_url, min_size=1, max_size=1, kwargs=db.session_kwargs(database_url), open=True)
    leases = Leases(pool, OWNER, lease_seconds=30)
    leases.hold([(job_id, 1) for job_id in rows])
    acked = list(reversed(rows))  # jobs finish in any order; here the reverse of the table's
    gate = threading.Barrier(3, timeout=30)  # a thread that fails breaks it: no hang
    deadlocks: list[str] = []
    renewed: list[int] = []

    def beat() -> None:
        for _ in range(ROUNDS):
            gate.wait()
            try:
                renewed.append(leases.heartbeat())
            except psycopg.errors.DeadlockDetected as exc:
                deadlocks.append(f"heartbeat: {exc}")
            gate.wait()

    def ack() -> None:
        for _ in range(ROUNDS):
            gate.wait()
            try:
                ran: list[float | None] = [time.monotonic()] * len(acked)
                broker.completer.write_acks(acked, [1] * len(acked), ran, ran)
            except psycopg.errors.DeadlockDetected as exc:
                deadlocks.append(f"ack: {exc}")
            gate.wait()

    threads = [threading.Thread(target=beat), threading.Thread(target=ack)]
    for t in threads:
        t.start()
    try:
        for _ in range(ROUNDS):
            conn.execute(RESET, {"owner": OWNER})
            gate.wait()  # go
            gate.wait()  # both done
    except BaseException:
        gate.abort()
        raise
    finally:
        for t in threads:
            t.join(30)
        pool.close()
    assert not deadlocks, f"{len(deadlocks)} deadlocks in {ROUNDS} rounds, the first: {deadlocks[0]}"
    # both statements did their work: every round acked all rows, and some heartbeats came first
    assert conn.execute("SELECT count(*) FROM jobs WHERE queue = 'lockorder' AND status = 'succeeded'").fetchone()[0] == ROWS
    assert any(n == ROWS for n in renewed), "no heartbeat ever ran before its round's ack"
    # (no bound on the wall time: a hang breaks the barrier, 30 s; the 1,000 rounds took
    # 42-75 s on this 2-core machine, alone or beside two other test processes)
