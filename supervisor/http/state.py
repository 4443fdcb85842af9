"""What every request handler shares: the settings and one small connection pool."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg_pool import ConnectionPool
from starlette.requests import Request

from .. import db
from ..config import Config, HttpConfig

# A scrape or an API call must never hold a connection (or a lock) for long.
STATEMENT_TIMEOUT_MS = 5000
POOL_SIZE = 4
# Seconds a request waits for a connection: a database that is away answers 503 quickly.
POOL_WAIT = 2.0


@dataclass
class AppState:
    url: str
    http: HttpConfig
    # The supervisor's config when there is one: roles for readiness, the control socket.
    config: Config | None = None
    pool: ConnectionPool | None = field(default=None, repr=False)

    @property
    def control_socket(self) -> Path | None:
        return self.config.supervisor.control_socket if self.config is not None else None

    def open(self) -> None:
        if self.pool is None:
            self.pool = db.make_pool(self.url, min_size=0, max_size=POOL_SIZE, name="http",
                                     options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS}")

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    @contextlib.contextmanager
    def connection(self, timeout: float = POOL_WAIT) -> Iterator[psycopg.Connection]:
        self.open()
        assert self.pool is not None
        with self.pool.connection(timeout=timeout) as conn:
            yield conn


def state_of(request: Request) -> AppState:
    state: AppState = request.app.state.supervisor
    return state
