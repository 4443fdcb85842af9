"""sd_notify(3) without libsystemd: one datagram per message to $NOTIFY_SOCKET.

Only the master calls this; children drop NOTIFY_SOCKET from their environment.
Without NOTIFY_SOCKET (not under systemd) every call is a cheap no-op.
"""

from __future__ import annotations

import logging
import os
import socket
import time

log = logging.getLogger(__name__)


class Notifier:
    def __init__(self, address: str | None = None, *, watchdog_usec: str | None = None,
                 watchdog_pid: str | None = None) -> None:
        env = os.environ
        self.address = address if address is not None else env.get("NOTIFY_SOCKET")
        self.watchdog_interval = _watchdog_interval(
            watchdog_usec if watchdog_usec is not None else env.get("WATCHDOG_USEC"),
            watchdog_pid if watchdog_pid is not None else env.get("WATCHDOG_PID"),
        )
        self._sock: socket.socket | None = None
        self._last_watchdog = 0.0
        self._last_status: str | None = None
        self._pending: list[bytes] = []

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def _target(self) -> str | bytes:
        addr = self.address or ""
        if addr.startswith("@"):
            return b"\0" + addr[1:].encode()  # the abstract namespace
        return addr

    def send(self, *fields: str, important: bool = False) -> bool:
        """Send ``KEY=VALUE`` lines as one datagram. Never blocks and never raises:
        the master's loop must not wait on systemd. If systemd's queue is full, an
        important message (a state change) is kept and resent, in order, by
        ``flush()``; a STATUS or WATCHDOG message is dropped (the next one follows)."""
        if not self.address:
            return False
        payload = "\n".join(fields).encode()
        if self._pending:
            if important:
                self._pending.append(payload)
            self.flush()
            return False
        return self._send(payload, important)

    def _send(self, payload: bytes, important: bool) -> bool:
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)
            self._sock.sendto(payload, self._target())
            return True
        except BlockingIOError:
            if important:
                self._pending.append(payload)
            return False
        except OSError as exc:
            log.warning("sd_notify to %s failed: %s", self.address, exc)
            return False

    def flush(self) -> None:
        """Resend held state changes; call every tick."""
        while self._pending:
            payload = self._pending.pop(0)
            if not self._send(payload, important=False):
                self._pending.insert(0, payload)
                return

    def drain(self, timeout: float) -> bool:
        """At exit: give held state changes (STOPPING=1) a last chance."""
        deadline = time.monotonic() + timeout
        self.flush()
        while self._pending and time.monotonic() < deadline:
            time.sleep(0.02)
            self.flush()
        return not self._pending

    def ready(self, status: str | None = None) -> bool:
        return self.send("READY=1", *([f"STATUS={status}"] if status else []), important=True)

    def reloading(self) -> bool:
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.send("RELOADING=1", f"MONOTONIC_USEC={usec}", important=True)

    def stopping(self) -> bool:
        return self.send("STOPPING=1", important=True)

    def status(self, line: str) -> bool:
        if line == self._last_status:
            return False
        self._last_status = line
        return self.send(f"STATUS={line}")

    def watchdog(self, now: float | None = None) -> bool:
        """WATCHDOG=1 at half the interval systemd asked for; call every tick."""
        if not self.watchdog_interval:
            return False
        now = time.monotonic() if now is None else now
        if now - self._last_watchdog < self.watchdog_interval / 2:
            return False
        self._last_watchdog = now
        return self.send("WATCHDOG=1")

    def fds(self) -> list[int]:
        """Descriptors a forked child must close (it must not talk to systemd)."""
        return [self._sock.fileno()] if self._sock is not None else []

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _watchdog_interval(usec: str | None, pid: str | None) -> float | None:
    if not usec:
        return None
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None  # the watchdog is meant for another process
    try:
        value = int(usec)
    except ValueError:
        log.warning("ignoring bad WATCHDOG_USEC=%r", usec)
        return None
    return value / 1_000_000 if value > 0 else None
