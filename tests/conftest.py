"""A real PostgreSQL for every test.

TEST_DATABASE_URL points at a server when set; otherwise an embedded server is
started in .state/test (kept between runs). Each xdist worker gets a database of
its own, migrated once; each test starts from empty tables.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from supervisor import apps, db, jobstates
from supervisor.broker import PostgresBroker
from supervisor.testing import ThrowawayDatabase, empty_tables
from supervisor.testsignals import Recorded
from supervisor.worker.process import EXECUTORS

ROOT = Path(__file__).resolve().parent.parent

# Fixtures of the helper modules, available to every test without importing them.
pytest_plugins = [
    "tests.supervisor_helpers", "tests.pipeline_helpers", "tests.http_helpers", "tests.browser_helpers", "tests.leaks",
    "tests.private_server",
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


@contextlib.contextmanager
def _throwaway(prefix: str, owners: tuple[apps.App, ...] | None = None) -> Iterator[str]:
    """A database of the tests' own (the runtime's tables, those of ``owners``, default
    every installed app's, and TEST_TABLES), dropped after."""
    database = ThrowawayDatabase(_server_url(), prefix)
    url = database.create(owners)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(TEST_TABLES)
    yield url
    database.drop()


@pytest.fixture(scope="session")
def database_url(worker_id: str) -> Iterator[str]:
    with _throwaway(f"as_test_{worker_id}") as url:
        os.environ["DATABASE_URL"] = url
        yield url


@pytest.fixture(scope="session")
def runtime_database_url(worker_id: str) -> Iterator[str]:
    """A database with the runtime's tables only (no installed app's), as `supervisor run`
    leaves it for a config whose roles run only the user's own actors."""
    with _throwaway(f"as_runtime_{worker_id}", owners=()) as url:
        yield url


@contextlib.contextmanager
def emptied(url: str) -> Iterator[psycopg.Connection]:
    """A connection to ``url`` (autocommit) once every table is empty (the migrations' ledger kept)."""
    with psycopg.connect(url, autocommit=True) as c:
        empty_tables(c)
        yield c


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection]:
    """The test database's tables emptied, on one autocommit connection; after the test,
    every move its jobs made (job_events) must be one of the state machine's."""
    with emptied(database_url) as c:
        yield c
        if not c.closed:
            moves = c.execute("SELECT DISTINCT from_status, to_status FROM job_events").fetchall()
            wrong = [m for m in moves if not jobstates.allowed(*m)]
            assert not wrong, f"job moves outside supervisor/jobstates.py's TRANSITIONS: {wrong}"


@pytest.fixture
def broker(request: pytest.FixtureRequest, database_url: str) -> Iterator[PostgresBroker]:
    """A PostgresBroker on the test database, closed after the test. Its options are the
    keywords of the closest ``broker`` mark (a module's: ``pytestmark = pytest.mark.broker(...)``)."""
    mark = request.node.get_closest_marker("broker")
    b = PostgresBroker(database_url, **(mark.kwargs if mark else {}))
    yield b
    b.close()


def run_rounds(conn: psycopg.Connection, broker: PostgresBroker, queue: str, actor: str, *, rounds: int) -> None:
    """Rounds of 100 rows of ``actor`` inserted, claimed and acked by ``broker``: under a
    pinned horizon, 100 index entries a round that no scan can skip by itself."""
    for _ in range(rounds):
        batch = {str(r[0]) for r in conn.execute(
            "INSERT INTO job_queue (queue, actor) SELECT %s, %s FROM generate_series(1, 100) RETURNING id",
            (queue, actor)).fetchall()}
        claimed = broker.claim(queue, 100)
        assert {m.message_id for m in claimed} == batch
        broker.completer.write_acks([m.message_id for m in claimed], [m.attempts for m in claimed],
                                    [None] * len(claimed), [None] * len(claimed))


