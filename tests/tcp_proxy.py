"""A TCP proxy in front of PostgreSQL that a test can take down and bring back."""

from __future__ import annotations

import contextlib
import socket
import threading

from psycopg.conninfo import conninfo_to_dict, make_conninfo


class TcpProxy:
    def __init__(self, url: str) -> None:
        params = conninfo_to_dict(url)
        host = params.get("host") or "/var/run/postgresql"
        port = int(params.get("port") or 5432)
        if host.startswith("/"):
            self._target = (socket.AF_UNIX, f"{host}/.s.PGSQL.{port}")
        else:
            self._target = (socket.AF_INET, (host, port))
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self.url = make_conninfo(url, host="127.0.0.1", port=str(self.port))
        self.up = True
        self.refused = 0
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc) -> None:
        self._closed = True
        self.go_down()
        self._server.close()

    def go_down(self) -> None:
        """Drop every open connection and refuse new ones until come_back()."""
        self.up = False
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for a, b in pairs:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def come_back(self) -> None:
        self.up = True

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if not self.up:
                self.refused += 1
                client.close()
                continue
            family, address = self._target
            upstream = socket.socket(family, socket.SOCK_STREAM)
            try:
                upstream.connect(address)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, upstream))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
