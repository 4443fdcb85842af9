"""The control socket: permissions, one master per socket, stale sockets, bad requests."""

from __future__ import annotations

import json
import os
import socket
import stat

from supervisor import control
from tests.supervisor_helpers import Supervisor, cli, role, write_config


def _raw(path, data: bytes) -> dict:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(str(path))
    s.sendall(data)
    reply = b""
    while not reply.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        reply += chunk
    s.close()
    return json.loads(reply)


def test_socket_is_private_and_serves_one_master(tmp_path, database_url, supervisor):
    path = write_config(tmp_path / "s.yaml", database_url, {"alpha": role(processes=1, threads=1)})
    s = supervisor(path)
    s.wait_state({"alpha": 1})
    mode = os.stat(s.socket).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600

    second = Supervisor(path)
    try:
        assert second.proc.wait(30) == 1
        assert f"already running with control socket {s.socket}" in second.log()
    finally:
        second.cleanup()
    assert s.status()["pid"] == s.pid  # the first one is untouched

    assert _raw(s.socket, b"not json\n") == {"ok": False, "error": "requests are one JSON object per line"}
    assert not _raw(s.socket, b'["status"]\n')["ok"]
    assert "unknown command" in _raw(s.socket, b'{"cmd": "explode"}\n')["error"]
    assert _raw(s.socket, b'{"cmd": "ping"}\n') == {"ok": True, "pid": s.pid}
    assert s.status()["roles"][0]["running"] == 1  # still serving after the nonsense

    out = cli("stop", config=path)
    assert out.returncode == 0 and f"stopped (master pid {s.pid})" in out.stdout
    assert s.proc.wait(5) == 0
    assert not s.socket.exists()  # removed on the way out


def test_stale_socket_is_replaced(tmp_path, database_url, supervisor):
    sock_path = tmp_path / "ctl.sock"
    leftover = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    leftover.bind(str(sock_path))  # a socket file nobody listens on: a master that died
    leftover.close()
    path = write_config(tmp_path / "s.yaml", database_url, {"alpha": role(processes=1, threads=1)}, socket=sock_path)
    s = supervisor(path)
    s.wait_state({"alpha": 1})
    assert s.status()["control_socket"] == str(sock_path)


def test_clients_say_what_to_do_when_no_master_runs(tmp_path, database_url):
    path = write_config(tmp_path / "s.yaml", database_url, {"alpha": role()})
    for args in (["status"], ["reload"], ["scale", "alpha", "2"], ["stop"]):
        out = cli(*args, config=path)
        assert out.returncode == 1, (args, out.stderr)
        assert "no supervisor is running" in out.stderr and "supervisor run -c FILE" in out.stderr
    missing = cli("status", config=tmp_path / "nope.yaml")
    assert missing.returncode == 2 and "cannot read the config file" in missing.stderr
    try:
        control.request(tmp_path / "nothing.sock", {"cmd": "ping"}, timeout=1)
    except control.ControlError as exc:
        assert "no supervisor is running" in str(exc)
    else:
        raise AssertionError("expected ControlError")
