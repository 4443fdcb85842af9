"""Durable workflows where users run them: through PgBouncer in transaction pooling (the
send, the workers' outcomes that release the steps, ``Workflow.wait`` with no LISTEN to be
had) on workers of two node names, and on a database with the runtime's tables only."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg

from supervisor.testing import empty_tables
from tests.conftest import ROOT, TEST_TABLES, scalar
from tests.pgbouncer import PgBouncer
from tests.supervisor_helpers import role, write_config

# A diamond of the storm's actors (each run recorded in test_results), sent and awaited by a
# producer whose only URL is the one given (PgBouncer's): the join's result is the sum of
# its parents' (1 + 2), its state printed.
SEND_AND_WAIT = """
import supervisor
supervisor.setup_broker()
from tests.workflow_storm_actors import storm_join, storm_step
wf = supervisor.workflow("pooled")
root = wf.add(storm_step.message(0, 0.0))
b, c = wf.add(storm_step.message(1, 0.0), after=[root]), wf.add(storm_step.message(2, 0.0), after=[root])
join = wf.add(storm_join.message(), after=[b, c])
wf.send()
print(wf.wait(timeout=60), wf.results()[join])
"""


def _send_and_wait(url: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("SUPERVISOR_LISTEN_URL",)}
    out = subprocess.run([sys.executable, "-c", SEND_AND_WAIT], cwd=ROOT, capture_output=True, text=True, timeout=90,
                         env={**env, "DATABASE_URL": url, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()


def _ran_once(conn: psycopg.Connection) -> None:
    runs = conn.execute("SELECT tag, n, count(*) FROM test_results WHERE tag IN ('step', 'join')"
                        " GROUP BY 1, 2 ORDER BY 1, 2").fetchall()
    assert runs == [("join", 2, 1), ("step", 0, 1), ("step", 1, 1), ("step", 2, 1)]


def test_a_workflow_through_pgbouncer_on_two_nodes(tmp_path, conn, database_url, supervisor):
    bouncer = PgBouncer(database_url)
    try:
        # two masters of their own node names, their workers on PgBouncer's URL (LISTEN direct)
        for node in ("node-a", "node-b"):
            path = write_config(tmp_path / f"{node}.yaml", bouncer.url,
                                {"alpha": role(processes=1, threads=2, actors=("tests.workflow_storm_actors",))},
                                socket=tmp_path / f"{node}.sock", database={"listen_url": database_url})
            s = supervisor(path, env={"SUPERVISOR_NODE_NAME": node})
            s.wait_state({"alpha": 1})
            assert "(pooled)" in s.log()
        assert _send_and_wait(bouncer.url) == "succeeded 3"
        _ran_once(conn)
        nodes = scalar(conn, "SELECT count(DISTINCT host) FROM workers WHERE role = 'alpha' AND state <> 'stopped'")
        assert nodes == 2
        assert scalar(conn, "SELECT state FROM workflows") == "succeeded"
        assert scalar(conn, "SELECT count(*) FROM workflow_steps WHERE state <> 'succeeded'") == 0
    finally:
        bouncer.stop()


def test_a_workflow_on_the_runtime_tables_only(tmp_path, runtime_database_url, supervisor):
    """A database `supervisor run` made for a config of the user's own actors: no app's tables."""
    with psycopg.connect(runtime_database_url, autocommit=True) as c:
        c.execute(TEST_TABLES)
        empty_tables(c)
        assert scalar(c, "SELECT to_regclass('sources')") is None  # no app's table here
        path = write_config(tmp_path / "s.yaml", runtime_database_url,
                            {"alpha": role(processes=1, threads=2, actors=("tests.workflow_storm_actors",))})
        s = supervisor(path)
        s.wait_state({"alpha": 1})
        assert _send_and_wait(runtime_database_url) == "succeeded 3"
        _ran_once(c)
