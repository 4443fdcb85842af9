"""A real PostgreSQL for every test.

TEST_DATABASE_URL points at a server when set; otherwise an embedded server is
started in .state/test (kept between runs). Each xdist worker gets a database of
its own, migrated once; each test starts from empty tables.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from supervisor import apps, db
from supervisor.migrate import migrate

ROOT = Path(__file__).resolve().parent.parent

# Fixtures of the helper modules, available to every test without importing them.
pytest_plugins = [
    "tests.supervisor_helpers", "tests.pipeline_helpers", "tests.http_helpers", "tests.browser_helpers",
]

TEST_TABLES = """
CREATE TABLE IF NOT EXISTS test_results (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id   uuid NOT NULL,
    n        integer,
    pid      integer,
    thread   bigint,
    started  timestamptz,
    finished timestamptz,
    tag      text,
    at       timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


def _server_url() -> str:
    url = os.environ.get("TEST_DATABASE_URL")
    if url:
        return url
    os.environ.setdefault("SUPERVISOR_STATE_DIR", str(ROOT / ".state" / "test"))
    return db.embedded_url(Path(os.environ["SUPERVISOR_STATE_DIR"]))


def _with_dbname(url: str, name: str) -> str:
    params = conninfo_to_dict(url)
    params["dbname"] = name
    return make_conninfo(**params)


@pytest.fixture(scope="session")
def database_url(worker_id: str) -> Iterator[str]:
    server = _server_url()
    name = f"as_test_{worker_id}_{os.getpid()}_{secrets.token_hex(2)}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = _with_dbname(server, name)
    migrate(url, apps.installed())
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(TEST_TABLES)
    os.environ["DATABASE_URL"] = url
    yield url
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def runtime_database_url(worker_id: str) -> Iterator[str]:
    """A database with the runtime's tables only (no installed app's), as `supervisor run`
    leaves it for a config whose roles run only the user's own actors."""
    server = _server_url()
    name = f"as_runtime_{worker_id}_{os.getpid()}_{secrets.token_hex(2)}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = _with_dbname(server, name)
    migrate(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(TEST_TABLES)
    yield url
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def emptied(url: str) -> Iterator[psycopg.Connection]:
    """A connection to ``url`` (autocommit) once every table is empty (the migrations' ledger kept)."""
    with psycopg.connect(url, autocommit=True) as c:
        tables = [r[0] for r in c.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'schema_migrations'"
        )]
        if tables:
            c.execute("TRUNCATE " + ", ".join(f'"{t}"' for t in tables) + " RESTART IDENTITY CASCADE")
        yield c


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection]:
    with emptied(database_url) as c:
        yield c


def wait_for(condition: Callable[[], object], timeout: float = 30.0, interval: float = 0.02,
             message: str = "condition") -> object:
    """Poll a condition until it is truthy or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def scalar(conn: psycopg.Connection, query: str, params=None):
    return conn.execute(query, params).fetchone()[0]


class WorkerProc:
    """A worker subprocess (by default `supervisor worker`), logging to a file:
    a chatty worker must never block on a full pipe."""

    def __init__(self, url: str, *, queues="tests", actors="tests.sample_actors", threads=4,
                 lease=30.0, heartbeat=10.0, shutdown_timeout=30.0, extra_env=None, argv=None,
                 log_level="WARNING"):
        env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(ROOT), **(extra_env or {})}
        argv = argv or [
            sys.executable, "-m", "supervisor.cli", "worker", "--queues", queues, "--actors", actors,
            "--threads", str(threads), "--lease", str(lease), "--heartbeat", str(heartbeat),
            "--shutdown-timeout", str(shutdown_timeout), "--no-migrate", "--log-level", log_level,
        ]
        self.log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115  (lives as long as the process)
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stderr=self.log, text=True)
        self.pid = self.proc.pid

    def stderr(self) -> str:
        # Read without moving the file offset, which the process shares (the file is not
        # in append mode): a seek back to 0 would make its next lines overwrite old ones.
        fd = self.log.fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")

    def claims(self, queue: str) -> list[int]:
        """How many rows each of its claims from ``queue`` took, in order (logged at DEBUG:
        start it with log_level="DEBUG")."""
        line = rf"supervisor\.broker\.consumer: claimed (\d+) of \d+ from {re.escape(queue)}$"
        return [int(n) for n in re.findall(line, self.stderr(), re.MULTILINE)]

    def owner(self, conn) -> str | None:
        row = conn.execute("SELECT id FROM workers WHERE pid = %s AND stopped_at IS NULL", (self.pid,)).fetchone()
        return row[0] if row else None

    def wait_ready(self, conn, timeout: float = 30.0) -> str:
        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited early: {self.proc.returncode}\n{self.stderr()}")
            row = conn.execute("SELECT id FROM workers WHERE pid = %s AND state = 'running'",
                               (self.pid,)).fetchone()
            return row[0] if row else None
        return wait_for(ready, timeout, message=f"worker {self.pid} to be running")

    def terminate(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def workers(database_url) -> Iterator[Callable[..., WorkerProc]]:
    started: list[WorkerProc] = []

    def start(url: str | None = None, **kwargs) -> WorkerProc:
        w = WorkerProc(url or database_url, **kwargs)
        started.append(w)
        return w

    yield start
    for w in started:
        w.kill()


@pytest.fixture
def fresh_database() -> Iterator[str]:
    """An empty, unmigrated database, dropped afterwards."""
    server = _server_url()
    name = f"as_fresh_{os.getpid()}_{secrets.token_hex(3)}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield _with_dbname(server, name)
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def cli(*args: str, config: Path | None = None, url: str | None = None, env: dict | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `supervisor ARGS...` as a user would (``-c CONFIG`` appended when given,
    DATABASE_URL set to ``url`` when given); returns the CompletedProcess."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    if url:
        full_env["DATABASE_URL"] = url
    cmd = [sys.executable, "-m", "supervisor.cli", *args]
    if config is not None:
        cmd += ["-c", str(config)]
    return subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)


def upstream_failure() -> str:
    """What a worker writes into last_error for a job that raised (error_text, a real traceback)."""
    from supervisor.broker.message import error_text

    def call_upstream() -> None:
        raise RuntimeError("upstream said no")

    try:
        call_upstream()
    except RuntimeError as exc:
        return error_text(exc)
    raise AssertionError("unreachable")
