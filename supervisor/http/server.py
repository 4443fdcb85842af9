"""Serving the app with uvicorn, in the master's HTTP child or standalone.

The master's HTTP child binds its socket with SO_REUSEPORT, so when a reload rolls
it the new process listens next to the old one until the old one has drained: no
refused connection during a roll. `supervisor http` does not: a second server on
a taken port fails instead of silently sharing it.
"""

from __future__ import annotations

import socket
from typing import Any

import uvicorn
from starlette.applications import Starlette

from ..config import Config, HttpConfig
from .app import create_app


def bind(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port and hasattr(socket, "SO_REUSEPORT"):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(False)
    return sock


class Server:
    """One uvicorn server on one pre-bound socket. ``run`` blocks (on the main
    thread uvicorn turns SIGTERM/SIGINT into a graceful stop); ``stop`` may be
    called from another thread."""

    def __init__(self, app: Starlette, host: str, port: int, *, reuse_port: bool = False) -> None:
        self.sock = bind(host, port, reuse_port=reuse_port)
        self.uvicorn = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="on"))

    @property
    def started(self) -> bool:
        return bool(self.uvicorn.started)

    def stop(self) -> None:
        self.uvicorn.should_exit = True

    def run(self) -> None:
        try:
            self.uvicorn.run(sockets=[self.sock])
        finally:
            self.sock.close()


def build(*, url: str, http: HttpConfig, config: Config | None = None, reuse_port: bool = False,
          **extra: Any) -> Server:
    """The server the master's HTTP child runs (found by dotted path, see
    supervisor.master.http_child; with ``reuse_port``) and `supervisor http` runs."""
    return Server(create_app(url=url, http=http, config=config, **extra), http.host, http.port,
                  reuse_port=reuse_port)
