"""Running a real HTTP server (`supervisor http`) in tests, on a free loopback port."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml

from tests.conftest import ROOT, emptied, stop, wait_for
from tests.supervisor_helpers import Supervisor, role, write_config


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


def answers(base: str, path: str = "/") -> bool:
    """``base + path`` answers 200 now (False while nothing listens)."""
    try:
        return httpx.get(base + path, timeout=5).status_code == 200
    except httpx.TransportError:
        return False


@dataclass
class Dash:
    """A supervisor and its HTTP child: the dashboard at ``base``; ``db`` a connection to
    the database at ``url``."""

    base: str
    sup: Supervisor
    db: psycopg.Connection
    url: str


@contextlib.contextmanager
def dashboard(database_url: str, directory: Path, roles: dict[str, dict], *, http: dict[str, Any],
              env: dict[str, str] | None = None, **sections: Any) -> Iterator[Dash]:
    """A supervisor running ``roles`` and its HTTP child (``http``: its section, less the
    address), the config's other ``sections`` beside, on emptied tables: once every process
    is ready and the dashboard answers. Stopped after."""
    with emptied(database_url) as db:
        port = free_port()
        cfg = write_config(directory / "sup.yaml", database_url, roles)
        data = yaml.safe_load(cfg.read_text())
        data.update(sections, http={"listen": f"127.0.0.1:{port}", **http})
        cfg.write_text(yaml.safe_dump(data))
        sup = Supervisor(cfg, env=env)
        try:
            sup.wait_state({**{name: r["processes"] for name, r in roles.items()}, "http": 1}, timeout=60)
            base = f"http://127.0.0.1:{port}"
            wait_for(lambda: answers(base), 20, message="the dashboard to answer")
            yield Dash(base, sup, db, database_url)
        finally:
            sup.cleanup()


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
        stop(self.proc, 15)
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
