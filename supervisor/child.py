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
from collections.abc import Iterable
from dataclasses import dataclass

from .config import Limits
from .guard import Guard
from .process import WorkerProcess, WorkerSettings, configure_logging, run
from .proctitle import child_title, set_title

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
EXIT_CRASH = 70  # EX_SOFTWARE: an unexpected exception escaped the worker


@dataclass(frozen=True)
class ChildSpec:
    role: str
    slot: int
    settings: WorkerSettings
    limits: Limits
    url: str
    owner: str
    master_pid: int
    beat_interval: float
    log_level: str = "INFO"
    log_json: bool = False


class Beacon:
    """The child's end of the beat pipe. Writes never block: a full pipe (the
    master is busy) drops a beat; a broken pipe means the master is gone."""

    def __init__(self, fd: int, on_master_gone) -> None:
        self.fd = fd
        self.on_master_gone = on_master_gone
        os.set_blocking(fd, False)

    def send(self, event: str, **fields) -> None:
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


def main(spec: ChildSpec, beat_fd: int, close_fds: Iterable[int]) -> None:
    """Run the child and exit; never returns into the master's code."""
    code = EXIT_CRASH
    try:
        code = _run(spec, beat_fd, close_fds)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        with contextlib.suppress(Exception):
            traceback.print_exc(file=sys.stderr)
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os._exit(code)


def _run(spec: ChildSpec, beat_fd: int, close_fds: Iterable[int]) -> int:
    _reset_signals()
    for fd in close_fds:
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

    stopping_proc: list[WorkerProcess] = []

    def master_gone(why: str) -> None:
        if stopping_proc and not stopping_proc[0].stopping.is_set():
            log.warning("master is gone (%s); draining", why)
            stopping_proc[0].stopping.set()

    beacon = Beacon(beat_fd, master_gone)
    guard = Guard(spec.limits, lambda why: beacon.send("recycle", why=why))

    def on_ready(proc: WorkerProcess) -> None:
        stopping_proc.append(proc)
        beacon.send("ready", owner=proc.broker.owner)

    def watch(proc: WorkerProcess) -> None:
        if os.getppid() != spec.master_pid:
            master_gone("parent changed")
            return
        r = guard.check(proc.broker, proc.broker.jobs_done)
        if guard.paused_for and proc.state == "running":
            proc.state = "paused"
        elif not guard.paused_for and proc.state == "paused":
            proc.state = "running"
        beacon.send(
            "beat", state=proc.state, rss=r.rss, cpu=round(r.process_cpu, 1), in_flight=proc.in_flight(),
            done=proc.broker.jobs_done, paused=guard.paused_for,
        )

    def on_stop(proc: WorkerProcess) -> None:
        beacon.send("draining")

    return run(spec.settings, spec.url, owner=spec.owner, on_ready=on_ready, watch=watch,
               watch_interval=spec.beat_interval, on_stop=on_stop)
