"""A pytest plugin: run Dramatiq actor tests against PostgresBroker on a real PostgreSQL.

Enable it in your top-level ``conftest.py`` (``pytest_plugins = ["supervisor.testing"]``)
or on the command line (``-p supervisor.testing``). At start-up it creates a
throwaway database on the server of ``SUPERVISOR_TEST_DATABASE_URL`` (else the
embedded PostgreSQL), migrates it, and installs a PostgresBroker on it as
Dramatiq's global broker, so the actor modules your tests import bind to it.
The database is dropped at the end of the session; under pytest-xdist each
worker gets its own.

Fixtures:
  supervisor_broker: that broker, every table emptied before the test. Its
    ``join(queue)`` raises the exception of a job that failed, as the stub
    broker's does (``fail_fast=False`` to just wait).
  supervisor_worker: a Dramatiq Worker on it (``worker_timeout=100``), stopped
    after the test.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable, Iterator

import dramatiq
import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from . import apps, db
from .broker import PostgresBroker
from .migrate import migrate

SERVER_ENV = "SUPERVISOR_TEST_DATABASE_URL"
_BATCHES_GO_ON = """
SELECT setval(pg_get_serial_sequence('job_lease', 'batch'), (extract(epoch FROM clock_timestamp()) * 1e6)::bigint)
 WHERE to_regclass('job_lease') IS NOT NULL
"""
_ALL_TABLES = "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'schema_migrations'"


def empty_tables(conn: psycopg.Connection) -> None:
    """TRUNCATE every table but the migration ledger (a test's clean slate)."""
    tables = [row[0] for row in conn.execute(_ALL_TABLES)]
    if tables:
        names = ", ".join(f'"{t}"' for t in tables)
        conn.execute(f"TRUNCATE {names} RESTART IDENTITY CASCADE".encode())
        # A broker that outlives the tables (a session-wide fixture) remembers its log batches
        # by number, and sends the ones it finished with its next write: numbers must not
        # come round again, or it would end a new test's batch of the same number.
        conn.execute(_BATCHES_GO_ON)


class ThrowawayDatabase:
    """A database created on a server (migrated, or empty), dropped by ``drop``.
    The project's own tests make theirs with it too."""

    def __init__(self, server_url: str, prefix: str = "supervisor_test") -> None:
        self.server_url = server_url
        self.name = f"{prefix}_{os.getpid()}_{secrets.token_hex(3)}"
        self.url = make_conninfo(server_url, dbname=self.name)

    def create(self, owners: Iterable[apps.App] | None = None) -> str:
        """Create it with the runtime's tables and those of ``owners`` (default: every
        installed app); returns its URL."""
        self.create_empty()
        migrate(self.url, apps.installed() if owners is None else owners)
        return self.url

    def create_empty(self) -> str:
        """Create it with no table at all; returns its URL."""
        with psycopg.connect(self.server_url, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{self.name}"'.encode())
        return self.url

    def drop(self) -> None:
        with psycopg.connect(self.server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'.encode())


_state: dict[str, object] = {}


def _is_xdist_controller(config: pytest.Config) -> bool:
    # The controller only hands out tests; its workers each run this plugin.
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    if _is_xdist_controller(config) or "broker" in _state:
        return
    database = ThrowawayDatabase(os.environ.get(SERVER_ENV) or db.embedded_url())
    broker = PostgresBroker(database.create(), fail_fast_default=True)
    dramatiq.set_broker(broker)
    _state.update(database=database, broker=broker)


def pytest_unconfigure(config: pytest.Config) -> None:
    broker, database = _state.pop("broker", None), _state.pop("database", None)
    if isinstance(broker, PostgresBroker):
        broker.close()
    if isinstance(database, ThrowawayDatabase):
        database.drop()


@pytest.fixture
def supervisor_broker() -> PostgresBroker:
    broker = _state.get("broker")
    if not isinstance(broker, PostgresBroker):
        pytest.fail("supervisor.testing did not install a broker (is this the xdist controller?)")
    with broker.pool.connection() as conn:
        empty_tables(conn)
    broker.forget_failures()
    return broker


@pytest.fixture
def supervisor_worker(supervisor_broker: PostgresBroker) -> Iterator[dramatiq.Worker]:
    worker = dramatiq.Worker(supervisor_broker, worker_timeout=100)
    worker.start()
    yield worker
    worker.stop()
    supervisor_broker.flush_acks(10)
    # A stopped Worker's middleware would start consumers for queues declared later.
    supervisor_broker.middleware = [m for m in supervisor_broker.middleware if getattr(m, "worker", None) is not worker]
