"""/metrics, /healthz and /readyz of the master's HTTP child, after real work by two
worker processes: the numbers must match what the database says happened."""

from __future__ import annotations

import json
import os
import signal
from collections import defaultdict
from pathlib import Path

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import scalar, wait_for
from tests.http_helpers import free_port
from tests.supervisor_helpers import role, write_config


def _config(tmp_path: Path, url: str, port: int, **supervisor_settings) -> Path:
    cfg = write_config(tmp_path / "sup.yaml", url, {"w": role(processes=2, threads=2)}, **supervisor_settings)
    data = yaml.safe_load(cfg.read_text())
    data["http"] = {"listen": f"127.0.0.1:{port}"}
    cfg.write_text(yaml.safe_dump(data))
    return cfg


def _samples(text: str) -> dict[str, dict[tuple, float]]:
    out: dict[str, dict[tuple, float]] = defaultdict(dict)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name][tuple(sorted(s.labels.items()))] = s.value
    return out


def _by_actor(samples: dict[tuple, float]) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for labels, value in samples.items():
        totals[dict(labels)["actor_name"]] += value
    return totals


def _enqueue(conn, actor: str, args: list, n: int, max_attempts: int = 1) -> None:
    conn.execute("INSERT INTO jobs (queue, actor, args, max_attempts) "
                 "SELECT 'tests', %s, %s, %s FROM generate_series(1, %s)", (actor, json.dumps(args), max_attempts, n))


def test_metrics_match_the_database_after_work_on_two_processes(conn, database_url, tmp_path, supervisor):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    s = supervisor(_config(tmp_path, database_url, port))
    s.wait_state({"w": 2, "http": 1})
    _enqueue(conn, "record", [0, 0.2], 20)
    _enqueue(conn, "flaky", [99], 3, max_attempts=3)  # fails all 3 attempts
    _enqueue(conn, "noop", [], 20)
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status IN ('succeeded', 'failed')") == 43,
             60, message=f"all jobs finished {conn.execute('SELECT actor, status, count(*) FROM jobs GROUP BY 1, 2').fetchall()} {s.log()[-3000:]}")
    assert scalar(conn, "SELECT count(DISTINCT pid) FROM test_results WHERE n = 0") == 2  # both processes worked
    attempts = dict(conn.execute("SELECT actor, sum(attempts) FROM jobs GROUP BY actor").fetchall())
    failed_attempts = scalar(conn, "SELECT sum(attempts) FROM jobs WHERE actor = 'flaky'")

    # Acks are batched: the counters are written when the actor returns, so they are final now.
    r = httpx.get(base + "/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    m = _samples(r.text)
    assert _by_actor(m["dramatiq_messages_total"]) == {a: float(n) for a, n in attempts.items()}
    errors = {a: n for a, n in _by_actor(m["dramatiq_message_errors_total"]).items() if n}
    assert errors == {"flaky": float(failed_attempts)}
    assert _by_actor(m["dramatiq_message_retries_total"]) == {"flaky": 2.0 * 3}
    assert _by_actor(m["dramatiq_message_duration_milliseconds_count"]) == _by_actor(m["dramatiq_messages_total"])
    assert sum(m["dramatiq_messages_inprogress"].values()) == 0
    # Snapshot gauges: one per queue and state, as SQL counts them; processes from the registry.
    assert {dict(k)["state"]: v for k, v in m["actor_supervisor_jobs"].items() if dict(k)["queue"] == "tests"} == {
        "ready": 0, "scheduled": 0, "running": 0, "retryable": 0}
    assert m["actor_supervisor_jobs_finished_last_hour"][(("outcome", "failed"), ("queue", "tests"))] == 3
    assert m["actor_supervisor_jobs_finished_last_hour"][(("outcome", "succeeded"), ("queue", "tests"))] == 40
    assert m["actor_supervisor_queue_active_workers"][(("queue", "tests"),)] == 2
    assert m["actor_supervisor_role_processes"][(("role", "w"),)] == 2
    assert m["actor_supervisor_database_up"][()] == 1
    pids = {dict(k)["pid"] for k in m["actor_supervisor_process_rss_bytes"]}
    assert {str(p) for p in s.pids("w")} <= pids
    assert all(v > 0 for v in m["actor_supervisor_process_rss_bytes"].values())

    # A worker killed mid-job: its counts stay (files of dead pids are summed), its
    # in-progress gauge goes (the master marks the pid dead), and the restart shows.
    _enqueue(conn, "slow", [30], 1)
    victim = wait_for(lambda: scalar(conn, "SELECT max(lease_owner) FROM jobs WHERE actor = 'slow' AND status = 'running'"),
                      30, message="slow job running")
    pid = int(str(victim).split(":")[1])
    seen: list[dict] = []

    def in_progress() -> float:
        seen.append(_samples(httpx.get(base + "/metrics", timeout=20).text))
        return sum(seen[-1]["dramatiq_messages_inprogress"].values())

    try:
        wait_for(lambda: in_progress() == 1, 20, interval=0.1, message="in progress shows 1")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last seen {[m['dramatiq_messages_inprogress'] for m in seen[-1:]]}") from None
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: any(r["name"] == "w" and r["restarts"] == 1 for r in s.status()["roles"]), 20)
    # At-least-once: the job is delivered again to another process. Its gauge shows that
    # run alone: the dead pid's in-progress gauge went with it (2 if it had stayed).
    wait_for(lambda: scalar(conn, "SELECT coalesce((SELECT lease_owner <> %s FROM jobs WHERE actor = 'slow'"
                                  " AND status = 'running'), false)", (victim,)),
             20, message="the slow job running again elsewhere")
    wait_for(lambda: in_progress() == 1, 10, interval=0.1, message="only the new run in progress")
    # the scrape the wait ended on (a loaded run once saw 0 in the scrape after it)
    after = seen[-1]
    assert sum(after["dramatiq_messages_inprogress"].values()) == 1
    assert _by_actor(after["dramatiq_messages_total"])["record"] == attempts["record"]
    assert after["actor_supervisor_role_restarts_total"][(("role", "w"),)] == 1


def test_health_and_readiness(conn, database_url, tmp_path, supervisor):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cfg = _config(tmp_path, database_url, port)
    data = yaml.safe_load(cfg.read_text())
    data["roles"]["w"]["actors"] = ["tests.slow_start_actors"]
    cfg.write_text(yaml.safe_dump(data))
    held = tmp_path / "hold-start"
    s = supervisor(cfg, env={"SLOW_START_FILE": str(held)})
    s.wait_state({"w": 2, "http": 1})
    health = wait_for(lambda: httpx.get(base + "/healthz").json(), 10)
    assert health["ok"] and health["pid"] == s.pid
    assert wait_for(lambda: httpx.get(base + "/readyz").status_code == 200, 10)
    # The replacement of a killed worker is held at its start (slow_start_actors) until the
    # test has seen the role short: a ready child is replaced at once, and without the hold
    # a fast replacement could be ready again between two polls.
    held.touch()
    victim = sorted(s.pids("w"))[0]
    os.kill(victim, signal.SIGKILL)
    r = wait_for(lambda: (r := httpx.get(base + "/readyz")).status_code == 503 and r, 30, message="readyz 503")
    assert any(p.startswith("role w: 1 of 2") for p in r.json()["problems"]), r.json()
    held.unlink()
    assert wait_for(lambda: httpx.get(base + "/readyz").status_code == 200, 30, message="ready again")