def plan_buffers(conn: psycopg.Connection, statement: str, params: Any) -> int:
    """Shared buffers ``statement`` reads, run under EXPLAIN (ANALYZE, BUFFERS) and rolled back."""
    with conn.transaction(force_rollback=True):
        plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, params).fetchone()[0]
    node = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    return int(node["Shared Hit Blocks"]) + int(node["Shared Read Blocks"])


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


_BOOTED: weakref.WeakSet[PostgresBroker] = weakref.WeakSet()


@contextlib.contextmanager
def in_process_worker(broker: PostgresBroker, queues: Iterable[str], *, threads: int = 4,
                      prefetch: int | None = None, executor: str = "dramatiq",
                      async_limit: int | None = None) -> Iterator[Any]:
    """A worker in this process on the real broker, holding up to ``prefetch`` rows
    (default: one per thread) as a supervised process of that capacity would; ``executor``
    as the role key says: ``dramatiq`` (dramatiq.Worker) or ``own`` (worker/executor.py),
    which runs ``async_limit`` coroutines at most (default: the role key's)."""
    broker.set_capacity(prefetch or threads)
    broker.resume_claiming()
    if broker not in _BOOTED:
        # Once per broker: TimeLimit starts its timer thread on boot.
        broker.emit_after("process_boot")
        _BOOTED.add(broker)
    options = {"async_limit": async_limit} if async_limit is not None else {}
    worker = EXECUTORS[executor](broker, queues=set(queues), worker_threads=threads, worker_timeout=100, **options)
    worker.queue_prefetch = prefetch or threads
    worker.start()
    try:
        yield worker
    finally:
        worker.stop(timeout=10_000)
        broker.flush_acks(10)
        # stop() gives up after its timeout and leaves a busy thread running: its actor
        # would go on using the actor pool and the database during later tests.
        stuck = [t for t in worker.workers if t.is_alive()]
        if stuck:
            pytest.fail(f"{len(stuck)} worker threads still running 10 s after stop:\n{stacks(stuck)}",
                        pytrace=False)


def stacks(threads: list[threading.Thread]) -> str:
    """Where each of ``threads`` is now (for a failure that names threads left running)."""
    frames = sys._current_frames()
    return "\n".join(f"--- {t.name}\n" + "".join(traceback.format_stack(frames[t.ident]))
                     for t in threads if t.ident in frames)


def stop(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM (if it still runs), and SIGKILL if it has not exited ``timeout`` seconds later."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def scalar(conn: psycopg.Connection, query: str, params=None):
    return conn.execute(query, params).fetchone()[0]


class WorkerProc:
    """A worker subprocess (by default `supervisor worker`), logging to a file (a chatty
    worker must never block on a full pipe), its test signals to another (``signals``)."""

    def __init__(self, url: str, *, queues="tests", actors="tests.sample_actors", threads=4,
                 lease=30.0, heartbeat=10.0, shutdown_timeout=30.0, extra_env=None, argv=None,
                 log_level="WARNING", executor: str | None = None, extra_args=()):
        fd, signals = tempfile.mkstemp(prefix="signals-", suffix=".jsonl")
        os.close(fd)
        self.signals = Recorded(Path(signals))
        env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(ROOT), **self.signals.env, **(extra_env or {})}
        argv = argv or [
            sys.executable, "-m", "supervisor.cli", "worker", "--queues", queues, "--actors", actors,
            "--threads", str(threads), "--lease", str(lease), "--heartbeat", str(heartbeat),
            "--shutdown-timeout", str(shutdown_timeout), "--no-migrate", "--log-level", log_level,
            *(["--executor", executor] if executor else []), *extra_args,
        ]
        self.log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115  (lives as long as the process)
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stderr=self.log, text=True)
        self.pid = self.proc.pid

    def stderr(self) -> str:
        # Read without moving the file offset, which the process shares (the file is not
        # in append mode): a seek back to 0 would make its next lines overwrite old ones.
        fd = self.log.fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")

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
        self.signals.path.unlink(missing_ok=True)


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
    database = ThrowawayDatabase(_server_url(), "as_fresh")
    yield database.create_empty()
    database.drop()


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
