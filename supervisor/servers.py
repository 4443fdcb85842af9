"""Which database server this process reaches, and why its connections were made anew.

Any process (worker, master, HTTP child, producer) keeps here:

- ``ServerSeen`` per URL: the server (``host:port``, as libpq reached it) its newest
  connection reached, and after a change (a failover or a switchover, as this process
  saw it) since when and which one before. Noted by every pool's ``configure``
  (``db.make_pool``): no round trip, libpq knows.
- ``actor_supervisor_db_reconnects_total{cause}``: each connection the process lost and
  made anew, by what ended it (``cause_of``), and ``failover`` once each time its new
  connections to a URL reach another server. Written, as the thread errors are
  (broker/threads.py), into the prometheus_client multiprocess files where
  $PROMETHEUS_MULTIPROC_DIR is set (under the master); the HTTP child sums them.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from .defaults import METRICS_DIR_ENV

log = logging.getLogger(__name__)

COUNTER = "actor_supervisor_db_reconnects"  # exposed as ..._total{cause}

# The causes, one label value each (docs/http.md lists them).
FAILOVER = "failover"  # a new connection reached another server than the last one
READ_ONLY = "read_only"  # SQLSTATE 25006: the server took no writes (a standby, a demoted primary)
ADMIN_SHUTDOWN = "admin_shutdown"  # SQLSTATE 57P01: the server ended the session (shutdown, pg_terminate_backend)
CONNECTION_LOST = "connection_lost"  # the connection broke with no word from the server (crash, network)
OTHER = "other"  # another error that left the connection broken (57P02 crash shutdown, a timeout...)
CAUSES = (FAILOVER, READ_ONLY, ADMIN_SHUTDOWN, CONNECTION_LOST, OTHER)

_SQLSTATES = {"25006": READ_ONLY, "57P01": ADMIN_SHUTDOWN}


def cause_of(exc: BaseException) -> str:
    """The cause label of the error that ended a connection."""
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate in _SQLSTATES:
        return _SQLSTATES[sqlstate]
    if sqlstate is None and isinstance(exc, psycopg.OperationalError):
        return CONNECTION_LOST  # libpq's own error: the socket closed or failed under it
    return OTHER


_counter: Any = None
_counter_lock = threading.Lock()


def _family() -> Any:
    """The counter, made on first use (None where no multiprocess directory is set)."""
    global _counter
    if not os.environ.get(METRICS_DIR_ENV):
        return None
    with _counter_lock:
        if _counter is None:
            # Imported here, as the job metrics do: prometheus_client picks its value class
            # from the environment at import time.
            import prometheus_client as prom

            _counter = prom.Counter(COUNTER, "Database connections a process lost and made anew, by cause;"
                                    " failover: its connections reached another server",
                                    ["cause"], registry=prom.CollectorRegistry())
        return _counter


def count(cause: str) -> None:
    family = _family()
    if family is not None:
        family.labels(cause).inc()


def lost(exc: BaseException) -> None:
    """A connection ended by ``exc``: counted by its cause (the pool makes a new one)."""
    count(cause_of(exc))


def declare() -> None:
    """Every cause at 0 (the HTTP child, at a scrape): the family is on /metrics before
    the first reconnect, for a dashboard's query and an alert's ``increase()``."""
    family = _family()
    if family is not None:
        for cause in CAUSES:
            family.labels(cause)


@dataclass(frozen=True)
class ServerSeen:
    """The server (``host:port``) this process's newest connection to a URL reached: with a
    multi-host URL, the one that took writes then. ``previous``/``since``: the one before
    it, and when the change was first seen (a failover, as this process saw it)."""

    address: str
    since: float  # wall-clock time of the first connection to ``address``
    previous: str | None = None


_seen: dict[str, ServerSeen] = {}
_seen_lock = threading.Lock()


def note_server(url: str, conn: psycopg.Connection) -> None:
    """Record which server a new connection to ``url`` reached (no round trip: libpq knows)."""
    address = f"{conn.info.host}:{conn.info.port}"
    with _seen_lock:
        last = _seen.get(url)
        if last is not None and last.address == address:
            return
        _seen[url] = ServerSeen(address, time.time(), last.address if last else None)
    if last is not None:
        log.warning("connected to %s, no longer to %s (a failover or a switchover)", address, last.address)
        count(FAILOVER)


def server_seen(url: str) -> ServerSeen | None:
    with _seen_lock:
        return _seen.get(url)


def last_change(seen: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """Of the servers some processes report (``ServerSeen`` as dicts: a status reply's),
    the newest change one saw (a failover), with ``there``: how many of the ``known``
    processes reach its new server now. None: none saw a change."""
    known = [s for s in seen if s]
    moved = [s for s in known if s.get("previous")]
    if not moved:
        return None
    last = max(moved, key=lambda s: s["since"])
    return {**last, "there": sum(1 for s in known if s["address"] == last["address"]), "known": len(known)}
