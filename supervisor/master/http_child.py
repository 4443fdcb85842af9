"""The HTTP kind of child: the role ``http``, one process, when the config has an
``http:`` section.

The master supervises it as it does a worker role (`status` shows it, a crash is
restarted with the role's backoff, a reload that changes what it reads rolls it:
the new child listens beside the old one, SO_REUSEPORT, until that one has
drained). The master never imports the HTTP package: the child imports the server
factory by its dotted path (``SERVER_FACTORY``), after the fork, so the master
process never loads Starlette or uvicorn and never serves or waits on HTTP.
"""

from __future__ import annotations

import importlib
import os
import threading
from typing import Any

import psutil

from .. import apps, exit_codes, servers
from ..config import Config, HttpConfig, RoleConfig
from .beats import Activity, Beat, Ready
from .bootstrap import Bootstrap, ChildSpec

HTTP_ROLE = "http"
SERVER_FACTORY = "supervisor.http.server:build"
SHUTDOWN_TIMEOUT = 5.0  # seconds for open requests to finish before the child is killed
HTTP_FIELDS = ("host", "port", "token", "read_only", "tokens")  # of HttpConfig; a change rolls the child


class HttpKind:
    """The HTTP server. Its dashboard LISTENs for itself: no relayed NOTIFY pipe."""

    name = "http"
    relayed_wakeups = False

    def roles(self, cfg: Config) -> dict[str, RoleConfig]:
        if cfg.http is None:
            return {}
        return {HTTP_ROLE: RoleConfig(name=HTTP_ROLE, queues=(), actors=(), processes=1, threads=1,
                                      shutdown_timeout=SHUTDOWN_TIMEOUT)}

    def changed(self, old: Config, new: Config) -> list[str]:
        """It reads the http section, lists the schedules, and shows the pages of the apps in use."""
        out = [f for f in HTTP_FIELDS if getattr(old.http, f, None) != getattr(new.http, f, None)]
        if old.schedules != new.schedules:
            out.append("schedules")
        if {a.name for a in apps.used_by(old)} != {a.name for a in apps.used_by(new)}:
            out.append("apps")
        return out

    def bootstrap(self, spec: ChildSpec, close_fds: list[int], cfg: Config) -> Bootstrap:
        assert cfg.http is not None, "an http child without an http section"
        return HttpBootstrap(spec, close_fds, http=cfg.http, config=cfg)


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
                self.beacon.send(Ready(owner=self.owner_for(os.getpid())))
            self.beacon.send(Beat(state=Activity.RUNNING, rss=proc.memory_info().rss,
                                  cpu=round(proc.cpu_percent(None), 1), in_flight=0, done=0, paused=None,
                                  **Beat.server_of(servers.server_seen(self.spec.database.url))))
