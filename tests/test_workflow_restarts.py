"""A workflow lives through what an operator does to a running fleet (issue 41's "a step runs
once and none is lost under reloads and PostgreSQL restarts"): a `supervisor reload` that
replaces the workers' processes, then a restart of PostgreSQL itself, while its steps run.
Every step runs once, the join once with every result in order, nothing is left behind."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg

from tests.conftest import ROOT, cli, scalar, wait_for
from tests.supervisor_helpers import role, write_config

# Steps of 0.1 s: 5-7 s of work on the 6-8 threads, so the workflow is still running after
# the reload (which may wait for the old workers' jobs) and at the restart (asserted).
STEPS = 500

SEND = f"""
import supervisor
supervisor.setup_broker()
from tests.workflow_storm_actors import storm_join, storm_step
wf = supervisor.workflow("restarts")
root = wf.add(storm_step.message(-1, 0.0))
mids = [wf.add(storm_step.message(i, 0.1), after=[root]) for i in range({STEPS})]
wf.add(storm_join.message(), after=mids)
print(wf.send().id)
"""


def test_a_workflow_through_a_reload_and_a_postgres_restart(tmp_path, private_server, supervisor):
    url = private_server.url
    path = write_config(tmp_path / "s.yaml", url,
                        {"alpha": role(processes=2, threads=4, actors=("tests.workflow_storm_actors",))})
    s = supervisor(path)
    s.wait_state({"alpha": 2})
    sent = subprocess.run([sys.executable, "-c", SEND], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(ROOT)})
    assert sent.returncode == 0, sent.stderr
    wid = sent.stdout.strip()

    def steps_run() -> int:
        with psycopg.connect(url, autocommit=True) as c:
            return int(scalar(c, "SELECT count(*) FROM test_results WHERE tag = 'step'"))

    # A reload that replaces every worker process (their threads change) while steps run.
    wait_for(lambda: steps_run() >= 20, 60, interval=0.05, message="the first steps to run")
    old = s.pids("alpha")
    write_config(path, url, {"alpha": role(processes=2, threads=3, actors=("tests.workflow_storm_actors",))})
    assert cli("reload", config=path).returncode == 0
    wait_for(lambda: not (s.pids("alpha") & old) and len(s.pids("alpha")) == 2, 60,
             message="the reload to replace the workers")
    # Then PostgreSQL restarts while the rest run.
    before = steps_run()
    wait_for(lambda: steps_run() >= before + 20, 60, interval=0.05, message="steps to run after the reload")
    assert steps_run() < STEPS, "the workflow ended before the restart: make its steps longer"
    private_server.stop()
    private_server.start()
    with psycopg.connect(url, autocommit=True) as c:
        wait_for(lambda: scalar(c, "SELECT state FROM workflows WHERE id = %s", (wid,)) != "running", 120,
                 interval=0.2, message="the workflow to end after the restart")
        assert scalar(c, "SELECT state FROM workflows WHERE id = %s", (wid,)) == "succeeded"
        runs = c.execute("SELECT n, count(*) FROM test_results WHERE tag = 'step' GROUP BY n HAVING count(*) <> 1"
                         ).fetchall()
        assert runs == [], f"steps run other than once (step, runs): {runs[:10]}"
        assert scalar(c, "SELECT count(DISTINCT n) FROM test_results WHERE tag = 'step'") == STEPS + 1
        assert scalar(c, "SELECT count(*) FROM test_results WHERE tag = 'join'") == 1
        # the join's parents' results, in order: the sum of 0..STEPS-1
        assert scalar(c, "SELECT n FROM test_results WHERE tag = 'join-sum'") == sum(range(STEPS))
        assert scalar(c, "SELECT count(*) FROM workflow_steps WHERE state <> 'succeeded'") == 0
