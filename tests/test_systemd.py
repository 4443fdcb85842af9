"""sd_notify against a fake NOTIFY_SOCKET, and the unit file."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from supervisor import config
from supervisor.master.systemd import Notifier
from supervisor.units import parse_duration
from tests.conftest import ROOT, wait_for
from tests.supervisor_helpers import cli, role, write_config

UNIT = ROOT / "systemd" / "actor-supervisor.service"


class FakeSystemd:
    """A unix datagram socket standing in for systemd's notify socket. Like systemd,
    it reads continuously (in a thread), so the sender's queue never fills up."""

    def __init__(self, address: str, *, reading: bool = True) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(b"\0" + address[1:].encode() if address.startswith("@") else address)
        self.sock.settimeout(0.05)
        self.messages: list[str] = []
        self._halt = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        if reading:
            self._reader.start()

    def _read(self) -> None:
        while not self._halt.is_set():
            self.poll()

    def poll(self) -> list[str]:
        while True:
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except (TimeoutError, OSError):
                return self.messages

    def lines(self) -> list[str]:
        return [line for m in list(self.messages) for line in m.split("\n")]

    def close(self) -> None:
        self._halt.set()
        if self._reader.is_alive():
            self._reader.join(2)
        self.sock.close()


@pytest.fixture
def fake_systemd():
    made = []

    def make(address: str | None = None, **kwargs) -> FakeSystemd:
        f = FakeSystemd(address or f"@as-test-{secrets.token_hex(6)}", **kwargs)
        made.append(f)
        return f

    yield make
    for f in made:
        f.close()


def test_notifier_path_and_abstract_sockets(fake_systemd):
    short_dir = tempfile.mkdtemp(dir="/tmp")  # pytest's tmp_path can be too long for a socket path
    try:
        for address in (f"{short_dir}/notify", None):
            fake = fake_systemd(address, reading=False)
            n = Notifier(fake.address, watchdog_usec="", watchdog_pid="")
            assert n.ready("all 2/2") and n.reloading() and n.stopping()
            assert n.status("hello") and not n.status("hello")  # unchanged STATUS lines are not resent
            got = fake.poll()
            assert got[0] == "READY=1\nSTATUS=all 2/2"
            assert re.fullmatch(r"RELOADING=1\nMONOTONIC_USEC=\d+", got[1])
            usec = int(got[1].split("=")[-1])
            assert abs(usec - time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000) < 5_000_000
            assert got[2:] == ["STOPPING=1", "STATUS=hello"]
            n.close()
    finally:
        shutil.rmtree(short_dir)


