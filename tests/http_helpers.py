"""Running a real HTTP server (`supervisor http`) in tests, on a free loopback port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
