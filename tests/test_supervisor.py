"""The master with real children: status, scale, crash handling, hangs, recycling,
the resource guard and shutdown."""

from __future__ import annotations

import json
import os
import signal
import time

import psutil

from tests.conftest import scalar, wait_for
from tests.supervisor_helpers import (
    JobStream,
    assert_exactly_once,
    cli,
    dead,
    enqueue,
    role,
    wait_all_succeeded,
    write_config,
)


def test_two_roles_status_titles_and_registry(tmp_path, conn, database_url, supervisor):
    path = write_config(tmp_path / "s.yaml", database_url, {
        "alpha": role(processes=2, threads=2),
        "beta": role(processes=1, threads=2, queues=["other"]),
    })
    s = supervisor(path)
    s.wait_ready()
    state = s.wait_state({"alpha": 2, "beta": 1})
    enqueue(conn, 20)
    enqueue(conn, 5, queue="other")
    wait_all_succeeded(conn, 25)

    result = cli("status", "--json", config=path)
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["pid"] == s.pid and status["state"] == "running"
    roles = {r["name"]: r for r in status["roles"]}
    assert (roles["alpha"]["wanted"], roles["alpha"]["running"]) == (2, 2)
    assert (roles["beta"]["wanted"], roles["beta"]["running"]) == (1, 1)
    for r in roles.values():
        assert r["state"] == "running" and r["restarts"] == 0 and r["last_exit"] is None
        for p in r["processes"]:
            assert p["state"] == "running" and p["uptime"] > 0 and p["rss"] > 10 << 20
            assert {"cpu", "in_flight", "done", "slot"} <= set(p)
    # Every job is counted by the process that ran it (the beats catch up within a tick).
    wait_for(lambda: sum(p["done"] for r in s.roles().values() for p in r["processes"]) == 25, 5,
             message="25 jobs counted as done across the processes")
    human = cli("status", config=path)
    assert human.returncode == 0 and "alpha: 2/2 running" in human.stdout and "beta: 1/1 running" in human.stdout

    # Readable titles, and a workers row per process (the master's too).
    titles = {psutil.Process(p["pid"]).cmdline()[0] for r in roles.values() for p in r["processes"]}
    assert titles == {"supervisor: alpha[1]", "supervisor: alpha[2]", "supervisor: beta[1]"}
    assert psutil.Process(s.pid).cmdline()[0] == "supervisor: master"
    rows = dict(conn.execute("SELECT pid, role FROM workers WHERE stopped_at IS NULL").fetchall())
    expected = {p["pid"]: name for name, r in roles.items() for p in r["processes"]}
    assert rows == {**expected, s.pid: "master"}
    owners = {p["owner"] for r in roles.values() for p in r["processes"]}
    assert owners == set(scalar(conn, "SELECT array_agg(id) FROM workers WHERE role <> 'master'"))
    assert state["roles"]

    # SIGTERM: every role drains, the master exits 0, every row says stopped.
    children = s.children()
    assert s.terminate(timeout=30) == 0
    wait_for(lambda: all(dead(pid) for pid in children), 10, message="children gone")
    assert scalar(conn, "SELECT count(*) FROM workers WHERE stopped_at IS NULL") == 0


def test_scale_up_and_down_under_load(tmp_path, conn, database_url, supervisor):
    path = write_config(tmp_path / "s.yaml", database_url, {"alpha": role(processes=1, threads=2)})
    s = supervisor(path)
    s.wait_state({"alpha": 1})
    stream = JobStream(database_url, per_second=80, sleep_s=0.01)
    stream.start()
    first = s.pids("alpha")

    up = cli("scale", "alpha", "3", config=path)
    assert up.returncode == 0, up.stderr
    assert "alpha: scaled 1 -> 3" in up.stdout
    state = s.wait_state({"alpha": 3}, timeout=5)  # the reply came once they were ready
    assert first <= {p["pid"] for p in state["roles"][0]["processes"]}  # resized in place
    assert state["roles"][0]["scaled"] is True
    wait_for(lambda: scalar(conn, "SELECT count(DISTINCT pid) FROM test_results") >= 2, 10,
             message="new processes take jobs")

    down = cli("scale", "alpha", "1", config=path)
    assert down.returncode == 0, down.stderr
    s.wait_state({"alpha": 1}, timeout=5)
    assert "scaled down; exited 0" in s.roles()["alpha"]["last_exit"]
    assert s.roles()["alpha"]["restarts"] == 0

    bad = cli("scale", "nope", "2", config=path)
    assert bad.returncode == 1 and "no role 'nope'" in bad.stderr
    sent = stream.stop()
    assert_exactly_once(conn, sent)


