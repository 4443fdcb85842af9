"""The control socket: a unix stream socket (mode 0600) carrying JSON lines.

A client sends one request line, ``{"cmd": "status"}``, and reads one reply line,
``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``. The master serves it
from its own event loop (non-blocking), so a reply can wait: `reload` and
`scale` answer once the new state is reached.

Commands: ping, status, reload, diff (what reload would do), scale (role, processes), stop.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import time
from pathlib import Path
from typing import Any

MAX_REQUEST = 64 * 1024


class ControlError(RuntimeError):
    """The master cannot be reached (or answered nonsense)."""


class AlreadyRunning(RuntimeError):
    pass


# --- client -------------------------------------------------------------------


def request(path: str | Path, message: dict[str, Any], *, timeout: float = 10.0) -> dict[str, Any]:
    path = str(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise ControlError(
                f"no supervisor is running with control socket {path} ({exc.strerror}). "
                "Start it with `supervisor run -c FILE`, or pass the -c FILE it was started with."
            ) from exc
        except PermissionError as exc:
            raise ControlError(f"permission denied on {path}: run as the user the supervisor runs as") from exc
        sock.sendall(json.dumps(message).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            try:
                chunk = sock.recv(65536)
            except TimeoutError as exc:
                raise ControlError(f"the supervisor did not answer within {timeout:g}s") from exc
            if not chunk:
                break
            data += chunk
    finally:
        sock.close()
    if not data.strip():
        raise ControlError("the supervisor closed the connection without an answer")
    try:
        answer: dict[str, Any] = json.loads(data)
        return answer
    except json.JSONDecodeError as exc:
        raise ControlError(f"bad answer from the supervisor: {data[:200]!r}") from exc


# --- server ----------------------------------------------------------------------


class Connection:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock.setblocking(False)
        self.buffer = b""
        self.closed = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def read(self) -> dict[str, Any] | None:
        """The request once a full line has arrived, else None. Malformed input
        is answered with an error and the connection closed."""
        try:
            chunk = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            chunk = b""
        if not chunk:
            self.close()
            return None
        self.buffer += chunk
        if b"\n" not in self.buffer:
            if len(self.buffer) > MAX_REQUEST:
                self.reply({"ok": False, "error": "request too long"})
            return None
        line = self.buffer.split(b"\n", 1)[0]
        try:
            req = json.loads(line)
        except json.JSONDecodeError:
            self.reply({"ok": False, "error": "requests are one JSON object per line"})
            return None
        if not isinstance(req, dict) or not isinstance(req.get("cmd"), str):
            self.reply({"ok": False, "error": 'requests look like {"cmd": "status"}'})
            return None
        return req

    def reply(self, message: dict[str, Any]) -> None:
        if self.closed:
            return
        data = json.dumps(message, default=str).encode() + b"\n"
        try:
            # Replies are small; a client that stopped reading gets a second, not the master's loop.
            self.sock.settimeout(1.0)
            self.sock.sendall(data)
        except OSError:
            pass
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(OSError):
                self.sock.close()


class ControlServer:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.sock: socket.socket | None = None
        self._inode: int | None = None

    def fileno(self) -> int:
        assert self.sock is not None
        return self.sock.fileno()

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._clear_stale()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # the socket is born 0600: no window where others can connect
        try:
            sock.bind(str(self.path))
        except OSError:
            sock.close()
            raise
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)
        sock.listen(16)
        sock.setblocking(False)
        self.sock = sock
        self._inode = os.stat(self.path).st_ino

    def _clear_stale(self) -> None:
        try:
            mode = os.stat(self.path).st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(mode):
            raise AlreadyRunning(f"{self.path} exists and is not a socket; remove it or choose another control_socket")
        try:
            reply = request(self.path, {"cmd": "ping"}, timeout=3.0)
        except ControlError:
            self.path.unlink(missing_ok=True)  # left behind by a master that died
            return
        raise AlreadyRunning(
            f"a supervisor (pid {reply.get('pid')}) is already running with control socket {self.path}"
        )

    def accept(self) -> Connection | None:
        assert self.sock is not None
        try:
            conn, _ = self.sock.accept()
        except (BlockingIOError, InterruptedError):
            return None
        return Connection(conn)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        # Only remove the file if it is still ours (a new master may have replaced it).
        with contextlib.suppress(FileNotFoundError):
            if os.stat(self.path).st_ino == self._inode:
                self.path.unlink()


def wait_gone(pid: int, timeout: float) -> bool:
    """Wait for a process (the master after `stop`) to exit."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid):
            return True
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        time.sleep(0.05)
    return False
