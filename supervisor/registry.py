"""The `workers` registry: every process (worker, master, HTTP) registers, beats
and stops through this one class, as Solid Queue's Registrable. Its SQL lives here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from . import servers
from .identity import node_name

log = logging.getLogger(__name__)

# beat_seconds, session_name and server_started: what another process needs to tell
# that this one died (see liveness.py and sql.RELEASE_DEAD; a pooled process has no
# session_name and is left to its leases). beat_seconds alone tells the reaper that this
# process renews what it holds before each beat (sql.REAP_EXPIRED skips it while it beats).
REGISTER = """
INSERT INTO workers (id, host, pid, role, queues, state, capacity, beat_seconds, session_name, server_started)
VALUES (%(id)s, %(host)s, %(pid)s, %(role)s, %(queues)s, 'running', %(capacity)s, %(beat_seconds)s,
        %(session_name)s, pg_postmaster_start_time())
ON CONFLICT (id) DO UPDATE SET state = 'running', heartbeat_at = now(), stopped_at = NULL,
                               server_started = pg_postmaster_start_time()
"""

BEAT = """
UPDATE workers
   SET heartbeat_at = now(), state = %(state)s, paused_reason = %(paused)s, rss_bytes = %(rss)s, cpu_percent = %(cpu)s,
       jobs_in_flight = %(in_flight)s, jobs_done = %(done)s, server_started = pg_postmaster_start_time(),
       db_server = %(server)s, db_server_since = to_timestamp(%(server_since)s::float8),
       db_server_previous = %(server_previous)s
 WHERE id = %(id)s
"""

STOPPED = """
UPDATE workers SET state = %(state)s, stopped_at = now(), jobs_in_flight = 0 WHERE id = %(id)s
"""

# Processes found dead by their beat (liveness.py) once none of their rows is left running.
# Hosts (node names) in the registry: live processes, last beat, and whether any still
# beats (a live row that beat within stale_beats of its interval, else of the default).
NODES = """
SELECT host AS node,
       count(*) FILTER (WHERE stopped_at IS NULL) AS live_processes,
       max(heartbeat_at) AS last_beat_at,
       extract(epoch FROM now() - max(heartbeat_at))::float8 AS beat_age_s,
       coalesce(bool_or(stopped_at IS NULL AND heartbeat_at > now() - %(stale_beats)s
                        * coalesce(beat_seconds, %(heartbeat_s)s) * interval '1 second'), false) AS beating
  FROM workers
 WHERE %(node)s::text IS NULL OR host = %(node)s
 GROUP BY host
 ORDER BY host
"""

# A forgotten host: its processes that never said they stopped are lost.
FORGET_NODE = """
UPDATE workers SET state = 'lost', stopped_at = now(), jobs_in_flight = 0
 WHERE host = %(node)s AND stopped_at IS NULL
RETURNING id
"""

LOST = """
UPDATE workers w SET state = 'lost', stopped_at = now(), jobs_in_flight = 0
 WHERE w.id = ANY(%(ids)s) AND w.stopped_at IS NULL
   AND NOT EXISTS (SELECT 1 FROM job_queue j
                    WHERE j.lease_owner = w.id AND j.status = 'running' AND j.claimed_at IS NOT NULL)
"""

# Rows of processes that stopped (or vanished) long ago.
PRUNE = """
DELETE FROM workers
 WHERE heartbeat_at < now() - %(older_than_s)s * interval '1 second'
"""

LIST = """
SELECT id, host, pid, role, queues, state, started_at, heartbeat_at, stopped_at,
       rss_bytes, cpu_percent, jobs_in_flight, jobs_done, capacity, paused_reason,
       db_server, db_server_since, db_server_previous
  FROM workers
 WHERE stopped_at IS NULL OR stopped_at > now() - interval '1 hour'
 ORDER BY host, role, started_at
"""

# Masters, with how long ago each last beat (seconds, by the database's clock).
MASTERS = """
SELECT id, host, pid, state, stopped_at, extract(epoch FROM now() - heartbeat_at)::float8 AS beat_age
  FROM workers
 WHERE role = 'master'
 ORDER BY heartbeat_at DESC
"""

# Live processes per role: not stopped, and beating within the given window.
LIVE_BY_ROLE = """
SELECT role, count(*) AS n
  FROM workers
 WHERE stopped_at IS NULL AND role <> 'master'
   AND heartbeat_at > now() - %(fresh_s)s * interval '1 second'
 GROUP BY role