def test_crash_looping_role_never_stops_another(tmp_path, conn, database_url, supervisor):
    path = write_config(tmp_path / "s.yaml", database_url, {
        "good": role(processes=1),
        "broken": role(processes=2, queues=["nowhere"], actors=["tests.no_such_module"]),
    })
    s = supervisor(path)
    s.wait_ready()
    broken = wait_for(lambda: (r := s.roles()["broken"])["state"] == "crash-looping" and r, 20,
                      message="broken role crash-looping")
    assert broken["restarts"] >= 3 and "cannot be imported" in broken["last_exit"]
    assert s.status()["state"] == "running"  # READY despite the broken role: it is reported, not fatal
    enqueue(conn, 10)
    wait_all_succeeded(conn, 10)
    good = s.roles()["good"]
    assert good["restarts"] == 0 and good["running"] == 1
    # It keeps retrying at the capped delay (1s here), one probe at a time.
    before = broken["restarts"]
    wait_for(lambda: s.roles()["broken"]["restarts"] >= before + 2, 10, message="still retrying")
    assert len(s.roles()["broken"]["processes"]) <= 1


def test_dead_child_is_replaced_and_its_leases_released_at_once(tmp_path, conn, database_url, supervisor):
    path = write_config(tmp_path / "s.yaml", database_url, {"alpha": role(processes=2, threads=2, lease="30s",
                                                                         heartbeat="5s")})
    s = supervisor(path)
    s.wait_state({"alpha": 2})
    enqueue(conn, 4, sleep_s=3)
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'running'") == 4, 10)
    victim_pid, owner = conn.execute(
        "SELECT w.pid, w.id FROM workers w JOIN jobs j ON j.lease_owner = w.id LIMIT 1").fetchone()
    killed_at = time.time()
    os.kill(victim_pid, signal.SIGKILL)
    # Back to pending within a second, though the lease has 30s to run.
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE lease_owner = %s", (owner,)) == 0, 2,
             message="leases released")
    released = scalar(conn, "SELECT max(at) FROM job_events WHERE to_status = 'pending' AND reason LIKE %s",
                      (f"%prior owner {owner}%",))
    assert released.timestamp() - killed_at < 1.0
    state = s.wait_state({"alpha": 2}, timeout=10)
    alpha = state["roles"][0]
    assert victim_pid not in {p["pid"] for p in alpha["processes"]}
    assert alpha["restarts"] == 1 and alpha["last_exit"] == "killed by SIGKILL"
    # The master's janitor thread writes it after the release (the master never waits on the
    # database): a loaded full run once read the row before that write.
    wait_for(lambda: scalar(conn, "SELECT state FROM workers WHERE id = %s", (owner,)) == "crashed", 10,
             message="the dead process marked crashed")
    wait_all_succeeded(conn, 4, timeout=30)


def test_hung_child_is_terminated_killed_and_replaced(tmp_path, conn, database_url, supervisor):
    path = write_config(tmp_path / "s.yaml", database_url,
                        {"alpha": role(processes=2, threads=2, lease="2s", heartbeat="500ms")}, kill_grace="1s")
    s = supervisor(path)
    state = s.wait_state({"alpha": 2})
    victim = state["roles"][0]["processes"][0]["pid"]
    os.kill(victim, signal.SIGSTOP)  # silent: no beats, and it cannot act on SIGTERM either
    try:
        wait_for(lambda: dead(victim), 15, message="hung child killed")
        state = s.wait_state({"alpha": 2}, timeout=10)
        alpha = state["roles"][0]
        assert alpha["last_exit"].startswith("hung: no beat for") and "SIGKILL" in alpha["last_exit"]
        assert alpha["restarts"] == 1
    finally:
        if not dead(victim):
            os.kill(victim, signal.SIGKILL)


def test_recycle_after_max_jobs_is_rolling(tmp_path, conn, database_url, supervisor):
    path = write_config(tmp_path / "s.yaml", database_url,
                        {"alpha": role(processes=2, threads=2, limits={"max_jobs": 30})})
    s = supervisor(path)
    s.wait_state({"alpha": 2})
    enqueue(conn, 300, sleep_s=0.05)  # ~8s at 40 jobs/s: several recycles per slot
    serving: list[int] = []

    def all_done() -> bool:
        # Sampled on every poll: how many processes were claiming at that moment.
        procs = s.roles()["alpha"]["processes"]
        serving.append(sum(1 for p in procs if p["ready"] and not p["stop_reason"]))
        return scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 300

    wait_for(all_done, 60, interval=0.05, message="300 jobs done")
    least_serving = min(serving)
    assert_exactly_once(conn, 300)
    assert len(s.seen) >= 4, "processes were recycled"
    # Rolled: a replacement was ready before each old process was drained, so the
    # role never had fewer than its 2 processes claiming.
    assert least_serving == 2
    alpha = s.roles()["alpha"]
    assert alpha["restarts"] == 0
    assert scalar(conn, "SELECT count(DISTINCT pid) FROM test_results") >= 3



