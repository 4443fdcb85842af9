"""Background threads fail loudly (broker/threads.py): a database error in a worker's
background thread is one warning line and a retry; any other error is logged with its
traceback, counted in the worker metrics, and ends the process, which the master then
replaces. The faults are injected by tests/thread_faults.py inside real worker processes."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from supervisor import exit_codes
from supervisor.broker import threads
from tests.conftest import scalar, wait_for
from tests.http_helpers import free_port
from tests.supervisor_helpers import role, write_config

ACTORS = "tests.sample_actors,tests.thread_faults"
SAMPLE = threads.COUNTER + "_total"


def _errors_in_files(directory: Path) -> dict[str, float]:
    """actor_supervisor_thread_errors_total by thread, as the HTTP child would sum the files."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    return {s.labels["thread"]: s.value for family in registry.collect() for s in family.samples
            if s.name == SAMPLE}


def _send(conn, actor: str, n: int = 1) -> None:
    conn.execute("INSERT INTO jobs (queue, actor, kwargs) SELECT 'tests', %s, jsonb_build_object('n', g)"
                 " FROM generate_series(1, %s) g", (actor, n))


@pytest.mark.parametrize("thread", ["ack-batcher", "due-timer", "progress-writer", "upkeep"])
def test_a_bug_in_a_background_thread_ends_its_worker_with_a_traceback_counted(conn, workers, tmp_path, thread):
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    marker = tmp_path / "fired"
    w = workers(actors=ACTORS, threads=2, lease=3.0, heartbeat=0.3,
                extra_env={"THREAD_FAULT": f"{thread}:bug:{marker}", "PROMETHEUS_MULTIPROC_DIR": str(metrics)})
    _send(conn, "reporting_record")  # work for the ack batcher and the progress writer
    assert w.proc.wait(30) == exit_codes.CRASH
    log = w.stderr()
    assert marker.exists()
    assert f"background thread {thread} died of an unexpected error" in log
    assert "Traceback (most recent call last)" in log and f"RuntimeError: injected bug in {thread}" in log
    assert _errors_in_files(metrics) == {thread: 1.0}


def test_a_database_error_in_a_background_thread_is_one_line_and_retried(conn, workers, tmp_path):
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    marker = tmp_path / "fired"
    w = workers(actors=ACTORS, threads=2,
                extra_env={"THREAD_FAULT": f"ack-batcher:outage:{marker}", "PROMETHEUS_MULTIPROC_DIR": str(metrics)})
    w.wait_ready(conn)
    _send(conn, "record", 3)
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 3, 30,
             message="3 jobs acked once the write is retried")
    assert marker.exists() and w.proc.poll() is None
    log = w.stderr()
    assert "acks failed (OperationalError: injected outage in ack-batcher); retrying in" in log
    assert "Traceback" not in log and "died" not in log
    assert scalar(conn, "SELECT count(*) FROM test_results") == 3  # each ran once: the retried ack landed
    assert _errors_in_files(metrics) == {}


def test_the_master_replaces_a_worker_whose_thread_died_and_metrics_show_it(conn, database_url, tmp_path,
                                                                             supervisor):
    """The ack batcher dies after the job ran: the process ends (exit 70), the master
    replaces it, the job's lease is released and it runs again, and /metrics counts it."""
    port = free_port()
    path = write_config(tmp_path / "sup.yaml", database_url,
                        {"w": role(processes=1, threads=2, actors=ACTORS.split(","))})
    data = yaml.safe_load(path.read_text())
    data["http"] = {"listen": f"127.0.0.1:{port}"}
    path.write_text(yaml.safe_dump(data))
    marker = tmp_path / "fired"
    s = supervisor(path, env={"THREAD_FAULT": f"ack-batcher:bug:{marker}"})
    s.wait_state({"w": 1, "http": 1})
    [first_pid] = s.pids("w")
    _send(conn, "record")
    wait_for(lambda: s.pids("w") and s.pids("w") != {first_pid}, 30, message="a new worker process")
    s.wait_state({"w": 1, "http": 1})
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 1, 30,
             message="the job run again by the new process and acked")
    assert marker.exists()
    log = s.log()
    assert "background thread ack-batcher died of an unexpected error" in log
    assert "RuntimeError: injected bug in ack-batcher" in log and "Traceback (most recent call last)" in log
    assert f"exit {exit_codes.CRASH}" in log
    # It ran in the dead process (its ack never written), then again in the new one.
    assert scalar(conn, "SELECT count(*) FROM test_results") == 2
    assert scalar(conn, "SELECT count(DISTINCT pid) FROM test_results") == 2
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    counted = {s.labels["thread"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == SAMPLE}
    assert counted == {"ack-batcher": 1.0}
