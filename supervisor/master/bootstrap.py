"""What a forked child does between ``os.fork()`` and ``os._exit()``.

The child never parses YAML: it gets the role's WorkerSettings, limits and the
already-resolved database URL from the master's memory. It talks to the master
over one pipe of JSON lines (ready, beats, recycle requests, draining), and it
exits when the master goes away (PR_SET_PDEATHSIG, plus a getppid() check for
the race where the master died before prctl ran, and a broken pipe).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import exit_codes
from ..config import Limits
from ..db import Database
from ..identity import new_token, owner_id
from ..logs import configure_logging
from ..worker.guard import Guard
from ..worker.process import Hooks, WorkerProcess, run
from ..worker.settings import WorkerSettings
from .proctitle import child_title, set_title

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ChildSpec:
    role: str
    slot: int
    settings: WorkerSettings
    limits: Limits
    database: Database
    # With the child's pid, the lease owner id (host:pid:token): the master computes it
    # right after fork, so it can release this child's leases if it dies.
    token: str
    master_pid: int
    beat_interval: float
    log_level: str = "INFO"
    log_json: bool = False


class Beacon:
    """The child's end of the beat pipe. Writes never block: a full pipe (the
    master is busy) drops a beat; a broken pipe means the master is gone."""

    def __init__(self, fd: int, on_master_gone: Callable[[str], None]) -> None:
        self.fd = fd
        self.on_master_gone = on_master_gone
        os.set_blocking(fd, False)

    def send(self, event: str, **fields: Any) -> None:
        line = json.dumps({"e": event, **fields}, separators=(",", ":")).encode() + b"\n"
        try:
            os.write(self.fd, line)  # under PIPE_BUF, so the master never sees half a line
        except BlockingIOError:
            pass
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                self.on_master_gone("beat pipe closed")
            else:
                raise


def _set_parent_death_signal(sig: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
    except (OSError, AttributeError) as exc:  # not Linux: the getppid() check still works
        log.debug("prctl unavailable: %s", exc)


def _reset_signals() -> None:
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    # A terminal hangup or a stray SIGHUP is the master's business (it means reload).
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


class Bootstrap:
    """What every forked child does first (signals, fds, parent death, title, logging,
    the beat pipe) and how it exits; ``serve`` is what the child is for. Built by
    the master before the fork, so nothing the master holds is captured after it;
    the child only calls ``main``."""

    def __init__(self, spec: ChildSpec, close_fds: list[int]) -> None:
        self.spec = spec
        self.close_fds = close_fds
        self.tick_interval = spec.beat_interval
        self.beacon: Beacon | None = None
        self.wake_fd = -1

    new_token = staticmethod(new_token)

    def owner_for(self, pid: int) -> str:
        return owner_id(pid, self.spec.token)

    def main(self, beat_fd: int, wake_fd: int = -1) -> None:
        """Run the child and exit; never returns into the master's code. ``wake_fd``:
        the read end of the relayed NOTIFY pipe (-1: none)."""
        self.wake_fd = wake_fd
        code = exit_codes.CRASH
        try:
            code = self._run(beat_fd)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            with contextlib.suppress(Exception):
                traceback.print_exc(file=sys.stderr)
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os._exit(code)

    def _run(self, beat_fd: int) -> int:
        spec = self.spec
        _reset_signals()
        for fd in self.close_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        _set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != spec.master_pid:
            return 0  # the master died before prctl took effect
        # sd_notify is the master's job; actor code must not be able to confuse systemd.
        for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
            os.environ.pop(name, None)
        set_title(child_title(spec.role, spec.slot))
        configure_logging(spec.log_level, spec.log_json)
        self.beacon = Beacon(beat_fd, self.master_gone)
        return self.serve()

    def serve(self) -> int:
        """The child's work, until told to stop; returns the exit code."""
        raise NotImplementedError

    def master_gone(self, why: str) -> None:
        """The master went away: stop (the child must not outlive it)."""
        raise NotImplementedError


class ChildBootstrap(Bootstrap, Hooks):
    """A worker child: runs a WorkerProcess with the master's hooks."""

    def __init__(self, spec: ChildSpec, close_fds: list[int]) -> None:
        super().__init__(spec, close_fds)
        self.guard: Guard | None = None
        self.proc: WorkerProcess | None = None

    def serve(self) -> int:
        spec = self.spec
        self.guard = Guard(spec.limits, self.ask_recycle)
        return run(spec.settings, spec.database, owner=self.owner_for(os.getpid()), hooks=self,
                   wakeup_fd=self.wake_fd if self.wake_fd >= 0 else None)

    def master_gone(self, why: str) -> None:
        if self.proc is not None and not self.proc.stopping.is_set():
            log.warning("master is gone (%s); draining", why)
            self.proc.stopping.set()

    def ask_recycle(self, why: str) -> None:
        if self.beacon is not None:
            self.beacon.send("recycle", why=why)

    # --- the worker's hooks ------------------------------------------------------------

    def on_ready(self, proc: WorkerProcess) -> None:
        assert self.beacon is not None and proc.broker is not None
        self.proc = proc
        self.beacon.send("ready", owner=proc.broker.owner)

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
        self.beacon.send(
            "beat", state=proc.state, rss=r.rss, cpu=round(r.process_cpu, 1), in_flight=proc.in_flight(),
            done=broker.jobs_done, paused=self.guard.paused_for,
        )

    def on_stop(self, proc: WorkerProcess) -> None:
        assert self.beacon is not None
        self.beacon.send("draining")
