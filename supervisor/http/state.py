"""What every request handler shares: the settings, one small connection pool, and the
apps in use (whose pages, alerts and gauges are shown)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import psycopg
from psycopg_pool import ConnectionPool
from starlette.requests import Request

from .. import apps, db
from ..broker import PostgresBroker
from ..config import Config, HttpConfig
from ..migrate import migrated_apps

# A scrape or an API call must never hold a connection (or a lock) for long.
STATEMENT_TIMEOUT_MS = 5000
# Pages read windows of up to 100,000 rows (the newest jobs of a search, of an hour, of
# the Actors and Errors pages) and sort or group them: within 4 MB (the server's default)
# those sorts spill to disk, 2-5x slower (bench/README.md, "Dashboard at 10 M"). At most
# POOL_SIZE sessions, each one sort or hash at a time in these plans.
WORK_MEM = "64MB"
# JIT compiles a plan whose estimated cost passes jit_above_cost: the Errors page's
# samples (a probe per day partition per group, each costed as if it found 37 rows)
# compiled for 118 ms to run for 9. Nothing here runs long enough to repay it.
SESSION_OPTIONS = f"-c statement_timeout={STATEMENT_TIMEOUT_MS} -c work_mem={WORK_MEM} -c jit=off"
POOL_SIZE = 4
# Seconds a request waits for a connection: a database that is away answers 503 quickly.
POOL_WAIT = 2.0
# Seconds the apps' migrations read from the database stay current: an app migrated
# meanwhile shows within this long, and most pages cost no extra statement.
APPS_RECHECK_SECONDS = 10.0


@dataclass
class AppState:
    url: str
    http: HttpConfig
    # The supervisor's config when there is one: roles for readiness, the control socket.
    config: Config | None = None
    # Which apps are in use: "config" (the HTTP child: those its config uses, none
    # without one) or "database" (`supervisor http`: every installed app); in both, only
    # those whose migrations the database holds (a config may name an app whose tables
    # a reload or --no-migrate left uncreated).
    apps_from: Literal["config", "database"] = "config"
    pool: ConnectionPool | None = field(default=None, repr=False)
    _producer: PostgresBroker | None = field(default=None, init=False, repr=False)
    _migrated: tuple[float, frozenset[str]] | None = field(default=None, init=False, repr=False)

    def apps_in_use(self) -> tuple[apps.App, ...]:
        """The installed apps in use here: only their pages, alerts and gauges are shown.
        Raises when the database is away (and an app could be in use)."""
        if self.apps_from == "config":
            wanted = apps.used_by(self.config) if self.config is not None else ()
        else:
            wanted = apps.installed()
        if not wanted:
            return ()
        now = time.monotonic()
        read = self._migrated
        if read is None or now - read[0] >= APPS_RECHECK_SECONDS:
            with self.connection() as conn:
                read = (now, frozenset(a.name for a in migrated_apps(conn, apps.installed())))
            self._migrated = read
        return tuple(a for a in wanted if a.name in read[1])

    @property
    def control_socket(self) -> Path | None:
        return self.config.supervisor.control_socket if self.config is not None else None

    def open(self) -> None:
        if self.pool is None:
            self.pool = db.make_pool(self.url, min_size=0, max_size=POOL_SIZE, name="http",
                                     options=SESSION_OPTIONS)

    def producer(self) -> PostgresBroker:
        """A broker that only sends (the API's POST /jobs, an app's actions): made on
        first use, one connection, no LISTEN, no consumer."""
        if self._producer is None:
            priorities = self.config.queue_priorities() if self.config is not None else {}
            self._producer = PostgresBroker(self.url, pool_size=1, actor_pool_size=1, listen_url="",
                                            queue_priorities=priorities)
        return self._producer

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
            self._producer = None
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
