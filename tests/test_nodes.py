"""Node names: two supervisors on one machine with different `supervisor.node_name`
behave as two hosts. Each names its processes after its node (owner ids, the
registry, status), and one node's jobs are reclaimed by another only when their
leases expire, never while their node beats."""

from __future__ import annotations

import os
import signal

import pytest

from supervisor.config import ConfigError, load
from tests.conftest import cli, scalar, wait_for
from tests.supervisor_helpers import JobStream, role, wait_all_succeeded, write_config

LEASE = 3.0


def _node(tmp_path, database_url, name: str):
    d = tmp_path / name
    d.mkdir()
    return write_config(d / "s.yaml", database_url,
                        {"alpha": role(processes=1, threads=4, lease=f"{LEASE:g}s", heartbeat="1s",
                                       queues=("tests",))},
                        node_name=name)


def test_two_nodes_on_one_machine_act_as_two_hosts(tmp_path, conn, database_url, supervisor):
    east = supervisor(_node(tmp_path, database_url, "east"))
    west = supervisor(_node(tmp_path, database_url, "west"))
    east.wait_state({"alpha": 1})
    west.wait_state({"alpha": 1})
    assert east.status()["node"] == "east" and west.status()["node"] == "west"
    assert "node east" in cli("status", config=east.config_path).stdout
    hosts = dict(conn.execute("SELECT id, host FROM workers WHERE stopped_at IS NULL").fetchall())
    assert {h for h in hosts.values()} == {"east", "west"}
    assert all(wid.startswith(f"{host}:") for wid, host in hosts.items())

    stream = JobStream(database_url, per_second=40, sleep_s=0.5)
    stream.start()
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'running' AND lease_owner LIKE 'east:%'"),
             10, message="east running jobs")
    # Restarting west runs its orphan recovery: it must leave east's jobs alone.
    assert west.terminate() == 0
    west = supervisor(west.config_path)
    west.wait_state({"alpha": 1})
    assert scalar(conn, "SELECT count(*) FROM job_events WHERE reason LIKE '%prior owner east:%'") == 0

    # Freeze the whole east node: its jobs come back only once their leases expire.
    east_tree = [east.pid, *east.children()]
    frozen_at = scalar(conn, "SELECT clock_timestamp()")
    for pid in east_tree:
        os.kill(pid, signal.SIGSTOP)
    try:
        last_beat = scalar(conn, "SELECT max(heartbeat_at) FROM jobs WHERE status = 'running' AND lease_owner LIKE 'east:%'")
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM job_events WHERE reason LIKE '%prior owner east:%'"),
                 LEASE * 5, message="west to reclaim east's expired leases")
        first = scalar(conn, "SELECT min(at) FROM job_events WHERE reason LIKE '%prior owner east:%'")
        assert last_beat is not None and last_beat <= frozen_at
        assert (first - last_beat).total_seconds() >= LEASE, (first, last_beat)
    finally:
        for pid in east_tree:
            os.kill(pid, signal.SIGCONT)
    sent = stream.stop()
    wait_all_succeeded(conn, sent, timeout=60)
    assert scalar(conn, "SELECT count(DISTINCT job_id) FROM test_results") == sent


@pytest.mark.parametrize("name", ["has space", "a:b", "x" * 64])
def test_a_bad_node_name_is_a_config_error(tmp_path, database_url, name):
    path = write_config(tmp_path / "s.yaml", database_url, {"alpha": role()}, node_name=name)
    with pytest.raises(ConfigError, match="node_name"):
        load(path)
