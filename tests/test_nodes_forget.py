"""`supervisor nodes list|forget`: a host known to be gone gives its jobs back at once,
never while it still beats."""

from __future__ import annotations

import json

from tests import test_liveness
from tests.conftest import cli, scalar, wait_for
from tests.test_liveness import ACTORS, LEASE, assert_ran_again_once, started_by

BEAT = 1.0
via = test_liveness.via  # the fixture: each job sent through job_queue, then through the log


def test_a_dead_nodes_jobs_come_back_at_once_when_forgotten_never_while_it_beats(conn, workers, database_url, via):
    env = {"LIVENESS_RESULTS_URL": database_url, "SUPERVISOR_NODE_NAME": "east"}
    east = workers(queues="liveness", actors=ACTORS, threads=1, lease=LEASE, heartbeat=BEAT, extra_env=env)
    east.wait_ready(conn, timeout=90)
    owner = east.owner(conn)
    # long enough to outlast three CLI runs (each 1 s on an idle machine; a loaded CI run's
    # took the 3 s job this had to its end before the refused forget was checked)
    job = via(conn, 10)
    wait_for(lambda: started_by(conn, job) == [east.pid], 15, message="east to run the job")

    listed = json.loads(cli("nodes", "list", "--json", url=database_url).stdout)
    assert [(n["node"], n["live_processes"], n["beating"]) for n in listed if n["node"] == "east"] == [("east", 1, True)]
    refused = cli("nodes", "forget", "east", url=database_url)
    assert refused.returncode == 1 and "node 'east' still beats" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (job,)) == "running"

    east.kill()  # no other worker lives to notice it: only the lease (30 s) would give it back
    wait_for(lambda: not json.loads(cli("nodes", "list", "--json", url=database_url).stdout)[0]["beating"],
             10 * BEAT, interval=0.2, message="east to stop beating")
    done = cli("nodes", "forget", "east", "--json", url=database_url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"node": "east", "jobs_released": 1, "processes_lost": 1,
                                       "failed_as_poison": 0}
    assert scalar(conn, "SELECT state FROM workers WHERE id = %s", (owner,)) == "lost"
    assert f"node east forgotten; prior owner {owner}" in scalar(
        conn, "SELECT reason FROM job_events WHERE job_id = %s AND from_status = 'running'", (job,))

    west = workers(queues="liveness", actors=ACTORS, threads=1, lease=LEASE, heartbeat=BEAT,
                   extra_env={"LIVENESS_RESULTS_URL": database_url, "SUPERVISOR_NODE_NAME": "west"})
    west.wait_ready(conn, timeout=90)
    assert_ran_again_once(conn, job, east.pid, west.pid, timeout=30)
    unknown = cli("nodes", "forget", "nowhere", url=database_url)
    assert unknown.returncode == 1 and "no node 'nowhere'" in unknown.stderr
