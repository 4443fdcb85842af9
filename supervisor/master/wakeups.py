"""One LISTEN connection per host: the master's relay of NOTIFY wake-ups.

Without it every worker process would hold a LISTEN connection of its own; a
fleet of 50 hosts with 8 processes each would hold 400 just to be woken. The
relay is a thread (the master's loop never waits on the database) that turns
each notification into a line on every child's wake-up pipe, which the child
reads with ``broker.listener.PipeWakeups``.
"""

from __future__ import annotations

import errno
import logging
import os
import threading

from ..broker.consuming.listener import GAP, Listener, encode

log = logging.getLogger(__name__)


class Relay(Listener):
    """Fans NOTIFYs out to the children's pipes (write ends, non-blocking).

    A full pipe drops the line: that child's consumers still poll, and its reader
    drains the pipe in microseconds, so a full pipe means the child is stuck.
    """

    def __init__(self, url: str) -> None:
        super().__init__(url, name="wakeup-relay")
        self._pipes: dict[int, int] = {}  # child pid -> write fd
        self._pipes_lock = threading.Lock()
        self.dropped = 0

    def add(self, pid: int, fd: int) -> None:
        os.set_blocking(fd, False)
        with self._pipes_lock:
            self._pipes[pid] = fd

    def remove(self, pid: int) -> None:
        """Forget a child and close its pipe; under the lock, so the fd number is
        never written to after the master reuses it."""
        with self._pipes_lock:
            fd = self._pipes.pop(pid, None)
            if fd is not None:
                os.close(fd)

    def close_all(self) -> None:
        with self._pipes_lock:
            for fd in self._pipes.values():
                os.close(fd)
            self._pipes.clear()

    def fds(self) -> list[int]:
        with self._pipes_lock:
            return list(self._pipes.values())

    def deliver(self, channel: str, payload: str) -> None:
        self._send(encode(channel, payload))

    def wake_all(self) -> None:
        self._send(GAP)

    def _send(self, line: bytes) -> None:
        if len(line) > 4096:  # over PIPE_BUF a write may be split: no such payload of ours
            return
        with self._pipes_lock:
            for pid, fd in list(self._pipes.items()):
                try:
                    os.write(fd, line)
                except BlockingIOError:
                    self.dropped += 1
                except OSError as exc:
                    if exc.errno != errno.EPIPE:  # a child that exited: the reaper removes it
                        log.warning("wake-up pipe of pid %d: %s", pid, exc)
