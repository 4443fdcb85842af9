"""Running a real `supervisor run` master in tests, and feeding it jobs."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dramatiq
import psutil
import psycopg
import pytest
import yaml

from supervisor import control
from supervisor.broker import PostgresBroker
from tests.conftest import ROOT, cli, scalar, stop, wait_for

__all__ = ["cli"]  # the one CLI runner, re-exported for the supervisor tests

# Short everything, so roll steps, hang detection and backoff take a second, not a minute.
FAST_SUPERVISOR = {
    "tick": "100ms",
    "shutdown_timeout": "10s",
    "kill_grace": "2s",
    "start_timeout": "30s",
    "restart_backoff": "50ms",
    "restart_backoff_max": "1s",
}


def role(processes: int = 2, threads: int = 4, queues=("tests",), actors=("tests.sample_actors",),
         **settings: Any) -> dict[str, Any]:
    return {"processes": processes, "threads": threads, "queues": list(queues), "actors": list(actors),
            "lease": "5s", "heartbeat": "1s", "shutdown_timeout": "8s", "min_backoff": "100ms",
            "max_backoff": "1s", **settings}


def write_config(path: Path, url: str, roles: dict[str, dict], socket: Path | None = None,
                 database: dict[str, Any] | None = None, **supervisor: Any) -> Path:
    data = {
        "database": {"url": url, **(database or {})},
        "supervisor": {**FAST_SUPERVISOR, "control_socket": str(socket or path.parent / "ctl.sock"), **supervisor},
        "roles": roles,
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False))
    tmp.replace(path)  # atomically, as editors do: the master never reads half a file
    return path


class Supervisor:
    """A `supervisor run -c FILE` subprocess and a control-socket client for it."""

    def __init__(self, config_path: Path, *, env: dict | None = None, launcher: tuple[str, ...] = ()) -> None:
        self.config_path = config_path
        self.socket = Path(yaml.safe_load(config_path.read_text())["supervisor"]["control_socket"])
        self.log_path = config_path.parent / f"master-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in cleanup
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        # launcher: a program that runs the command (e.g. opentelemetry-instrument)
        self.proc = subprocess.Popen([*launcher, sys.executable, "-m", "supervisor.cli", "run", "-c", str(config_path)],
                                     cwd=ROOT, env=full_env, stdout=self._log, stderr=subprocess.STDOUT)
        self.pid = self.proc.pid
        self.seen: set[int] = set()  # every child pid ever reported, to check for orphans

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def request(self, message: dict, timeout: float = 60.0) -> dict:
        return control.request(self.socket, message, timeout=timeout)

    def status(self) -> dict:
        reply = self.request({"cmd": "status"}, timeout=10)
        assert reply["ok"], reply
        for r in reply["roles"]:
            self.seen.update(p["pid"] for p in r["processes"])
        return reply

    def roles(self) -> dict[str, dict]:
        return {r["name"]: r for r in self.status()["roles"]}

    def pids(self, role_name: str | None = None) -> set[int]:
        return {p["pid"] for name, r in self.roles().items() if role_name in (None, name) for p in r["processes"]}

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _try_status(self) -> dict | None:
        if not self.alive():
            raise AssertionError(f"master exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
        try:
            return self.status()
        except control.ControlError:
            return None

    def wait_state(self, expected: dict[str, int], timeout: float = 30.0) -> dict:
        """Until each named role has exactly N ready, current processes and nothing else."""
        def done():
            s = self._try_status()
            if s is None:
                return None
            roles = {r["name"]: r for r in s["roles"]}
            if set(roles) != set(expected):
                return None
            for name, n in expected.items():
                r = roles[name]
                procs = r["processes"]
                if r["wanted"] != n or len(procs) != n or not all(p["ready"] and p["current"] for p in procs):
                    return None
            return s
        try:
            return wait_for(done, timeout, interval=0.05, message=f"roles {expected}")
        except AssertionError as exc:  # the log as it is now, when the wait failed
            raise AssertionError(f"{exc}\n{self.log()[-3000:]}") from None

    def wait_ready(self, timeout: float = 30.0) -> dict:
        return wait_for(lambda: (s := self._try_status()) and s["state"] == "running" and s,
                        timeout, interval=0.05, message="master ready")

    def children(self) -> set[int]:
        try:
            return {c.pid for c in psutil.Process(self.pid).children() if c.status() != psutil.STATUS_ZOMBIE}
        except psutil.Error:
            return set()

    def terminate(self, timeout: float = 60.0) -> int:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait(10)

    def cleanup(self) -> None:
        # Whatever happened in the test, leave no process behind for the next one.
        kids = self.children()
        stop(self.proc, 30)
        for pid in kids | self.seen:
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                if "supervisor" in " ".join(p.cmdline()):
                    p.kill()
        self._log.close()


@pytest.fixture
def supervisor(tmp_path) -> Iterator[Callable[..., Supervisor]]:
    started: list[Supervisor] = []

    def start(config_path: Path, **kwargs) -> Supervisor:
        s = Supervisor(config_path, **kwargs)
        started.append(s)
        return s

    yield start
    for s in started:
        s.cleanup()


def dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class JobStream(threading.Thread):
    """Sends `record` jobs at a steady rate until stopped, one at a time: by plain SQL into
    job_queue, or with ``via="log"`` by a producer at the default storage, to the job log."""

    def __init__(self, url: str, per_second: float = 50.0, *, sleep_s: float = 0.0, queue: str = "tests",
                 max_lease_losses: int | None = None, via: str = "table") -> None:
        super().__init__(daemon=True)
        self.url = url
        self.interval = 1.0 / per_second
        self.sleep_s = sleep_s
        self.queue = queue
        self.max_lease_losses = max_lease_losses  # None: the actor's poison-pill budget
        self.via = via
        self.sent = 0
        self._halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            if self.via == "log":
                with log_producer(self.url, self.queue, {"record": {}}) as producer:
                    budget = {} if self.max_lease_losses is None else {"max_lease_losses": self.max_lease_losses}
                    self._stream(lambda: producer.actors["record"].send_with_options(
                        kwargs={"n": self.sent, "sleep_s": self.sleep_s}, **budget))
                return
            with psycopg.connect(self.url, autocommit=True) as c:
                self._stream(lambda: c.execute(  # job_queue itself (through the jobs view: the log, 055)
                    "INSERT INTO job_queue (queue, actor, kwargs, max_lease_losses) VALUES"
                    " (%s, 'record', jsonb_build_object('n', %s::int, 'sleep_s', %s::float), %s)",
                    (self.queue, self.sent, self.sleep_s, self.max_lease_losses)))
        except BaseException as exc:
            self.error = exc

    def _stream(self, send: Callable[[], object]) -> None:
        next_at = time.monotonic()
        while not self._halt.is_set():
            send()
            self.sent += 1
            next_at += self.interval
            self._halt.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> int:
        self._halt.set()
        self.join(10)
        assert self.error is None, self.error
        return self.sent


def enqueue(conn: psycopg.Connection, n: int, *, sleep_s: float = 0.0, queue: str = "tests",
            actor: str = "record", via: str = "table") -> None:
    """``n`` jobs of ``actor`` (kwargs n, sleep_s) in one statement: by SQL into job_queue,
    or with ``via="log"`` in one batch of a producer at the default storage, to the job log."""
    if via == "log":
        url = psycopg.conninfo.make_conninfo(conn.info.dsn, password=conn.info.password or None)  # dsn hides it
        ids = send_through_the_log(url, actor,
                                   [{"kwargs": {"n": g, "sleep_s": sleep_s}} for g in range(1, n + 1)], queue=queue)
        assert conn.execute("SELECT count(*) FROM job_log WHERE id = ANY(%s)", (ids,)).fetchone() == (n,)
        return
    conn.execute(  # job_queue itself (an insert through the jobs view goes to the log: 055)
        "INSERT INTO job_queue (queue, actor, kwargs) SELECT %s, %s, jsonb_build_object('n', g, 'sleep_s', %s::float)"
        " FROM generate_series(1, %s) g",
        (queue, actor, sleep_s, n),
    )


def send_through_the_log(url: str, actor: str, calls: list[dict[str, Any]], *, queue: str = "tests",
                         options: dict[str, Any] | None = None, delay_ms: int = 0) -> list[str]:
    """``calls`` (each ``message_with_options``'s arguments) sent in one batch by a producer
    that knows ``actor`` (with ``options``): plain jobs go to the job log, delayed ones
    (``delay_ms``) to job_queue. Returns their ids."""
    with log_producer(url, queue, {actor: options or {}}) as producer:
        sender = producer.actors[actor]
        sent = producer.enqueue_many([sender.message_with_options(**call) for call in calls], delay=delay_ms or None)
    return [m.message_id for m in sent]


@contextlib.contextmanager
def log_producer(url: str, queue: str, actors: dict[str, dict[str, Any]], **broker: Any) -> Iterator[PostgresBroker]:
    """A producer that knows ``actors`` (stand-ins by name on ``queue``, with their options):
    the plain jobs it sends go to the job log, the default storage's path for an app's jobs,
    where a job inserted by SQL goes to job_queue. ``producer.actors[name].send(...)``."""
    producer = PostgresBroker(url, **broker)
    for name, options in actors.items():
        dramatiq.actor(broker=producer, queue_name=queue, actor_name=name, **options)(_stand_in)
    try:
        yield producer
    finally:
        producer.close()


def _stand_in(*args: Any, **kwargs: Any) -> None:
    """A producer's actor: the workers run the real one."""


def wait_all_succeeded(conn: psycopg.Connection, expected: int, timeout: float = 60.0) -> None:
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == expected, timeout,
             interval=0.1, message=f"{expected} jobs succeeded; now "
             + str(conn.execute("SELECT status, count(*) FROM jobs GROUP BY 1").fetchall()))
    assert scalar(conn, "SELECT count(*) FROM jobs") == expected


def assert_exactly_once(conn: psycopg.Connection, expected: int) -> None:
    """Every job ran exactly once: one test_results row per job, no more, no fewer."""
    wait_all_succeeded(conn, expected)
    dupes = conn.execute(
        "SELECT job_id, count(*) FROM test_results GROUP BY 1 HAVING count(*) > 1 LIMIT 5").fetchall()
    assert dupes == [], f"jobs that ran twice: {dupes}"
    assert scalar(conn, "SELECT count(DISTINCT job_id) FROM test_results") == expected
