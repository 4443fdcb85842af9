"""Shared pieces of the benchmarks: a throw-away migrated database, worker processes,
polling; figures and the rest that needs only psycopg are in basics.py (re-exported here).

Benchmarks measure; they never assert. Everything here talks to a real
PostgreSQL server (DATABASE_URL, default the local one on 127.0.0.1).
"""

from __future__ import annotations

if __name__ == "__main__":  # imported by the scripts as bench.<name>; nothing to run
    raise SystemExit(f"{__file__}: a module the scripts in bench/ import, not a script (bench/README.md lists them)")

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict

# Re-exported: the benchmarks import them from here.
from bench.basics import (  # noqa: F401
    ROOT,
    Figure,
    code_state,
    cpu_seconds,
    print_table,
    say,
    scratch_database,
    server_url,
)
from supervisor import apps
from supervisor.migrate import migrate

QUEUE = "bench"
ACTORS = "bench.bench_actors"

BENCH_TABLES = """
CREATE UNLOGGED TABLE IF NOT EXISTS bench_latency (
    job_id  uuid PRIMARY KEY,
    sent    double precision NOT NULL,
    started double precision NOT NULL
)
"""

# Rows that still have to run (or are running): the drain is over when none is left.
LIVE = "SELECT count(*) FROM jobs WHERE status IN ('pending', 'retryable', 'running')"
COUNTS = "SELECT status, count(*) FROM jobs GROUP BY status"


@contextlib.contextmanager
def bench_database(server: str, *, prefix: str = "as_bench") -> Iterator[str]:
    """Create a fresh, migrated database on ``server``; drop it on the way out
    (also on Ctrl-C), so a run leaves nothing behind."""
    with scratch_database(server, prefix=prefix) as url:
        migrate(url, apps.installed())
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(BENCH_TABLES)
        say(f"bench database {conninfo_to_dict(url)['dbname']} created and migrated")
        yield url


# Every table a job's rows live in, at either storage (a plain job sent goes to the log's
# job_log / job_done, one inserted by SQL or with options to job_queue / job_history).
JOB_TABLES = "job_queue, job_history, job_events, job_log, job_done"


def empty_jobs(conn: psycopg.Connection) -> None:
    """Empty the job tables between phases of a run; workers may stay up (no job live)."""
    conn.execute(f"TRUNCATE {JOB_TABLES}")


def reset(conn: psycopg.Connection) -> None:
    """Empty the tables between runs (workers must be stopped)."""
    conn.execute(f"TRUNCATE {JOB_TABLES}, job_concurrency, workers, bench_latency, job_lease, job_cursor, job_log_cancel")


@dataclass
class WorkerPool:
    """``count`` x ``python -m supervisor.cli worker`` on the bench queue."""

    url: str
    count: int
    threads: int
    queues: str = QUEUE
    actors: str = ACTORS
    # The entry point run with ``python -m``; an experiment may point it at a
    # wrapper that patches the broker before calling the CLI.
    module: str = "supervisor.cli"
    prefetch: int | None = None  # rows a process may hold claimed (default: paced)
    executor: str | None = None  # the role key `executor` (default: the product's, own)
    # The per-job log line (on by default in production) is off here: the bench measures
    # the broker; BENCH_JOB_LOG=1 measures with it (its cost: README.md, "The per-job log line").
    job_log: bool = os.environ.get("BENCH_JOB_LOG") == "1"
    env: dict[str, str] = field(default_factory=dict)
    # Run under OpenTelemetry's launcher (opentelemetry-instrument, of the supervisor[otel] extra).
    traced: bool = False
    # The tree the workers run from (cwd and PYTHONPATH: `-m` puts cwd first on sys.path).
    root: Path = ROOT
    extra: tuple[str, ...] = ()  # more `supervisor worker` flags (e.g. --async-limit 500)
    procs: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    _dir: tempfile.TemporaryDirectory | None = None

    @property
    def job_log_args(self) -> list[str]:
        return [] if self.job_log else ["--no-job-log"]

    def start(self, timeout: float = 60.0) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="as-bench-")
        env = {**os.environ, "DATABASE_URL": self.url, "PYTHONPATH": str(self.root), **self.env}
        for i in range(self.count):
            log = Path(self._dir.name) / f"worker{i}.log"
            self.logs.append(log)
            with log.open("w") as out:
                launcher = [str(Path(sys.executable).with_name("opentelemetry-instrument"))] if self.traced else []
                self.procs.append(subprocess.Popen(
                    [*launcher, sys.executable, "-m", self.module, "worker", "--queues", self.queues,
                     "--actors", self.actors, "--threads", str(self.threads), "--no-migrate",
                     "--log-level", "INFO", *self.job_log_args, *(["--prefetch", str(self.prefetch)] if self.prefetch else []),
                     *(["--executor", self.executor] if self.executor else []), *self.extra],
                    cwd=self.root, env=env, stdout=subprocess.DEVNULL, stderr=out,
                ))
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float) -> None:
        """Ready means every process said so and has a connection that has
        LISTENed (its last statement is the LISTEN, or a claim when the consumer
        claims on its LISTEN connection), so a NOTIFY sent from now on reaches
        all of them. The workloads also run warm-up jobs before timing."""
        dbname = conninfo_to_dict(self.url)["dbname"]
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.url, autocommit=True) as conn:
            while True:
                for proc, log in zip(self.procs, self.logs, strict=True):
                    if proc.poll() is not None:
                        raise RuntimeError(f"worker exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
                said = sum(" ready: " in log.read_text() for log in self.logs)
                listening = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
                    "AND (query LIKE 'LISTEN %%' OR query LIKE '%%FOR UPDATE SKIP LOCKED%%')",
                    (dbname,),
                ).fetchone()[0]
                if said == self.count and listening >= self.count:
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"workers not ready after {timeout}s ({said} ready, {listening} listening)")
                time.sleep(0.05)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def stop(self, timeout: float = 60.0) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, log in zip(self.procs, self.logs, strict=True):
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
                code = "killed"
            if code != 0:
                say(f"  warning: worker {proc.pid} exited {code}; log tail:\n{log.read_text()[-2000:]}")
        if self._dir is not None:
            keep = os.environ.get("BENCH_KEEP_LOGS")  # a directory: the workers' logs are copied there
            if keep:
                Path(keep).mkdir(parents=True, exist_ok=True)
                for log in self.logs:
                    shutil.copy(log, Path(keep) / f"{int(time.time())}-{log.name}")
            self._dir.cleanup()
            self._dir = None
        self.procs.clear()
        self.logs.clear()

    def __enter__(self) -> WorkerPool:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_until(condition: Callable[[], bool], timeout: float, interval: float = 0.005,
               what: str = "condition") -> float:
    """Poll until true; return the monotonic time it was first seen true."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def status_counts(conn: psycopg.Connection) -> dict[str, int]:
    return dict(conn.execute(COUNTS).fetchall())


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(p / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]
