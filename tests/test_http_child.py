"""The master's HTTP child: supervised like a role (status, restart, reload)."""

from __future__ import annotations

import os
import signal

import httpx
import yaml

from tests.conftest import wait_for
from tests.http_helpers import free_port
from tests.supervisor_helpers import role, write_config


def _get(base: str, path: str) -> httpx.Response | None:
    try:
        return httpx.get(base + path, timeout=5)
    except httpx.TransportError:
        return None


def test_http_child_in_status_restarted_when_killed_and_reloaded(database_url, tmp_path, supervisor):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cfg = write_config(tmp_path / "sup.yaml", database_url, {"w": role(processes=1)})
    data = yaml.safe_load(cfg.read_text())
    data["http"] = {"listen": f"127.0.0.1:{port}"}
    cfg.write_text(yaml.safe_dump(data))
    s = supervisor(cfg)
    status = s.wait_state({"w": 1, "http": 1})
    http_role = {r["name"]: r for r in status["roles"]}["http"]
    pid = http_role["processes"][0]["pid"]
    r = wait_for(lambda: _get(base, "/healthz"), 10, message="healthz answers")
    assert r.status_code == 200 and r.json()["pid"] == s.pid
    assert _get(base, "/readyz").json()["ok"] is True

    os.kill(pid, signal.SIGKILL)
    status = wait_for(lambda: (st := s.status()) and any(
        r["name"] == "http" and r["restarts"] == 1 and r["running"] == 1 for r in st["roles"]) and st,
        20, message="http child restarted")
    new_pid = {r["name"]: r for r in status["roles"]}["http"]["processes"][0]["pid"]
    assert new_pid != pid
    assert wait_for(lambda: (r := _get(base, "/healthz")) and r.status_code == 200, 10)

    # Reload with read_only on: the child is rolled and now refuses actions.
    data["http"]["read_only"] = True
    cfg.write_text(yaml.safe_dump(data))
    reply = s.request({"cmd": "reload"})
    assert reply["ok"] and any(c.startswith("http: rolled (read_only)") for c in reply["changes"]), reply
    r = httpx.post(base + "/api/v1/queues/tests/pause", timeout=5)
    assert r.status_code == 403 and "read-only" in r.json()["error"]
    # Reload without http: the child is drained.
    del data["http"]
    cfg.write_text(yaml.safe_dump(data))
    assert s.request({"cmd": "reload"})["ok"]
    s.wait_state({"w": 1})
