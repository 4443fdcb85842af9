"""The tools a Dramatiq user brings along: the pytest plugin (supervisor.testing) running
actor tests written as Dramatiq's docs write them, and the `dramatiq` CLI as a worker.
Both run as real subprocesses against the test server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import dramatiq
import psutil
from dramatiq.message import Message

from supervisor import testing
from supervisor.broker import PostgresBroker
from supervisor.identity import node_name
from tests.conftest import ROOT, _server_url, scalar, wait_for


def write(base: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = base / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


# An app and its tests, as Dramatiq's testing guide writes them (stub_broker /
# stub_worker fixtures, send, join, assert), pointed at the plugin's fixtures.
PLUGIN_PROJECT = {
    "myapp/__init__.py": "",
    "myapp/actors.py": """
        import dramatiq

        counted = []

        @dramatiq.actor(max_retries=0)
        def count_words(url):
            counted.append(len(url.split("/")))

        @dramatiq.actor(max_retries=0)
        def fails():
            raise ValueError("bad url")
    """,
    "conftest.py": """
        import pytest

        pytest_plugins = ["supervisor.testing"]

        @pytest.fixture
        def stub_broker(supervisor_broker):
            supervisor_broker.flush_all()
            return supervisor_broker

        @pytest.fixture
        def stub_worker(supervisor_worker):
            return supervisor_worker
    """,
    "test_actors.py": """
        import dramatiq
        import pytest

        from myapp.actors import count_words, counted, fails

        def test_count_words(stub_broker, stub_worker):
            count_words.send("http://example.com/a/b")
            stub_broker.join(count_words.queue_name)
            stub_worker.join()
            assert counted == [5]
            assert type(dramatiq.get_broker()).__name__ == "PostgresBroker"

        def test_a_failure_is_raised_by_join(stub_broker, stub_worker):
            fails.send()
            with pytest.raises(ValueError, match="bad url"):
                stub_broker.join(fails.queue_name, fail_fast=True)

        def test_tables_are_emptied_between_tests(stub_broker):
            with stub_broker.pool.connection() as conn:
                assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0
    """,
}


def test_the_pytest_plugin_runs_actor_tests_written_for_the_stub_broker(tmp_path):
    write(tmp_path, PLUGIN_PROJECT)
    # The plugin's server is this session's (TEST_DATABASE_URL's, or the embedded one in
    # .state/test): left to its default, it started one in the user's state directory.
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", testing.SERVER_ENV: _server_url()}
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout


CLI_PROJECT = {
    "cliapp/__init__.py": """
        import supervisor

        supervisor.setup_broker()
    """,
    "cliapp/actors.py": """
        import os

        import dramatiq

        @dramatiq.actor(queue_name="cli", max_retries=0)
        def cli_record(n):
            with dramatiq.get_broker().pool.connection() as c:
                c.execute("INSERT INTO test_results (job_id, n, pid) VALUES (gen_random_uuid(), %s, %s)",
                          (n, os.getpid()))
    """,
}


def test_the_dramatiq_cli_drains_a_queue(tmp_path, conn, database_url):
    write(tmp_path, CLI_PROJECT)
    producer = PostgresBroker(database_url)
    try:
        producer.enqueue_many(
            [Message(queue_name="cli", actor_name="cli_record", args=(i,), kwargs={}, options={}) for i in range(50)]
        )
    finally:
        producer.close()
    env = {**os.environ, "DATABASE_URL": database_url, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    log = (tmp_path / "dramatiq.log").open("w")
    cli = subprocess.Popen([sys.executable, "-m", "dramatiq", "cliapp.actors", "--processes", "1", "--threads", "2"],
                           cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE queue = 'cli' AND status = 'succeeded'") == 50,
                 60, message="the dramatiq CLI to run 50 jobs")
        # Its worker process is in the registry as a supervisor worker is (nodes, the
        # dashboard's Workers page, the metrics): its queue, the rows it may hold (Dramatiq's
        # prefetch, 2 x threads a queue), beating.
        row = wait_for(lambda: conn.execute(
            "SELECT id, host, pid, queues, capacity, state, beat_seconds, heartbeat_at > now() - interval '15 s'"
            " FROM workers WHERE role = 'dramatiq'").fetchall(), 15, message="the CLI's process registered")
        [(owner, host, pid, queues, capacity, state, beat, fresh)] = row
        assert (host, queues, capacity, state, beat, fresh) == (node_name(), ["cli"], 4, "running", 10.0, True)
        assert psutil.Process(pid).parent().pid == cli.pid  # Dramatiq's worker process, a child of the CLI
    finally:
        cli.send_signal(signal.SIGTERM)
        code = cli.wait(60)
        log.close()
    output = (tmp_path / "dramatiq.log").read_text()
    assert code == 0, output
    assert scalar(conn, "SELECT count(DISTINCT n) FROM test_results") == 50
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE status <> 'succeeded'") == 0
    # Stopped, it said so (broker.close(): the keeper's last write).
    assert conn.execute("SELECT state, stopped_at IS NOT NULL FROM workers WHERE id = %s", (owner,)).fetchone() == (
        "stopped", True)


def test_a_broker_made_for_the_cli_keeps_its_leases(conn, database_url):
    """Under the dramatiq CLI no supervisor upkeep runs: the broker renews what it
    holds and returns the expired leases of processes that died."""
    broker = PostgresBroker(database_url, keep_leases=True, lease_seconds=1.5, pool_size=2)
    try:
        broker.declare_queue("kept")
        dramatiq.actor(lambda: None, actor_name="a", queue_name="kept", broker=broker)
        held = broker.enqueue(Message(queue_name="kept", actor_name="a", args=(), kwargs={}, options={}))
        dead = scalar(conn, "INSERT INTO jobs (queue, actor, status, attempts, lease_owner, lease_expires_at,"
                            " claimed_at) VALUES ('elsewhere', 'a', 'running', 1, 'gone:1:dead',"
                            " now() - interval '1 minute', now() - interval '2 minutes') RETURNING id")
        consumer = broker.consume("kept", prefetch=1, timeout=5000)
        claimed = next(consumer)
        assert claimed is not None and claimed.message_id == held.message_id
        wait_for(lambda: scalar(conn, "SELECT heartbeat_at > claimed_at + interval '1.6 seconds'"
                                      " AND lease_expires_at > now() FROM jobs WHERE id = %s", (held.message_id,)),
                 20, message="the lease to be renewed past its first expiry")
        wait_for(lambda: scalar(conn, "SELECT status FROM jobs WHERE id = %s", (dead,)) == "pending", 20,
                 message="the dead process's job to be reaped")
        consumer.requeue([claimed])
    finally:
        broker.close()
