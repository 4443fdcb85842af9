"""Running a real HTTP server (`supervisor http`) in tests, on a free loopback port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import ROOT, wait_for
from tests.supervisor_helpers import role, write_config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def runtime_config(path: Path, url: str, **supervisor) -> Path:
    """A config whose one role runs only the tests' own actors (no installed app in use),
    with one schedule: what a user of the runtime without the bundled app writes."""
    write_config(path, url, {"w": role(processes=1, threads=2, queues=("tests", "other"))}, **supervisor)
    data = yaml.safe_load(path.read_text())
    data["schedules"] = {"nightly": {"cron": "0 3 * * *", "actor": "noop", "queue": "tests"}}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@dataclass(frozen=True)
class Matrix:
    """One configuration the HTTP tests run against: its database, the flags that give
    `supervisor http` its config, a role and a schedule the config names, the apps in use."""

    name: str
    url: str
    args: tuple[str, ...]
    role: str
    schedule: str
    apps: list[str]


def matrix_setup(request: pytest.FixtureRequest, tmp_path: Path) -> Matrix:
    """``request.param``: "tracker" (the repository's config/supervisor.yaml, found by
    default, on a database with every app's tables) or "runtime" (``runtime_config`` on a
    database with the runtime's tables only)."""
    if request.param == "tracker":
        return Matrix("tracker", request.getfixturevalue("database_url"), (), "scraping", "poll-watches", ["actors"])
    url = request.getfixturevalue("runtime_database_url")
    path = runtime_config(tmp_path / "runtime.yaml", url)
    return Matrix("runtime", url, ("-c", str(path)), "w", "nightly", [])


class HttpServer:
    """A `supervisor http` subprocess and an httpx client for it."""

    def __init__(self, url: str, *args: str, env: dict | None = None, log_dir: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"http-{self.port}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop
        # A token only when the test gives one, whatever this shell has set.
        inherited = {k: v for k, v in os.environ.items() if k != "SUPERVISOR_HTTP_TOKEN"}
        full_env = {**inherited, "PYTHONPATH": str(ROOT), "DATABASE_URL": url, **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "supervisor.cli", "http", "--listen", f"127.0.0.1:{self.port}", *args],
            cwd=ROOT, env=full_env, stdout=self._log, stderr=subprocess.STDOUT)
        self.client = httpx.Client(base_url=self.base, timeout=10)
        wait_for(self._up, 30, interval=0.05, message=f"http server on {self.base}")

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"http server exited {self.proc.returncode}:\n{self.log_path.read_text()}")
        try:
            self.client.get("/api/v1/openapi.json")
        except httpx.TransportError:
            return False
        return True

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


@pytest.fixture
def http_server(database_url: str, tmp_path: Path) -> Iterator[Callable[..., HttpServer]]:
    started: list[HttpServer] = []

    def start(*args: str, url: str | None = None, env: dict | None = None) -> HttpServer:
        s = HttpServer(url or database_url, *args, env=env, log_dir=tmp_path)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()
