"""WorkerSettings: everything one worker process needs, built from a role in one place."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import defaults
from ..config import Config, Retention, ScheduleConfig


@dataclass(frozen=True)
class WorkerSettings:
    """Built once, from the CLI (`supervisor worker`) or from a config role (`from_role`)."""

    queues: tuple[str, ...]
    actors: tuple[str, ...]
    role: str = "worker"
    threads: int = defaults.THREADS
    # Rows a process may hold claimed (running or waiting for a thread). None: paced
    # (broker/pace.py): threads rows, up to PREFETCH_PER_THREAD x threads while jobs are short.
    prefetch: int | None = None
    lease_seconds: float = defaults.LEASE_SECONDS
    heartbeat_seconds: float = defaults.HEARTBEAT_SECONDS
    shutdown_timeout: float = defaults.SHUTDOWN_TIMEOUT
    poll_interval: float = defaults.POLL_INTERVAL
    max_retries: int = defaults.MAX_RETRIES
    min_backoff_ms: int = defaults.MIN_BACKOFF_MS
    max_backoff_ms: int = defaults.MAX_BACKOFF_MS
    retention: Retention = field(default_factory=Retention)
    time_limit_ms: int | None = None
    # Cron schedules this process helps fire (scheduler_locks make each fire once).
    schedules: tuple[ScheduleConfig, ...] = ()
    # The config's app sections (e.g. `pipeline:`), read by app code via supervisor.runtime.
    app_settings: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    # Queue -> default priority of a job sent there without one (every role's, from the config).
    queue_priorities: dict[str, int] = field(default_factory=dict, compare=False, hash=False)

    # One log line per finished job (supervisor.jobs logger). It costs a log record per job,
    # which shows only on jobs that do nothing (bench/README.md, "The per-job log line").
    job_log: bool = True

    @property
    def capacity(self) -> int:
        """Rows this process may hold claimed at once (at most, when paced)."""
        return defaults.capacity(self.threads, self.prefetch)

    @classmethod
    def from_role(cls, cfg: Config, name: str) -> WorkerSettings:
        """The settings a child of role ``name`` runs with."""
        r = cfg.role(name)
        return cls(
            queues=r.queues,
            actors=r.actors,
            role=r.name,
            threads=r.threads,
            prefetch=r.prefetch,
            lease_seconds=r.lease,
            heartbeat_seconds=r.heartbeat,
            shutdown_timeout=r.shutdown_timeout,
            poll_interval=r.poll_interval,
            max_retries=r.max_retries,
            min_backoff_ms=int(r.min_backoff * 1000),
            max_backoff_ms=int(r.max_backoff * 1000),
            time_limit_ms=int(r.time_limit * 1000) if r.time_limit else None,
            schedules=cfg.schedules,
            job_log=cfg.supervisor.job_log,
            retention=cfg.retention,
            app_settings=dict(cfg.app_settings),
            queue_priorities=cfg.queue_priorities(),
        )
