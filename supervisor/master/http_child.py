"""The HTTP child: one more supervised child, run like a role of one process.

The master keeps it in its book as the pseudo-role ``http`` (so `status` shows it,
a crash is restarted with the role's backoff, and a reload that changes ``http:``
rolls it), but forks it with ``HttpBootstrap`` instead of a worker. The master
never imports the HTTP package: the child imports the server factory by its
dotted path (``SERVER_FACTORY``), after the fork, so the master process never
loads Starlette or uvicorn and never serves or waits on HTTP.
"""

from __future__ import annotations

import importlib
import os
import threading
from typing import Any

import psutil

from .. import exit_codes
from ..config import Config, HttpConfig, RoleConfig
from ..worker.settings import WorkerSettings
from .bootstrap import Bootstrap, ChildSpec
from .children import RoleState

HTTP_ROLE = "http"
SERVER_FACTORY = "supervisor.http.server:build"
SHUTDOWN_TIMEOUT = 5.0  # seconds for open requests to finish before the child is killed


def http_role_state(cfg: Config) -> RoleState | None:
    """The pseudo-role for the config's `http:` section (None when it has none)."""
    if cfg.http is None:
        return None
    role = RoleConfig(name=HTTP_ROLE, queues=(), actors=(), processes=1, threads=1,
                      shutdown_timeout=SHUTDOWN_TIMEOUT)
    return RoleState(role, WorkerSettings(role=role), http=cfg.http)


def apply_http(roles: dict[str, RoleState], new: Config, change: str | None) -> None:
    """A reload's ``Diff.http``: start, roll (a new child listens beside the old one
    until it has drained), or drain the HTTP child."""
    role = roles.get(HTTP_ROLE)
    if change is None:
        return
    if new.http is None:
        if role is not None:
            role.removed = True
        return
    if role is None:
        fresh = http_role_state(new)
        assert fresh is not None
        roles[HTTP_ROLE] = fresh
        return
    role.generation += 1
    role.removed = False
    role.http = new.http


class HttpBootstrap(Bootstrap):
    """Runs the HTTP server until SIGTERM (uvicorn stops gracefully) or the master goes."""

    def __init__(self, spec: ChildSpec, close_fds: list[int], *, http: HttpConfig, config: Config) -> None:
        super().__init__(spec, close_fds)
        self.http = http
        self.config = config
        self.server: Any = None
        self.stopping = threading.Event()

    def serve(self) -> int:
        module, _, name = SERVER_FACTORY.partition(":")
        build = getattr(importlib.import_module(module), name)
        # reuse_port: during a roll the new child listens beside the old one.
        self.server = build(url=self.spec.database.url, listen_url=self.spec.database.listen_url, http=self.http,
                            config=self.config, reuse_port=True)
        threading.Thread(target=self._beats, name="beats", daemon=True).start()
        self.server.run()
        self.stopping.set()
        return exit_codes.OK

    def master_gone(self, why: str) -> None:
        self.stopping.set()
        if self.server is not None:
            self.server.stop()

    def _beats(self) -> None:
        """Ready once uvicorn listens; then a beat every interval (the master's hang check)."""
        assert self.beacon is not None
        proc = psutil.Process()
        proc.cpu_percent(None)
        ready = False
        while not self.stopping.wait(self.tick_interval if ready else 0.05):
            if os.getppid() != self.spec.master_pid:
                self.master_gone("parent changed")
                return
            if not ready:
                if not self.server.started:
                    continue
                ready = True
                self.beacon.send("ready", owner=self.owner_for(os.getpid()))
            self.beacon.send("beat", state="running", rss=proc.memory_info().rss,
                             cpu=round(proc.cpu_percent(None), 1), in_flight=0, done=0, paused=None)
