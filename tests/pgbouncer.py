"""A real PgBouncer (Debian's package) in transaction pooling mode, on a loopback
port, in front of the test server. Outside CI a test skips with a one-line
reason when the binary is absent; `.ci/run` installs it."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.conftest import stop

BINARY = shutil.which("pgbouncer") or ("/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None)
# PgBouncer refuses to run as root; as root we tell it to switch to this user.
RUN_AS = "postgres"


def require() -> str:
    if BINARY:
        return BINARY
    if os.environ.get("CI"):
        pytest.fail("pgbouncer is not installed (apt-get install pgbouncer); CI must run these tests")
    pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)")


def _run_as(host: str) -> str:
    """The user pgbouncer runs as: the owner of the server's socket directory when it
    is a private one (the embedded server's data directory), else RUN_AS."""
    if host.startswith("/"):
        owner = pwd.getpwuid(os.stat(host).st_uid).pw_name
        if owner != "root":
            return owner
    return RUN_AS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgBouncer:
    def __init__(self, server_url: str, *, pool_size: int = 20) -> None:
        binary = require()
        params = conninfo_to_dict(server_url)
        host = params.get("host") or "/var/run/postgresql"
        port = params.get("port") or "5432"
        user = params.get("user") or "postgres"
        self.dir = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
        self.port = _free_port()
        (self.dir / "users.txt").write_text(f'"{user}" ""\n')
        (self.dir / "pgbouncer.ini").write_text(f"""
[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
admin_users = {user}
auth_file = {self.dir / 'users.txt'}
pool_mode = transaction
default_pool_size = {pool_size}
max_client_conn = 2000
server_reset_query =
logfile = {self.dir / 'pgbouncer.log'}
pidfile = {self.dir / 'pgbouncer.pid'}
""")
        argv = [binary, str(self.dir / "pgbouncer.ini")]
        if os.geteuid() == 0:
            user = _run_as(host)
            shutil.chown(self.dir, user)
            for f in self.dir.iterdir():
                shutil.chown(f, user)
            argv[1:1] = ["-u", user]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.url = make_conninfo(server_url, host="127.0.0.1", port=str(self.port))
        try:
            self._wait_up()
        except BaseException:
            self.stop()  # never leave a pgbouncer behind a failed start
            raise

    def _wait_up(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited: {self.proc.stderr.read().decode() if self.proc.stderr else ''}"
                                   f"{self.log()}")
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=2, prepare_threshold=None) as c:
                    c.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)  # the binary is starting; nothing to wait on but its port

    def log(self) -> str:
        try:
            return (self.dir / "pgbouncer.log").read_text()
        except OSError:
            return ""

    def stop(self) -> None:
        stop(self.proc, 10)  # SIGTERM: immediate shutdown (SIGINT waits for clients)
        shutil.rmtree(self.dir, ignore_errors=True)
