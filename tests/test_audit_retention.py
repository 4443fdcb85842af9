"""The audit log is kept per `retention.audit` (default 90 days), pruned by the workers' upkeep."""

from __future__ import annotations

from supervisor import defaults
from supervisor.broker import PostgresBroker
from supervisor.config import Retention, parse
from supervisor.registry import Registration
from supervisor.worker.upkeep import Upkeep, UpkeepSettings
from tests.conftest import scalar


def test_the_upkeep_prunes_the_audit_log_per_retention(conn, database_url):
    conn.execute("INSERT INTO audit_log (at, action, status) VALUES (now() - interval '91 days', 'jobs.retry', 200),"
                 " (now() - interval '2 days', 'queues.pause', 200), (now(), 'jobs.cancel', 403)")
    assert Retention().audit == defaults.RETENTION["audit"] == 90 * 86400
    broker = PostgresBroker(database_url, pool_size=2, listen_url="")
    try:
        registration = Registration(broker.pool, broker.owner, role="t", queues=[])
        upkeep = Upkeep(broker, registration, settings=UpkeepSettings(), state=lambda: "running")
        assert upkeep.prune()["audit"] == 1
        assert sorted(r[0] for r in conn.execute("SELECT action FROM audit_log")) == ["jobs.cancel", "queues.pause"]
        short = parse("roles: {w: {queues: [q], actors: [m]}}\nretention: {audit: 1d}\n").retention
        upkeep = Upkeep(broker, registration, settings=UpkeepSettings(retention=short), state=lambda: "running")
        assert upkeep.prune()["audit"] == 1
        assert scalar(conn, "SELECT action FROM audit_log") == "jobs.cancel"
    finally:
        broker.close()
