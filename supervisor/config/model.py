"""The config as frozen dataclasses, and the error every bad value raises."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import defaults
from .http import HttpConfig


class ConfigError(ValueError):
    """A config problem: where it is and what to do about it."""

    def __init__(self, path: str | Path, line: int | None, key: str | None, message: str) -> None:
        self.path = str(path)
        self.line = line
        self.key = key
        self.message = message
        where = self.path if line is None else f"{self.path}:{line}"
        super().__init__(f"{where}: {key}: {message}" if key else f"{where}: {message}")

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.path, "line": self.line, "key": self.key, "message": self.message, "text": str(self)}


# --- the dataclasses -----------------------------------------------------------


@dataclass(frozen=True)
class DatabaseConfig:
    # None: DATABASE_URL, else the embedded server (supervisor.db.resolve_url decides).
    url: str | None = None
    # A direct connection for LISTEN when url is a transaction pooler (PgBouncer).
    listen_url: str | None = None
    # url goes through a transaction pooler: no server-side prepared statements, and
    # LISTEN only on listen_url (none: consumers poll). None: detected at start.
    pooled: bool | None = None


@dataclass(frozen=True)
class SupervisorConfig:
    control_socket: Path
    state_dir: Path | None = None
    shutdown_timeout: float = defaults.SHUTDOWN_TIMEOUT
    watch_config: bool = False
    tick: float = defaults.TICK
    log_level: str = "INFO"
    log_json: bool = False
    # One log line per finished job (see WorkerSettings.job_log).
    job_log: bool = True
    # A hung or overdue child gets this long after SIGTERM before SIGKILL.
    kill_grace: float = defaults.KILL_GRACE
    # A child that has not become ready this long after its fork is treated as hung.
    start_timeout: float = defaults.START_TIMEOUT
    # Crash backoff per role: restart_backoff * 2^(streak-1), capped.
    restart_backoff: float = defaults.RESTART_BACKOFF
    restart_backoff_max: float = defaults.RESTART_BACKOFF_MAX
    # This supervisor's name in owner ids, the registry, status and logs (default: the
    # host name). Two supervisors on one machine with different names act as two hosts.
    node_name: str | None = None


@dataclass(frozen=True)
class Limits:
    # Host-wide thresholds: over either, a process stops claiming until it recovers
    # (None: off; memory's is on by default, `memory_percent: off` turns it off).
    memory_percent: float | None = defaults.GUARD_MEMORY_PERCENT
    cpu_percent: float | None = None
    # Per-process ceilings: past either, the process is recycled (rolled).
    max_rss: int | None = None
    max_jobs: int | None = None


@dataclass(frozen=True)
class RoleConfig:
    name: str
    queues: tuple[str, ...]
    actors: tuple[str, ...]
    processes: int = 1
    threads: int = defaults.THREADS
    # Claimed-but-unfinished rows a process may hold; None: paced (see defaults.capacity).
    prefetch: int | None = None
    lease: float = defaults.LEASE_SECONDS
    heartbeat: float = defaults.HEARTBEAT_SECONDS
    max_retries: int = defaults.MAX_RETRIES
    min_backoff: float = defaults.MIN_BACKOFF_MS / 1000
    max_backoff: float = defaults.MAX_BACKOFF_MS / 1000
    shutdown_timeout: float = defaults.SHUTDOWN_TIMEOUT
    time_limit: float | None = None
    # Longest a consumer waits between claims when no wake-up (NOTIFY) comes: the
    # latency of work behind a pooled URL with no listen_url, or of a lost NOTIFY.
    poll_interval: float = defaults.POLL_INTERVAL
    # The priority of a job sent to one of this role's queues without one (higher runs
    # first), wherever the sender knows the config: the role's workers (chains, retries,
    # pipelines), `supervisor enqueue`, POST /api/v1/jobs. None: 0.
    priority: int | None = None
    limits: Limits = field(default_factory=Limits)
    line: int = field(default=0, compare=False)

    @property
    def capacity(self) -> int:
        """Rows a process of this role may hold claimed at most."""
        return defaults.capacity(self.threads, self.prefetch)

    def differences(self, other: RoleConfig) -> list[str]:
        """Names of the settings (other than line) that differ from ``other``."""
        names = [f for f in self.__dataclass_fields__ if f not in ("line", "name")]
        return [n for n in names if getattr(self, n) != getattr(other, n)]


@dataclass(frozen=True)
class Retention:
    """How long finished jobs (per final status), events and progress, schedule
    runs, stored results and the audit log of actions are kept, in seconds."""

    succeeded: float = defaults.RETENTION["succeeded"]
    failed: float = defaults.RETENTION["failed"]
    cancelled: float = defaults.RETENTION["cancelled"]
    events: float = defaults.RETENTION["events"]
    runs: float = defaults.RETENTION["runs"]
    results: float = defaults.RETENTION["results"]
    audit: float = defaults.RETENTION["audit"]


@dataclass(frozen=True)
class ScheduleConfig:
    name: str
    cron: str
    actor: str
    queue: str = "default"
    args: tuple[Any, ...] = field(default=(), hash=False)
    kwargs: dict[str, Any] = field(default_factory=dict, hash=False)
    lock_ttl_seconds: float = defaults.SCHEDULE_LOCK_TTL


@dataclass(frozen=True)
class Config:
    path: Path
    database: DatabaseConfig
    supervisor: SupervisorConfig
    roles: tuple[RoleConfig, ...]
    schedules: tuple[ScheduleConfig, ...] = ()
    retention: Retention = field(default_factory=Retention)
    http: HttpConfig | None = None
    # Apps named explicitly under `apps:` (apps owning a role's actor modules are in use anyway).
    apps: tuple[str, ...] = ()
    # Sections owned by apps (e.g. the price tracker's `pipeline:`), as their parsers returned them.
    app_settings: dict[str, Any] = field(default_factory=dict, hash=False)

    def actor_modules(self) -> list[str]:
        return [m for r in self.roles for m in r.actors]

    def queue_priorities(self) -> dict[str, int]:
        """Queue -> the default priority its role gives (roles without one: absent)."""
        return {q: r.priority for r in self.roles if r.priority is not None for q in r.queues}

    @property
    def roles_by_name(self) -> dict[str, RoleConfig]:
        return {r.name: r for r in self.roles}

    def role(self, name: str) -> RoleConfig:
        return self.roles_by_name[name]
