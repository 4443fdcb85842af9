"""The reap of expired leases (broker/leases.py; the worker's upkeep and the dramatiq CLI's
LeaseKeeper call it): on the broker's pool while reaps are quick; after a slow one (a
pinned horizon makes it read every lease claimed since the pin), on a connection of its
own, so claims and acks keep both of the pool's. Real PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from supervisor import db
from supervisor.broker import PostgresBroker
from supervisor.broker import leases as leases_module
from tests.conftest import scalar
from tests.pgbouncer import PgBouncer


@pytest.fixture(params=["direct", "pgbouncer"])
def broker_url(request, database_url: str) -> Iterator[str]:
    """The broker's URL: the server itself, or a PgBouncer in transaction pooling before it."""
    if request.param == "direct":
        yield database_url
        return
    bouncer = PgBouncer(database_url)
    try:
        db.mark_pooled(bouncer.url)
        yield bouncer.url
    finally:
        bouncer.stop()


def _expired_job(conn) -> str:
    """A running row of another process whose lease ran out a minute ago."""
    return str(scalar(conn, "INSERT INTO jobs (queue, actor, status, attempts, lease_owner, claimed_at, lease_expires_at)"
                            " VALUES ('tests', 'gone', 'running', 1, 'host-a:1:aaaaaa', now() - interval '2 minutes',"
                            " now() - interval '1 minute') RETURNING id"))


def test_a_slow_reap_takes_its_own_connection_until_one_is_quick(conn, broker_url, monkeypatch):
    broker = PostgresBroker(broker_url, owner="host-b:2:bbbbbb", pool_size=2, listen_url="")
    try:
        reap = broker.leases.reap_expired

        def pool_requests() -> int:
            return int(broker.pool.get_stats().get("requests_num", 0))

        def status(job: str) -> str:
            return str(scalar(conn, "SELECT status FROM jobs WHERE id = %s", (job,)))

        monkeypatch.setattr(leases_module, "REAP_ALONE_SECONDS", 0.0)  # every reap counts as slow
        first = _expired_job(conn)
        before = pool_requests()
        reap()  # on the pool: the last one was quick (there was none)
        assert pool_requests() == before + 1
        assert status(first) == "pending"

        second = _expired_job(conn)
        before = pool_requests()
        reap()  # the last was "slow": a connection of its own, none of the pool's
        assert pool_requests() == before
        assert status(second) == "pending"

        monkeypatch.setattr(leases_module, "REAP_ALONE_SECONDS", 60.0)
        reap()  # still alone (the last was slow), and quick now ...
        third = _expired_job(conn)
        before = pool_requests()
        reap()  # ... so back on the pool
        assert pool_requests() == before + 1
        assert status(third) == "pending"
    finally:
        broker.close()
