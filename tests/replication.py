"""A real primary and a synchronous streaming standby (Debian's PostgreSQL binaries), on
loopback ports, for the failover tests and bench/failover.py.

The pair is built as an operator would: ``initdb`` for the primary, ``pg_basebackup -R``
for the standby (its WAL receiver named ``standby``, the primary's only
``synchronous_standby_names``, so a commit returns once the standby has it: a failover
loses nothing). ``fail_over()`` stops the primary (``immediate``: a crash, or ``fast``:
a switchover) and promotes the standby. PostgreSQL refuses to run as root: as root the
servers run as ``postgres`` (runuser) in a temporary directory that user owns.

Outside CI a test skips with a one-line reason when the binaries are absent.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

BIN_DIRS = ("/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/17/bin")
RUN_AS = "postgres"  # the servers' user when this process is root
STANDBY_NAME = "standby"
# Settings of both servers: small, quick to start and stop, and a synchronous standby.
SETTINGS = f"""
listen_addresses = '127.0.0.1'
max_connections = 200
shared_buffers = 32MB
fsync = off
full_page_writes = off
wal_level = replica
max_wal_senders = 4
wal_keep_size = 64MB
hot_standby = on
synchronous_standby_names = '{STANDBY_NAME}'
synchronous_commit = on
wal_receiver_status_interval = 1s
logging_collector = off
"""


def bin_dir() -> Path | None:
    explicit = os.environ.get("PG_BINDIR")
    for d in (explicit, *BIN_DIRS) if explicit else BIN_DIRS:
        if d and (Path(d) / "pg_basebackup").exists():
            return Path(d)
    return None


def require() -> Path:
    import pytest

    found = bin_dir()
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail("PostgreSQL server binaries are missing (apt-get install postgresql-15); CI must run these tests")
    pytest.skip("PostgreSQL server binaries are missing (apt-get install postgresql-15)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Pair:
    """A primary on ``ports[0]`` and its synchronous standby on ``ports[1]``."""

    def __init__(self, binaries: Path | None = None) -> None:
        self.bin = binaries or bin_dir()
        if self.bin is None:
            raise RuntimeError("PostgreSQL server binaries are missing (apt-get install postgresql-15)")
        self.root = Path(tempfile.mkdtemp(prefix="pgpair-"))
        self.user = RUN_AS if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        if os.geteuid() == 0:
            shutil.chown(self.root, self.user)
        self.ports = (free_port(), free_port())
        self.dirs = (self.root / "a", self.root / "b")
        self.primary = 0  # index of the server that is (or will become) the primary
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    # -- building ------------------------------------------------------------------
    def _run(self, argv: Sequence[str], timeout: float = 120) -> str:
        """A binary as the servers' user; its output, or a RuntimeError with it."""
        if os.geteuid() == 0:
            argv = ["runuser", "-u", self.user, "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=self.root)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stdout}{done.stderr}")
        return done.stdout

    def _build(self) -> None:
        a, b = self.dirs
        self._run([str(self.bin / "initdb"), "-D", str(a), "-A", "trust", "-U", "postgres", "--no-sync",
                   "-E", "UTF8", "--locale", "C"])
        with open(a / "postgresql.conf", "a") as conf:
            conf.write(SETTINGS + f"port = {self.ports[0]}\nunix_socket_directories = '{self.root}'\n")
        self.start(0)
        self._run([str(self.bin / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.ports[0]), "-U", "postgres",
                   "-D", str(b), "-R", "-X", "stream", "--no-sync", "-c", "fast"])
        # The standby listens on its own port and names itself, so the primary's
        # synchronous_standby_names waits for it. Promoted, it has no standby of its own
        # and commits alone (as Patroni's non-strict synchronous mode does): with the
        # primary's setting it would wait for ever on every commit.
        with open(b / "postgresql.auto.conf", "a") as conf:
            conf.write(f"port = {self.ports[1]}\nsynchronous_standby_names = ''\n"
                       f"primary_conninfo = 'host=127.0.0.1 port={self.ports[0]} user=postgres"
                       f" application_name={STANDBY_NAME}'\n")
        self.start(1)
        self.wait_streaming()

    def start(self, i: int) -> None:
        self._run([str(self.bin / "pg_ctl"), "-D", str(self.dirs[i]), "-l", str(self.log_path(i)), "-w",
                   "-t", "60", "start"])

    def stop(self, i: int, mode: str = "immediate") -> None:
        self._run([str(self.bin / "pg_ctl"), "-D", str(self.dirs[i]), "-m", mode, "-w", "-t", "60", "stop"])

    def promote(self, i: int) -> None:
        """Promote server ``i`` and wait until it accepts writes (``pg_ctl promote -w``)."""
        self._run([str(self.bin / "pg_ctl"), "-D", str(self.dirs[i]), "-w", "-t", "60", "promote"])
        self.primary = i

    def log_path(self, i: int) -> Path:
        return self.root / f"server-{'ab'[i]}.log"

    def logs(self) -> str:
        return "\n".join(f"--- server {'ab'[i]}\n{p.read_text()[-3000:]}"
                         for i in (0, 1) if (p := self.log_path(i)).exists())

    # -- addresses -----------------------------------------------------------------
    def server_url(self, i: int, dbname: str = "postgres") -> str:
        return make_conninfo(host="127.0.0.1", port=str(self.ports[i]), user="postgres", dbname=dbname)

    def url(self, dbname: str = "postgres") -> str:
        """Both servers in one libpq multi-host URL that connects only to the writable one."""
        return (f"postgresql://postgres@127.0.0.1:{self.ports[0]},127.0.0.1:{self.ports[1]}/{dbname}"
                "?target_session_attrs=read-write")

    def standby_url(self, dbname: str = "postgres") -> str:
        return self.server_url(1 - self.primary, dbname)

    # -- state -----------------------------------------------------------------------
    def wait_streaming(self, timeout: float = 60.0) -> None:
        """Until the primary sees the standby streaming as its synchronous standby."""
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.server_url(self.primary), autocommit=True) as c:
            while True:
                row = c.execute("SELECT sync_state FROM pg_stat_replication WHERE application_name = %s",
                                (STANDBY_NAME,)).fetchone()
                if row and row[0] == "sync":
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the standby is not streaming synchronously ({row})\n{self.logs()}")
                time.sleep(0.05)  # the WAL receiver connects on its own schedule: nothing to wait on

    def fail_over(self, mode: str = "immediate") -> float:
        """Stop the primary (``immediate``: as a crash; ``fast``: a switchover), promote the
        standby; returns the monotonic time at which the promote returned (writable)."""
        old = self.primary
        self.stop(old, mode)
        self.promote(1 - old)
        return time.monotonic()

    def close(self) -> None:
        for i in (0, 1):
            if (self.dirs[i] / "postmaster.pid").exists():
                with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                    self.stop(i, "immediate")
        shutil.rmtree(self.root, ignore_errors=True)
