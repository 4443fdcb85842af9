"""The master's book of children: one Child per forked process, one RoleState
per role, and `plan`, the pure decision of what to start and what to drain.

Keeping the decision pure (state in, actions out) keeps the arbiter's loop a
plain executor and lets the rolling rules be read in one place:

- a role whose count alone changed is resized in place;
- a role whose settings changed (a new generation) is rolled with one extra
  process at most: start a new one, wait until it is ready, drain an old one;
- a process asking to be recycled is rolled the same way, one per role at a time;
- a child that dies after it was ready is replaced at once; after a failed start
  (death before ready, or within QUICK_DEATH of it) the role waits out its backoff
  and then probes with one process until one becomes ready, so a crash-looping
  role costs one fork per backoff.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import sys
from dataclasses import dataclass, field
from typing import Any

from .. import exit_codes
from ..config import HttpConfig, RoleConfig
from ..worker.settings import WorkerSettings
from .bootstrap import Bootstrap

log = logging.getLogger(__name__)

CRASH_LOOP_STREAK = 3  # consecutive failed starts before a role shows as crash-looping
STABLE_AFTER = 5.0  # a child ready for this long has proved its role can start
QUICK_DEATH = 1.0  # a child dying this soon after ready is a failed start (backoff), not a crash to replace now

@dataclass
class Child:
    pid: int
    role: str
    slot: int
    generation: int
    owner: str
    fd: int
    forked_at: float
    # The write end of its wake-up pipe (see master/wakeups.py); -1 when there is none.
    wake_fd: int = -1
    ready_at: float | None = None
    last_beat: float = 0.0
    state: str = "starting"
    rss: int = 0
    cpu: float = 0.0
    in_flight: int = 0
    done: int = 0
    paused: str | None = None
    buffer: bytes = b""
    # Why the master asked it to stop (None: it was not asked).
    stop_reason: str | None = None
    term_at: float | None = None
    kill_at: float | None = None
    killed: bool = False
    # The child asked to be recycled (max_rss/max_jobs); recycle_at is when the master may start.
    recycle_why: str | None = None
    recycle_at: float | None = None
    recycling: bool = False

    @property
    def ready(self) -> bool:
        return self.ready_at is not None

    @property
    def stopping(self) -> bool:
        return self.term_at is not None

    def feed(self, data: bytes, now: float) -> list[dict[str, Any]]:
        """Beat-pipe bytes in, complete events out; updates what the beats say."""
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        events = []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            self.last_beat = now
            kind = event.get("e")
            if kind == "ready":
                self.ready_at = now
                if self.state == "starting":
                    self.state = "running"
            elif kind == "beat":
                if not self.stopping:
                    self.state = event.get("state", self.state)
                self.rss = int(event.get("rss") or 0)
                self.cpu = float(event.get("cpu") or 0.0)
                self.in_flight = int(event.get("in_flight") or 0)
                self.done = int(event.get("done") or 0)
                self.paused = event.get("paused")
            elif kind == "draining":
                self.state = "draining"
            events.append(event)
        return events

    def snapshot(self, now: float, current_generation: int) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "slot": self.slot,
            "state": self.state,
            "uptime": round(now - self.forked_at, 1),
            "ready": self.ready,
            "rss": self.rss,
            "cpu": self.cpu,
            "in_flight": self.in_flight,
            "done": self.done,
            "paused": self.paused,
            "owner": self.owner,
            "current": self.generation == current_generation and not self.recycling,
            "stop_reason": self.stop_reason,
            "recycle": self.recycle_why,
        }


@dataclass
class RoleState:
    config: RoleConfig
    settings: WorkerSettings
    generation: int = 1
    override: int | None = None  # `supervisor scale`, until the next reload
    removed: bool = False
    children: dict[int, Child] = field(default_factory=dict)
    streak: int = 0  # consecutive failed starts
    next_start: float = 0.0
    restarts: int = 0
    last_exit: str | None = None
    last_exit_at: float | None = None
    # Set for the HTTP child's pseudo-role (see http_child): forked with its own bootstrap.
    http: HttpConfig | None = None

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def wanted(self) -> int:
        if self.removed:
            return 0
        return self.config.processes if self.override is None else self.override

    @property
    def crash_looping(self) -> bool:
        return self.streak >= CRASH_LOOP_STREAK and not self.ready_current()

    def live(self) -> list[Child]:
        return [c for c in self.children.values() if not c.stopping]

    def is_current(self, c: Child) -> bool:
        return c.generation == self.generation and not c.recycling

    def ready_current(self) -> list[Child]:
        return [c for c in self.live() if self.is_current(c) and c.ready]

    def converged(self) -> bool:
        """The wanted processes, all current and ready, and nothing else alive."""
        kids = list(self.children.values())
        return (
            all(self.is_current(c) and not c.stopping for c in kids)
            and len(kids) == self.wanted
            and all(c.ready for c in kids)
        )

    def free_slot(self) -> int:
        used = {c.slot for c in self.children.values()}
        slot = 1
        while slot in used:
            slot += 1
        return slot

    def state(self, now: float) -> str:
        if self.removed:
            return "removing"
        if self.crash_looping:
            return "crash-looping"
        live = self.live()
        if any(not self.is_current(c) for c in live):
            return "rolling"
        ready = len(self.ready_current())
        if ready < self.wanted:
            return "starting" if self.streak == 0 else "restarting"
        if len(live) > self.wanted or any(c.stopping for c in self.children.values()):
            return "draining"
        return "running"

    def record_exit(self, child: Child, reason: str, expected: bool, now: float, backoff: float,
                    backoff_max: float) -> None:
        """Crash bookkeeping for a child that has exited.

        A child that was ready (and lived past QUICK_DEATH after that) proved its
        role can start: it is replaced at once, however young, so a kill storm or
        an OOM kill never waits out a backoff. Backoff is for children that die
        before they are ready or right after (a role that cannot start or run)."""
        self.last_exit = reason
        self.last_exit_at = now
        if expected:
            return
        self.restarts += 1
        if child.ready_at is not None and now - child.ready_at >= QUICK_DEATH:
            self.streak = 0
            return
        self.streak += 1
        delay = min(backoff_max, backoff * (2 ** (self.streak - 1)))
        self.next_start = max(self.next_start, now + delay)
        if self.crash_looping:
            log.error("role %s is crash-looping (%d failed starts; last: %s); next try in %.1fs",
                      self.name, self.streak, reason, delay)

    def settle_streak(self, now: float) -> None:
        """Forget past crashes once a current child has stayed ready long enough."""
        if self.streak and any(now - (c.ready_at or now) >= STABLE_AFTER for c in self.ready_current()):
            self.streak = 0


def plan(role: RoleState, now: float) -> tuple[int, list[tuple[Child, str]]]:
    """How many children to start now, and which to drain (with the reason)."""
    wanted = role.wanted
    live = role.live()
    current = [c for c in live if role.is_current(c)]
    old = [c for c in live if not role.is_current(c)]
    drains: list[tuple[Child, str]] = []

    if len(current) > wanted:  # scale down: the not-yet-ready first, then the newest
        extra = sorted(current, key=lambda c: (c.ready, -c.forked_at))[: len(current) - wanted]
        drains += [(c, "scaled down" if not role.removed else "role removed") for c in extra]
        current = [c for c in current if c not in extra]

    ready_current = [c for c in current if c.ready]
    surplus = len(ready_current) + len(old) - wanted
    if surplus > 0:  # an old process leaves only when a new one is ready to take its place
        leaving = sorted(old, key=lambda c: (c.ready, c.forked_at))[:surplus]
        for c in leaving:
            why = "role removed" if role.removed else (f"recycled ({c.recycle_why})" if c.recycling else "rolled")
            drains.append((c, why))
        old = [c for c in old if c not in leaving]

    missing = wanted - len(current)
    if missing <= 0 or now < role.next_start:
        return 0, drains
    starting = any(not c.ready for c in current)
    # Rolling: never more than one process over the count, so the role is rolled
    # one by one (and resized at the same time, if its count changed too).
    start = min(missing, max(wanted + 1 - len(current) - len(old), 0)) if old else missing
    if role.streak > 0 and not ready_current:
        start = min(start, 0 if starting else 1)  # probe with one until the role starts again
    return start, drains


def silent_limits(lease: float, heartbeat: float, beat: float, kill_grace: float) -> tuple[float, float]:
    """How long a ready child may go without a beat before SIGTERM, and the grace
    before SIGKILL. A lease renewed every ``heartbeat`` can expire ``lease -
    heartbeat`` after the child's last sign of life: both together stay within
    that, so the master's release (at once, on reaping) comes before any lease of
    the child could expire and be reclaimed elsewhere while it may wake up. Never
    under three beats: one late beat is no hang."""
    deadline = lease - heartbeat
    silent = max(3 * beat, deadline / 2)
    return silent, max(0.1, min(kill_grace, (deadline - silent) * 0.75))


def describe_exit(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"killed by {name}"
    code = os.waitstatus_to_exitcode(status)
    if code == 0:
        return "exited 0"
    if code == exit_codes.BAD_ACTORS:
        return f"exit {code}: actor modules cannot be imported (see the log)"
    return f"exit {code}"


def spawn(role: RoleState, bootstrap: Bootstrap, now: float, *, wakeups: bool = False) -> Child:
    """Fork one child of ``role``; the child runs ``bootstrap`` (built before the fork).
    Two pipes: beats from the child, and (with ``wakeups``) NOTIFYs relayed to it."""
    read_fd, write_fd = os.pipe()
    wake_r, wake_w = os.pipe() if wakeups else (-1, -1)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # or the child would repeat whatever the master had buffered
    # The child inherits the master's objects frozen: its collector never scans them,
    # so it never writes to (and copies) the pages they sit on. The master scans its
    # own again at once (no garbage of its own is kept for good).
    gc.freeze()
    try:
        pid = os.fork()
        if pid == 0:  # the child: never returns (os._exit), so never unfreezes
            os.close(read_fd)
            if wake_w >= 0:
                os.close(wake_w)
            bootstrap.main(write_fd, wake_r)
    finally:
        gc.unfreeze()
    os.close(write_fd)
    if wake_r >= 0:
        os.close(wake_r)
    os.set_blocking(read_fd, False)
    return Child(
        pid=pid,
        role=role.name,
        slot=bootstrap.spec.slot,
        generation=role.generation,
        owner=bootstrap.owner_for(pid),
        fd=read_fd,
        wake_fd=wake_w,
        forked_at=now,
        last_beat=now,
    )
