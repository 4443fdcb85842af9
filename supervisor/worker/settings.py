"""WorkerSettings: everything one worker process needs, built from a role in one place."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..config import Config, Retention, RoleConfig, ScheduleConfig, SupervisorConfig


@dataclass(frozen=True)
class WorkerSettings:
    """Built once, from a config role (`from_role`) or from `supervisor worker`'s flags,
    which are the role keys' own (see config/keys.py): a worker reads each role key
    where the config declares it, ``settings.role.lease``."""

    role: RoleConfig
    # Cron schedules this process helps fire (scheduler_locks make each fire once).
    schedules: tuple[ScheduleConfig, ...] = ()
    retention: Retention = field(default_factory=Retention)
    # The config's app sections (e.g. `pipeline:`), read by app code via supervisor.runtime.
    app_settings: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    # Queue -> default priority of a job sent there without one (every role's, from the config).
    queue_priorities: dict[str, int] = field(default_factory=dict, compare=False, hash=False)
    # supervisor.job_log (or --job-log): one log line per finished job (its one default).
    job_log: bool = SupervisorConfig.job_log

    @property
    def capacity(self) -> int:
        """Rows this process may hold claimed at once (at most, when paced)."""
        return self.role.capacity

    @classmethod
    def from_role(cls, cfg: Config, name: str) -> WorkerSettings:
        """The settings a child of role ``name`` runs with."""
        return cls(
            role=cfg.role(name),
            schedules=cfg.schedules,
            job_log=cfg.supervisor.job_log,
            retention=cfg.retention,
            app_settings=dict(cfg.app_settings),
            queue_priorities=cfg.queue_priorities(),
        )
