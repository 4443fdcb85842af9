"""What every request handler shares: the settings, one small connection pool, and the
apps in use (whose pages, alerts and gauges are shown)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from contextvars import ContextVar
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
# Seconds a read waits for a connection to database.read_url before it reads from the
# primary instead; and how long after such a miss reads go to the primary without trying.
READ_WAIT = 0.5
READ_RETRY_SECONDS = 10.0
# Where this request's last read went: "standby" (database.read_url) or "primary". Set by
# AppState.reading in the handler's thread; the page footer and the API's read_from show it.
read_from: ContextVar[str] = ContextVar("read_from", default="primary")

log = logging.getLogger(__name__)

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
    read_pool: ConnectionPool | None = field(default=None, repr=False)
    _reader_down_until: float = field(default=0.0, init=False, repr=False)
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
            with self.reading() as conn:
                read = (now, frozenset(a.name for a in migrated_apps(conn, apps.installed())))
            self._migrated = read
        return tuple(a for a in wanted if a.name in read[1])

    @property
    def control_socket(self) -> Path | None:
        return self.config.supervisor.control_socket if self.config is not None else None

    @property
    def read_url(self) -> str | None:
        return self.config.database.read_url if self.config is not None else None

    def open(self) -> None:
        if self.pool is None:
            self.pool = db.make_pool(self.url, min_size=0, max_size=POOL_SIZE, name="http",
                                     options=SESSION_OPTIONS)
        if self.read_pool is None and self.read_url:
            self.read_pool = db.make_pool(self.read_url, min_size=0, max_size=POOL_SIZE, name="http-read",
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
        for pool in (self.pool, self.read_pool):
            if pool is not None:
                pool.close()
        self.pool = self.read_pool = None

    @contextlib.contextmanager
    def connection(self, timeout: float = POOL_WAIT) -> Iterator[psycopg.Connection]:
        self.open()
        assert self.pool is not None
        with self.pool.connection(timeout=timeout) as conn:
            yield conn

    @contextlib.contextmanager
    def reading(self, timeout: float = POOL_WAIT) -> Iterator[psycopg.Connection]:
        """A connection for reads only: to database.read_url (a standby) when it is set and
        answers within READ_WAIT, else to the primary; ``read_from`` says which."""
        self.open()
        with contextlib.ExitStack() as stack:
            conn: psycopg.Connection | None = None
            if self.read_pool is not None and time.monotonic() >= self._reader_down_until:
                try:
                    conn = stack.enter_context(self.read_pool.connection(timeout=READ_WAIT))
                except psycopg.OperationalError as exc:  # PoolTimeout too: reads go to the primary a while
                    self._reader_down_until = time.monotonic() + READ_RETRY_SECONDS
                    log.warning("database.read_url %s unreachable (%s); reading from the primary for %gs",
                                db.redact(self.read_url or ""), " ".join(str(exc).split()), READ_RETRY_SECONDS)
            read_from.set("primary" if conn is None else "standby")
            if conn is None:
                conn = stack.enter_context(self.connection(timeout))
            yield conn


def state_of(request: Request) -> AppState:
    state: AppState = request.app.state.supervisor
    return state