"""


@dataclass(frozen=True)
class Beat:
    state: str
    in_flight: int = 0
    done: int = 0
    paused: str | None = None  # why it does not claim (the resource guard), None: it claims


class SelfUsage:
    """This process's RSS and CPU % since the last sample, as psutil.Process gives
    them, read from /proc/self/statm and os.times() where there is /proc: psutil
    costs a worker RSS for two numbers a beat (bench/README.md, "Figures the code's
    comments cite"); elsewhere it is used."""

    _PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def __init__(self) -> None:
        self._proc: Any = None
        self._last: tuple[float, float] | None = None  # (CPU seconds, monotonic) at the last sample
        if not os.path.exists("/proc/self/statm"):
            import psutil  # no /proc (macOS): psutil reads the same numbers its own way

            self._proc = psutil.Process()
        self.cpu_percent()

    def rss(self) -> int:
        if self._proc is not None:
            return int(self._proc.memory_info().rss)
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * self._PAGE

    def cpu_percent(self) -> float:
        """CPU time over wall time since the previous call, in % of one core (0.0 the first time)."""
        if self._proc is not None:
            return float(self._proc.cpu_percent(None))
        t = os.times()
        cpu, wall = t.user + t.system, time.monotonic()
        last, self._last = self._last, (cpu, wall)
        if last is None or wall <= last[1]:
            return 0.0
        return round((cpu - last[0]) / (wall - last[1]) * 100, 1)


class Registration:
    """One process's row in `workers`. ``beat`` samples RSS and CPU itself."""

    def __init__(self, pool: ConnectionPool, worker_id: str, *, role: str, queues: list[str],
                 capacity: int | None = None, beat_seconds: float | None = None,
                 session_name: str | None = None) -> None:
        self.pool = pool
        self.id = worker_id
        self.role = role
        self.queues = queues
        self.capacity = capacity  # rows it may hold claimed at once (None: it runs no jobs)
        # Both set: other processes release this one's jobs once its beat is that old
        # and the server holds no session of that name (see liveness.py). beat_seconds
        # set: the reaper skips its rows while it beats (it renews them first).
        self.beat_seconds = beat_seconds
        self.session_name = session_name
        self._usage = SelfUsage()

    def register(self, timeout: float = 30.0) -> None:
        with self.pool.connection(timeout=timeout) as c:
            c.execute(REGISTER, {"id": self.id, "host": node_name(), "pid": os.getpid(),
                                 "role": self.role, "queues": self.queues, "capacity": self.capacity,
                                 "beat_seconds": self.beat_seconds, "session_name": self.session_name})

    def sample(self, beat: Beat) -> dict[str, object]:
        """The BEAT parameters, sampled now (callable from a thread that must not wait on the database)."""
        # The server this process's connections to the pool's URL reach (servers.note_server;
        # db.make_pool's pools have a URL, psycopg_pool's may have a function instead).
        url = self.pool.conninfo
        seen = servers.server_seen(url) if isinstance(url, str) else None
        return {"id": self.id, "state": beat.state, "rss": self._usage.rss(),
                "cpu": self._usage.cpu_percent(), "in_flight": beat.in_flight, "done": beat.done,
                "paused": beat.paused, "server": seen.address if seen else None,
                "server_since": seen.since if seen else None,
                "server_previous": seen.previous if seen else None}

    def beat(self, beat: Beat, params: dict[str, object] | None = None) -> None:
        """Write the beat; once more at once on a fresh connection if the server ended
        the first (a beat missed for nothing would age the process towards release)."""
        params = params or self.sample(beat)
        try:
            self._write(BEAT, params)
        except PoolTimeout:
            raise
        except psycopg.OperationalError:
            with contextlib.suppress(Exception):
                self.pool.check()
            self._write(BEAT, params)

    def _write(self, statement: str, params: dict[str, object]) -> None:
        with self.pool.connection(timeout=10) as c:
            c.execute(statement, params)

    def mark_lost(self, worker_ids: list[str]) -> None:
        """Mark processes found dead (liveness.py) lost, once none of their rows runs."""
        self._write(LOST, {"ids": worker_ids})

    def stop(self, state: str = "stopped", *, worker_id: str | None = None) -> None:
        """Mark this process's row (or another's, for a reaped child) stopped."""
        with self.pool.connection(timeout=10) as c:
            c.execute(STOPPED, {"id": worker_id or self.id, "state": state})

    def prune(self, older_than_s: float) -> None:
        with self.pool.connection(timeout=10) as c:
            c.execute(PRUNE, {"older_than_s": older_than_s})

    def list(self) -> list[tuple[Any, ...]]:
        with self.pool.connection(timeout=10) as c:
            return c.execute(LIST).fetchall()
