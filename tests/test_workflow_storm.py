"""A workflow of 2,000 steps (one root, 1,998 parallel steps, one join) while a worker process
is SIGKILLed every 2 s (issue 41's target), in both stores: every step succeeds once (its
release once: a step run again, killed before its ack, releases nothing twice), the join runs
once with 1,998 results in order, nothing is left blocked or enqueued."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

from tests.conftest import ROOT, scalar, wait_for
from tests.supervisor_helpers import role, write_config

STEPS = 1998

SEND = f"""
import supervisor
supervisor.setup_broker()
from tests.workflow_storm_actors import storm_join, storm_step
wf = supervisor.workflow("storm")
root = wf.add(storm_step.message(-1, 0.0))
mids = [wf.add(storm_step.message(i, 0.02), after=[root]) for i in range({STEPS})]
wf.add(storm_join.message(), after=mids)
print(wf.send().id)
"""


def test_a_2000_step_workflow_under_a_sigkill_storm(tmp_path, conn, database_url, supervisor):
    path = write_config(tmp_path / "s.yaml", database_url,
                        {"alpha": role(processes=2, threads=4, actors=("tests.workflow_storm_actors",))})
    s = supervisor(path)
    s.wait_state({"alpha": 2})
    sent = subprocess.run([sys.executable, "-c", SEND], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "DATABASE_URL": database_url, "PYTHONPATH": str(ROOT)})
    assert sent.returncode == 0, sent.stderr
    wid = sent.stdout.strip()
    killed: set[int] = set()
    deadline = time.monotonic() + 180
    while scalar(conn, "SELECT state FROM workflows WHERE id = %s", (wid,)) == "running":
        assert time.monotonic() < deadline, "the workflow did not end: " + str(
            conn.execute("SELECT state, count(*) FROM workflow_steps GROUP BY 1").fetchall())
        pids = sorted(s.pids("alpha") - killed)
        if pids and scalar(conn, "SELECT count(*) FROM test_results WHERE tag = 'step'") > 0:
            victim = pids[len(killed) % len(pids)]
            os.kill(victim, signal.SIGKILL)
            killed.add(victim)
        # the storm's period: 2 s, or the workflow's end, whichever comes first
        with contextlib.suppress(AssertionError):
            wait_for(lambda: scalar(conn, "SELECT state FROM workflows WHERE id = %s", (wid,)) != "running", 2.0,
                     interval=0.05)
    assert len(killed) >= 2, "the storm killed fewer than 2 processes: make the steps longer"
    ended = conn.execute("SELECT state, reason FROM workflows WHERE id = %s", (wid,)).fetchone()
    assert ended[0] == "succeeded", (ended, conn.execute("SELECT state, count(*) FROM workflow_steps GROUP BY 1").fetchall())
    assert scalar(conn, "SELECT count(*) FROM workflow_steps WHERE state <> 'succeeded'") == 0
    assert scalar(conn, "SELECT count(DISTINCT n) FROM test_results WHERE tag = 'step'") == STEPS + 1
    # the join once, with every result in order (0 + 1 + ... + 1997)
    assert conn.execute("SELECT tag, n FROM test_results WHERE tag LIKE 'join%' ORDER BY tag").fetchall() == [
        ("join", STEPS), ("join-sum", sum(range(STEPS)))]
    # a step that ran twice was killed before its ack: one of its runs was in a killed process
    twice = conn.execute("SELECT n, array_agg(pid) FROM test_results WHERE tag = 'step' GROUP BY n"
                         " HAVING count(*) > 1").fetchall()
    assert all(set(pids) & killed for _, pids in twice), twice
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE actor LIKE 'storm_%' AND status = 'succeeded'") >= STEPS + 2