def test_notifier_without_systemd_and_watchdog_rules(fake_systemd, monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    n = Notifier()
    assert not n.enabled and not n.ready() and not n.watchdog()
    fake = fake_systemd(reading=False)
    n = Notifier(fake.address, watchdog_usec="2000000", watchdog_pid=str(os.getpid()))
    assert n.watchdog_interval == 2.0
    assert n.watchdog(now=100.0) and not n.watchdog(now=100.5) and n.watchdog(now=101.0)
    assert fake.poll() == ["WATCHDOG=1", "WATCHDOG=1"]
    assert Notifier(fake.address, watchdog_usec="2000000", watchdog_pid="1").watchdog_interval is None
    # A vanished socket is logged, never raised.
    assert not Notifier("@as-test-nobody-listens-here", watchdog_usec="", watchdog_pid="").ready()


def test_a_full_notify_queue_never_blocks_and_keeps_state_changes_in_order(fake_systemd):
    fake = fake_systemd(reading=False)  # nobody reads: the kernel queue fills up
    n = Notifier(fake.address, watchdog_usec="", watchdog_pid="")
    started = time.monotonic()
    for i in range(200):
        n.status(f"line {i}")
    n.ready()
    n.stopping()
    assert time.monotonic() - started < 1.0  # never blocked
    fake.poll()  # systemd catches up
    n.flush()
    got = fake.poll()
    assert got[-2:] == ["READY=1", "STOPPING=1"]


def test_master_notifies_ready_reloading_stopping_in_order(tmp_path, fake_systemd, database_url, supervisor):
    fake = fake_systemd()
    path = write_config(tmp_path / "s.yaml", database_url, {"alpha": role(processes=2, threads=2),
                                                           "beta": role(processes=1, threads=2)})
    s = supervisor(path, env={"NOTIFY_SOCKET": fake.address, "WATCHDOG_USEC": "400000"})
    wait_for(lambda: "READY=1" in fake.lines(), 30, message="READY=1")
    s.wait_state({"alpha": 2, "beta": 1})
    # READY=1 came only once every role's first processes were ready.
    ready_line = next(m for m in fake.messages if m.startswith("READY=1"))
    assert "STATUS=alpha 2/2, beta 1/1" in ready_line
    wait_for(lambda: fake.lines().count("WATCHDOG=1") >= 2, 5, message="watchdog pings")
    write_config(path, database_url, {"alpha": role(processes=3, threads=2), "beta": role(processes=1, threads=2)})
    assert cli("reload", config=path).returncode == 0
    assert s.terminate(timeout=30) == 0
    states = [line.split("=")[0] for line in fake.lines() if line.split("=")[0] in ("READY", "RELOADING", "STOPPING")]
    assert states == ["READY", "RELOADING", "READY", "STOPPING"]
    reloading = next(m for m in fake.messages if m.startswith("RELOADING=1"))
    assert re.search(r"MONOTONIC_USEC=\d+", reloading)
    assert any(line.startswith("STATUS=stopping") for line in fake.lines())


def _unit() -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            values.setdefault(key.strip(), []).append(value.strip())
    return values


def _seconds(value: str) -> float:
    return parse_duration(value.replace("sec", "s"))


def test_unit_file_settings():
    unit = _unit()
    assert unit["Type"] == ["notify"]
    assert unit["KillMode"] == ["mixed"]
    assert unit["Restart"] == ["on-failure"]
    assert unit["ExecReload"][0].endswith("supervisor reload --timeout 100")
    assert unit["ExecStart"][0].endswith("supervisor run")
    for key, want in {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "PrivateTmp": "yes"}.items():
        assert unit[key] == [want]
    assert unit["User"] == ["actor-supervisor"]
    assert "/var/lib/actor-supervisor" in unit["ReadWritePaths"][0]
    assert unit["EnvironmentFile"] == ["/etc/actor-supervisor/env"]
    assert _seconds(unit["WatchdogSec"][0]) > 0
    prod = config.parse((ROOT / "config" / "production.example.yaml").read_text(), "prod.yaml",
                        env={"DATABASE_URL": "postgresql://x@y/z"})
    assert _seconds(unit["TimeoutStopSec"][0]) > prod.supervisor.shutdown_timeout
    assert str(prod.supervisor.control_socket).startswith("/run/actor-supervisor/")  # RuntimeDirectory
    assert str(prod.supervisor.state_dir) == "/var/lib/actor-supervisor"  # StateDirectory
    env_example = (ROOT / "systemd" / "actor-supervisor.env.example").read_text()
    assert re.search(r"^DATABASE_URL=postgresql://", env_example, re.M)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify(tmp_path):
    # verify insists that ExecStart exists: point it at this venv's script.
    script = Path(sys.executable).parent / "supervisor"
    if not script.exists():
        pytest.skip("the supervisor console script is not installed in this venv")
    unit = tmp_path / "actor-supervisor.service"
    unit.write_text(UNIT.read_text().replace("/opt/actor-supervisor/venv/bin/supervisor", str(script)))
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "actor-supervisor.service" not in result.stderr, result.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_unit_is_hardened(tmp_path):
    unit = tmp_path / "actor-supervisor.service"
    unit.write_text(UNIT.read_text())
    result = subprocess.run(["systemd-analyze", "security", "--offline=true", str(unit)],
                            capture_output=True, text=True, timeout=60)
    found = re.search(r"Overall exposure level for \S+: ([\d.]+)", result.stdout)
    assert found, result.stdout + result.stderr
    assert float(found.group(1)) <= 3.0, result.stdout
