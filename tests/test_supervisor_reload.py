"""Live reload under load: resize in place, roll on settings changes, add and
remove roles, reject invalid files, SIGHUP and the config file watcher."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from tests.conftest import scalar, wait_for
from tests.supervisor_helpers import (
    JobStream,
    assert_exactly_once,
    cli,
    dead,
    role,
    write_config,
)


class Sampler(threading.Thread):
    """Watches a role's serving processes (ready, not draining) while a test runs."""

    def __init__(self, sup, name: str) -> None:
        super().__init__(daemon=True)
        self.sup, self.name = sup, name
        self.least = 10**6
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                procs = self.sup.roles()[self.name]["processes"]
            except Exception:
                continue
            self.least = min(self.least, sum(1 for p in procs if p["ready"] and not p["stop_reason"]))
            self.halt.wait(0.02)

    def stop(self) -> int:
        self.halt.set()
        self.join(5)
        return self.least


def test_reload_resizes_in_place_then_rolls_on_settings(tmp_path, conn, database_url, supervisor):
    path = write_config(tmp_path / "s.yaml", database_url, {"alpha": role(processes=2, threads=2)})
    s = supervisor(path)
    s.wait_state({"alpha": 2})
    stream = JobStream(database_url, per_second=60, sleep_s=0.02)
    stream.start()
    sampler = Sampler(s, "alpha")
    sampler.start()
    before = s.pids("alpha")

    write_config(path, database_url, {"alpha": role(processes=3, threads=2)})
    out = cli("reload", config=path)
    assert out.returncode == 0, out.stderr
    assert "alpha: resized 2 -> 3" in out.stdout
    state = s.wait_state({"alpha": 3}, timeout=2)  # reached before `reload` returned
    after = {p["pid"] for p in state["roles"][0]["processes"]}
    assert before < after  # in place: the old processes stay

    write_config(path, database_url, {"alpha": role(processes=3, threads=3)})
    out = cli("reload", config=path)
    assert out.returncode == 0, out.stderr
    assert "alpha: rolled (threads 2 -> 3)" in out.stdout
    state = s.wait_state({"alpha": 3}, timeout=2)
    rolled = {p["pid"] for p in state["roles"][0]["processes"]}
    assert not rolled & after  # every process replaced...
    assert all(dead(pid) for pid in after)
    assert sampler.stop() >= 2  # ...one by one: never fewer than 2 of 3 serving (none at all never)
    assert state["roles"][0]["restarts"] == 0
    assert_exactly_once(conn, stream.stop())
    assert state["reloads"] == 2


