"""The worker kind of child: one role per entry of `roles:`, each process a
WorkerProcess (worker/process.py) run with the master's hooks.

``WorkerKind`` is what the master asks of the kind (see kinds.py); ``WorkerBootstrap``
is what runs in the child after the fork.
"""

from __future__ import annotations

import logging
import os

from .. import servers
from ..config import Config, Limits, RoleConfig
from ..worker.guard import Guard
from ..worker.process import Hooks, WorkerProcess, run
from ..worker.settings import WorkerSettings
from .beats import Activity, Beat, Draining, Ready, Recycle
from .bootstrap import Bootstrap, ChildSpec

log = logging.getLogger(__name__)


class WorkerKind:
    """Worker processes, forked with the relayed NOTIFY pipe."""

    name = "worker"
    relayed_wakeups = True

    def roles(self, cfg: Config) -> dict[str, RoleConfig]:
        return {r.name: r for r in cfg.roles}

    def changed(self, old: Config, new: Config) -> list[str]:
        """A worker reads these at start beside its role's settings (WorkerSettings.from_role)."""
        out = []
        if old.schedules != new.schedules:
            out.append("schedules")
        if old.retention != new.retention:
            out.append("retention")
        for name in sorted(set(old.app_settings) | set(new.app_settings)):
            if old.app_settings.get(name) != new.app_settings.get(name):
                out.append(name)  # apps read their sections at boot
        return out

    def bootstrap(self, spec: ChildSpec, close_fds: list[int], cfg: Config) -> Bootstrap:
        return WorkerBootstrap(spec, close_fds, settings=WorkerSettings.from_role(cfg, spec.role),
                               limits=cfg.role(spec.role).limits)


class WorkerBootstrap(Bootstrap, Hooks):
    """A worker child: runs a WorkerProcess with the master's hooks."""

    def __init__(self, spec: ChildSpec, close_fds: list[int], *, settings: WorkerSettings, limits: Limits) -> None:
        super().__init__(spec, close_fds)
        self.settings = settings
        self.limits = limits
        self.guard: Guard | None = None
        self.proc: WorkerProcess | None = None

    def serve(self) -> int:
        self.guard = Guard(self.limits, self.ask_recycle)
        return run(self.settings, self.spec.database, owner=self.owner_for(os.getpid()), hooks=self,
                   wakeup_fd=self.wake_fd if self.wake_fd >= 0 else None)

    def master_gone(self, why: str) -> None:
        if self.proc is not None and not self.proc.stopping.is_set():
            log.warning("master is gone (%s); draining", why)
            self.proc.stopping.set()

    def ask_recycle(self, why: str) -> None:
        if self.beacon is not None:
            self.beacon.send(Recycle(why=why))

    # --- the worker's hooks ------------------------------------------------------------

    def on_ready(self, proc: WorkerProcess) -> None:
        assert self.beacon is not None and proc.broker is not None
        self.proc = proc
        self.beacon.send(Ready(owner=proc.broker.owner))

    def on_tick(self, proc: WorkerProcess) -> None:
        assert self.beacon is not None and self.guard is not None and proc.broker is not None
        if os.getppid() != self.spec.master_pid:
            self.master_gone("parent changed")
            return
        broker = proc.broker
        r = self.guard.check(broker, broker.jobs_done)
        if self.guard.paused_for and proc.state == "running":
            proc.state = "paused"
        elif not self.guard.paused_for and proc.state == "paused":
            proc.state = "running"
        proc.paused_reason = self.guard.paused_for
        self.beacon.send(Beat(state=Activity(proc.state), rss=r.rss, cpu=round(r.process_cpu, 1),
                              in_flight=proc.in_flight(), done=broker.jobs_done, paused=self.guard.paused_for,
                              **Beat.server_of(servers.server_seen(self.spec.database.url))))

    def on_stop(self, proc: WorkerProcess) -> None:
        assert self.beacon is not None
        self.beacon.send(Draining())