def test_recycle_past_max_rss_is_rolling(tmp_path, conn, database_url, supervisor):
    # Every worker is over 1MB of RSS from its start: each asks to be recycled, and the
    # master rolls the role (a replacement ready first), one at a time, with no job lost
    # or run twice and no restart counted against the role.
    path = write_config(tmp_path / "s.yaml", database_url,
                        {"alpha": role(processes=1, threads=2, limits={"max_rss": "1MB"})})
    s = supervisor(path)
    s.wait_state({"alpha": 1})
    enqueue(conn, 100, sleep_s=0.05)
    serving: list[int] = []

    def recycled_and_done() -> bool:
        procs = s.roles()["alpha"]["processes"]
        serving.append(sum(1 for p in procs if p["ready"] and not p["stop_reason"]))
        done = scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 100
        return done and len(s.seen) >= 3

    wait_for(recycled_and_done, 60, interval=0.05, message="100 jobs done and two recycles")
    assert_exactly_once(conn, 100)
    assert min(serving) >= 1  # rolled: never without a claiming process
    alpha = s.roles()["alpha"]
    assert alpha["restarts"] == 0
    assert "max_rss" in (alpha["last_exit"] or ""), alpha["last_exit"]


def test_resource_guard_pauses_claiming_until_reload(tmp_path, conn, database_url, supervisor, http_server):
    # Any host uses more than 1% of its memory: the guard must stop claiming.
    path = write_config(tmp_path / "s.yaml", database_url,
                        {"alpha": role(processes=1, limits={"memory_percent": 1})})
    s = supervisor(path)
    s.wait_state({"alpha": 1})
    wait_for(lambda: s.roles()["alpha"]["processes"][0]["paused"], 10, message="paused")
    proc = s.roles()["alpha"]["processes"][0]
    assert proc["state"] == "paused" and "host memory" in proc["paused"]
    enqueue(conn, 5)
    # Two fresh heartbeats of the worker after the enqueue: it has run its loop and
    # seen the NOTIFY (a claim takes milliseconds), and still claimed nothing.
    for _ in range(2):
        since = scalar(conn, "SELECT now()")
        wait_for(lambda since=since: scalar(conn, "SELECT heartbeat_at > %s FROM workers WHERE pid = %s",
                                            (since, proc["pid"])), 10, message="a fresh heartbeat")
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'pending'") == 5
    # The reason reaches every host's readers through the process's beat, not only its master.
    assert "host memory" in scalar(conn, "SELECT paused_reason FROM workers WHERE pid = %s", (proc["pid"],))
    shown = cli("status", config=path)
    assert f"pid {proc['pid']} (alpha) not claiming: host memory" in shown.stdout, shown.stdout
    elsewhere = http_server(url=database_url)  # standalone: no master of its own to ask
    [w] = [w for w in elsewhere.client.get("/api/v1/workers").json()["workers"] if w["pid"] == proc["pid"]]
    assert "host memory" in w["paused_why"] and "host memory" in w["paused_reason"]
    assert "backing off: host memory" in elsewhere.client.get("/workers").text
    write_config(path, database_url, {"alpha": role(processes=1)})
    assert cli("reload", config=path).returncode == 0
    wait_all_succeeded(conn, 5)


def test_sigterm_kills_stragglers_after_the_shutdown_timeout(tmp_path, conn, database_url, supervisor):
    path = write_config(tmp_path / "s.yaml", database_url,
                        {"alpha": role(processes=2, threads=2, shutdown_timeout="2s"),
                         "beta": role(processes=1, threads=2, queues=["other"], shutdown_timeout="2s")},
                        shutdown_timeout="3s")
    s = supervisor(path)
    state = s.wait_state({"alpha": 2, "beta": 1})
    enqueue(conn, 2, sleep_s=1.0)
    enqueue(conn, 1, sleep_s=1.0, queue="other")
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'running'") == 3, 10)
    stuck = state["roles"][0]["processes"][0]["pid"]
    os.kill(stuck, signal.SIGSTOP)  # a straggler that will never finish draining
    started = time.monotonic()
    assert s.terminate(timeout=30) == 0
    took = time.monotonic() - started
    assert took < 3.0 + 1.5, took  # the roles drained in parallel; the straggler was killed at 3s
    assert dead(stuck)
    # The running jobs either finished or are back in pending: none is stuck in running.
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'running'") == 0, 5,
             message="no job left running")
    assert "killing alpha" in s.log()