@pytest.mark.parametrize("via", ["table", "log"])
def test_reload_twenty_times_under_load(tmp_path, conn, database_url, supervisor, via):
    # Few threads and processes: overlapping rolls briefly run several generations at
    # once, and the test database server is shared by the whole parallel suite.
    path = write_config(tmp_path / "s.yaml", database_url, {"alpha": role(processes=1, threads=1),
                                                           "beta": role(processes=1, threads=1)})
    s = supervisor(path)
    s.wait_state({"alpha": 1, "beta": 1})
    # Through the log too: a rolled process gives its unstarted log rows back by appending
    # them again, and every job still runs once.
    stream = JobStream(database_url, per_second=40, sleep_s=0.01, via=via)
    stream.start()

    def config_for(i: int) -> dict:
        # Mostly count-only changes; every fourth one changes settings too (a roll).
        return {"alpha": role(processes=1 + i % 2, threads=1 + (i // 4) % 2),
                "beta": role(processes=1, threads=1 + (i // 4) % 2)}

    for i in range(10):  # one at a time, each waited for
        write_config(path, database_url, config_for(i))
        reply = s.request({"cmd": "reload"}, timeout=60)
        assert reply["ok"], reply
    for i in range(10, 20):  # then back to back: each reload lands on an unfinished one
        write_config(path, database_url, config_for(i))
        os.kill(s.pid, signal.SIGHUP)
        time.sleep(0.1)  # the pace of the reloads, not a wait for a condition
    wait_for(lambda: s.status()["reloads"] == 20, 10, message="20 reloads")
    state = s.wait_state({"alpha": 2, "beta": 1}, timeout=20)
    sent = stream.stop()
    assert_exactly_once(conn, sent)
    if via == "log":  # they ran from the log, not from job_queue
        assert scalar(conn, "SELECT count(*) FROM job_done WHERE status = 'succeeded'") == sent
    current = {p["pid"] for r in state["roles"] for p in r["processes"]}
    assert s.children() == current  # no orphans, no leftovers
    # every worker process that ever ran registered itself: the rolls really
    # replaced processes, and every replaced one is gone
    ever = {r[0] for r in conn.execute("SELECT pid FROM workers WHERE role IN ('alpha', 'beta')")}
    assert len(ever) > 5
    orphans = [pid for pid in (ever | s.seen) - current if not dead(pid)]
    assert orphans == []
    assert all(r["restarts"] == 0 for r in state["roles"])


# Each follows two lines naming the database and the control socket (so lines start at 3).
BROKEN = {
    # The flow mapping opened on line 4 is found unclosed where the next key starts.
    "broken YAML": ("roles:\n  alpha: {processes: 2, queues: [tests]\n  beta: 1\n", (5, None), "YAML syntax error"),
    "unknown key": ("roles:\n  alpha:\n    processes: 2\n    queues: [tests]\n    actors: [tests.sample_actors]\n"
                    "    thread: 4\n", (8, "roles.alpha.thread"), "unknown key 'thread'"),
    "bad value": ("roles:\n  alpha:\n    processes: 2\n    threads: 0\n    queues: [tests]\n"
                  "    actors: [tests.sample_actors]\n", (6, "roles.alpha.threads"), "at least 1"),
}


def test_invalid_reloads_keep_the_old_config(tmp_path, conn, database_url, supervisor):
    path = write_config(tmp_path / "s.yaml", database_url, {"alpha": role(processes=2, threads=2)})
    s = supervisor(path)
    before = s.wait_state({"alpha": 2})
    pids = {p["pid"] for p in before["roles"][0]["processes"]}
    good = path.read_text()
    header = f"database: {{url: '{database_url}'}}\nsupervisor: {{control_socket: {s.socket}}}\n"
    for name, (body, where, words) in BROKEN.items():
        path.write_text(header + body)
        out = cli("reload", config=path)
        assert out.returncode == 2, (name, out.stdout, out.stderr)
        assert str(path) in out.stderr and words in out.stderr, (name, out.stderr)
        line, key = where
        assert f"{path}:{line}: {key + ': ' if key else ''}" in out.stderr, (name, out.stderr)
        assert "keeps running its previous config" in out.stderr
        # The master itself, asked directly, rejects it the same way.
        reply = s.request({"cmd": "reload"})
        assert not reply["ok"] and reply["detail"]["file"] == str(path) and words in reply["error"]
        assert (reply["detail"]["line"], reply["detail"]["key"]) == where
        path.write_text(good)  # the status command reads the socket path from the file
        state = s.wait_state({"alpha": 2}, timeout=2)
        assert {p["pid"] for p in state["roles"][0]["processes"]} == pids
        assert state["reloads"] == 0
    # `check` says the same without touching the running master.
    path.write_text(header + BROKEN["unknown key"][0])
    out = cli("check", config=path)
    assert out.returncode == 2 and f"{path}:8: roles.alpha.thread: unknown key" in out.stdout
    path.write_text(good)


def test_roles_added_and_removed(tmp_path, conn, database_url, supervisor):
    path = write_config(tmp_path / "s.yaml", database_url, {"alpha": role(processes=2, threads=2)})
    s = supervisor(path)
    old = s.wait_state({"alpha": 2})
    stream = JobStream(database_url, per_second=40, sleep_s=0.02)
    stream.start()
    write_config(path, database_url, {"beta": role(processes=1, threads=2)})
    out = cli("reload", config=path)
    assert out.returncode == 0, out.stderr
    assert "beta: added" in out.stdout and "alpha: removed (draining)" in out.stdout
    s.wait_state({"beta": 1}, timeout=2)
    assert all(dead(p["pid"]) for p in old["roles"][0]["processes"])
    assert_exactly_once(conn, stream.stop())


def test_sighup_and_watched_file_change(tmp_path, conn, database_url, supervisor):
    path = write_config(tmp_path / "s.yaml", database_url, {"alpha": role(processes=1, threads=2)},
                        watch_config=True)
    s = supervisor(path)
    s.wait_state({"alpha": 1})
    # Saving the file is enough.
    write_config(path, database_url, {"alpha": role(processes=2, threads=2)}, watch_config=True)
    s.wait_state({"alpha": 2}, timeout=10)
    # An invalid save is ignored (and logged); the roles stay as they are.
    path.write_text(path.read_text().replace("threads: 2", "threads: 0"))
    wait_for(lambda: "reload (config file change) rejected" in s.log(), 10, message="rejection logged")
    assert "roles.alpha.threads: must be at least 1" in s.log()
    s.wait_state({"alpha": 2}, timeout=2)
    # SIGHUP re-reads too (watching off now, so only the signal can apply this).
    write_config(path, database_url, {"alpha": role(processes=1, threads=2)}, watch_config=False)
    wait_for(lambda: s.status()["reloads"] >= 2, 10, message="watched reload of the watch_config change")
    # Not watched any more: nothing may happen on its own. Once the watcher says it stopped,
    # its watch is closed and it pokes the master no more, so no wait for a quiet spell.
    wait_for(lambda: "stopped watching" in s.log(), 10, message="the config watcher to stop")
    write_config(path, database_url, {"alpha": role(processes=3, threads=2)}, watch_config=False)
    assert s.roles()["alpha"]["wanted"] == 1
    os.kill(s.pid, signal.SIGHUP)
    s.wait_state({"alpha": 3}, timeout=10)
    assert "reload (SIGHUP): alpha: resized 1 -> 3" in s.log()  # applied by the signal, not by a watch


def test_scale_to_zero_and_reload_restores(tmp_path, conn, database_url, supervisor):
    path = write_config(tmp_path / "s.yaml", database_url, {"alpha": role(processes=2, threads=2)})
    s = supervisor(path)
    s.wait_state({"alpha": 2})
    assert s.request({"cmd": "scale", "role": "alpha", "processes": 0})["ok"]
    s.wait_state({"alpha": 0}, timeout=2)
    for bad in (-1, "two", True):
        assert not s.request({"cmd": "scale", "role": "alpha", "processes": bad})["ok"]
    out = cli("reload", config=path)
    assert out.returncode == 0 and "alpha: scale 0 cleared, back to 2 from the config" in out.stdout
    s.wait_state({"alpha": 2}, timeout=2)
