"""The upkeep's reap (worker/upkeep.py): on the broker's pool while reaps are quick; after
a slow one (a pinned horizon makes it read every lease claimed since the pin), on a
connection of its own, so claims and acks keep both of the pool's. Real PostgreSQL."""

from __future__ import annotations

from supervisor.broker import PostgresBroker
from supervisor.worker import upkeep as upkeep_module
from supervisor.worker.registry import Registration
from supervisor.worker.upkeep import Upkeep, UpkeepSettings
from tests.conftest import scalar


def _expired_job(conn) -> str:
    """A running row of another process whose lease ran out a minute ago."""
    return str(scalar(conn, "INSERT INTO jobs (queue, actor, status, attempts, lease_owner, claimed_at, lease_expires_at)"
                            " VALUES ('tests', 'gone', 'running', 1, 'host-a:1:aaaaaa', now() - interval '2 minutes',"
                            " now() - interval '1 minute') RETURNING id"))


def test_a_slow_reap_takes_its_own_connection_until_one_is_quick(conn, database_url, monkeypatch):
    broker = PostgresBroker(database_url, owner="host-b:2:bbbbbb", pool_size=2, listen_url="")
    try:
        upkeep = Upkeep(broker, Registration(broker.pool, broker.owner, role="t", queues=["tests"]),
                        settings=UpkeepSettings(), state=lambda: "running")

        def pool_requests() -> int:
            return int(broker.pool.get_stats().get("requests_num", 0))

        def status(job: str) -> str:
            return str(scalar(conn, "SELECT status FROM jobs WHERE id = %s", (job,)))

        monkeypatch.setattr(upkeep_module, "REAP_ALONE_SECONDS", 0.0)  # every reap counts as slow
        first = _expired_job(conn)
        before = pool_requests()
        upkeep.reap()  # on the pool: the last one was quick (there was none)
        assert pool_requests() == before + 1
        assert status(first) == "pending"

        second = _expired_job(conn)
        before = pool_requests()
        upkeep.reap()  # the last was "slow": a connection of its own, none of the pool's
        assert pool_requests() == before
        assert status(second) == "pending"

        monkeypatch.setattr(upkeep_module, "REAP_ALONE_SECONDS", 60.0)
        upkeep.reap()  # still alone (the last was slow), and quick now ...
        third = _expired_job(conn)
        before = pool_requests()
        upkeep.reap()  # ... so back on the pool
        assert pool_requests() == before + 1
        assert status(third) == "pending"
    finally:
        broker.close()
