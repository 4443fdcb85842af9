"""One child's lifecycle as the master sees it: the phases, the table of
transitions, and ``Child``, whose one method per transition is the only way its
phase changes (an event its phase does not allow raises ``IllegalTransition``).

Drawn in ARCHITECTURE.md ("A child's lifecycle"). Who moves a child:

- its own messages on the beat pipe (``receive``): ready, a recycle request;
- the arbiter's loop: a recycle turn and a hang (``_watch_children``), a drain
  chosen by ``plan()``, the shutdown (``begin_stop``), SIGKILL past a deadline,
  and the reaping of its exit (``_reap``).

An event a child's message brings that its phase does not allow is the child's
fault, not the master's: it is dropped with a warning (``receive``). One the
master's own loop brings is a bug, and raises.

Beside the phase, a child carries what it last said of itself (``Beat``): telemetry
for `status`, which moves nothing.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field, replace
from enum import Enum

from .beats import Activity, Beat, BeatReader, Draining, Message, Ready, Recycle

log = logging.getLogger(__name__)

RECYCLE_JITTER = 2.0  # seconds; spreads recycles of processes that hit a limit together


class Phase(Enum):
    STARTING = "starting"  # forked; it has not said ready
    READY = "ready"  # serving; current if its generation is the role's
    RECYCLE_ASKED = "recycle asked"  # asked to be recycled; serving until its turn
    RECYCLING = "recycling"  # its turn: no longer current, so plan() rolls it as an old generation
    STOPPING = "stopping"  # sent SIGTERM: draining until its kill deadline
    KILLED = "killed"  # sent SIGKILL
    EXITED = "exited"  # reaped; out of the book


class Event(Enum):
    READY = "ready"  # its Ready message
    ASK_RECYCLE = "ask recycle"  # its Recycle message
    RECYCLE = "recycle"  # the master gives it the role's one recycle turn
    STOP = "stop"  # SIGTERM: a drain plan() chose, a hang, the shutdown
    KILL = "kill"  # SIGKILL: running past its deadline, or a second interrupt
    EXIT = "exit"  # reaped


P = Phase
# Event -> {phase it may happen in: phase it leads to}. A pair not here is illegal.
TRANSITIONS: dict[Event, dict[Phase, Phase]] = {
    # A child stopped before it said ready (a hang at start) may still say it: noted, no way back.
    Event.READY: {P.STARTING: P.READY, P.STOPPING: P.STOPPING, P.KILLED: P.KILLED},
    # A request that crossed the master's SIGTERM is moot.
    Event.ASK_RECYCLE: {P.READY: P.RECYCLE_ASKED, P.STOPPING: P.STOPPING, P.KILLED: P.KILLED},
    Event.RECYCLE: {P.RECYCLE_ASKED: P.RECYCLING},
    Event.STOP: {P.STARTING: P.STOPPING, P.READY: P.STOPPING, P.RECYCLE_ASKED: P.STOPPING,
                 P.RECYCLING: P.STOPPING},
    Event.KILL: {P.STOPPING: P.KILLED},
    Event.EXIT: {p: P.EXITED for p in P if p is not P.EXITED},
}
LIVE = frozenset({P.STARTING, P.READY, P.RECYCLE_ASKED, P.RECYCLING})  # not told to stop
SERVING = frozenset({P.READY, P.RECYCLE_ASKED, P.RECYCLING})  # said ready, not told to stop


class IllegalTransition(RuntimeError):
    def __init__(self, child: Child, what: str) -> None:
        super().__init__(f"{child.name}: no {what} from {child.phase.value!r}")


@dataclass(frozen=True)
class StopOrder:
    """Why and when the master sent SIGTERM, and when SIGKILL follows."""

    reason: str
    expected: bool  # a drain the master chose (not a hang): its exit is no crash
    term_at: float
    kill_at: float
    was: Phase  # the phase it was stopped from


@dataclass(frozen=True)
class RecycleRequest:
    why: str
    at: float  # the earliest its turn may come (jittered)


@dataclass(eq=False)
class Child:
    """One forked process of a role. Who it is never changes; its phase changes only
    by the transitions below."""

    pid: int
    role: str
    slot: int
    generation: int
    owner: str
    fd: int  # the read end of its beat pipe; -1 once closed
    forked_at: float
    wake_fd: int = -1  # the write end of its wake-up pipe (master/wakeups.py); -1: none
    last_beat: float = field(init=False)  # when it last said anything
    _phase: Phase = field(default=Phase.STARTING, init=False)
    _ready_at: float | None = field(default=None, init=False)
    _stop: StopOrder | None = field(default=None, init=False)
    _recycle: RecycleRequest | None = field(default=None, init=False)
    _beat: Beat | None = field(default=None, init=False)
    _activity: Activity = field(default=Activity.RUNNING, init=False)  # what its last Beat (or Draining) said

    def __post_init__(self) -> None:
        self.last_beat = self.forked_at
        self.name = f"{self.role}[{self.slot}] pid {self.pid}"
        self.reader = BeatReader(self.name)

    # --- what it is -------------------------------------------------------------------------

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def ready_at(self) -> float | None:
        return self._ready_at

    @property
    def stop_order(self) -> StopOrder | None:
        return self._stop

    @property
    def recycle(self) -> RecycleRequest | None:
        return self._recycle

    @property
    def ready(self) -> bool:
        """It said ready (even if it has been told to stop since)."""
        return self._ready_at is not None

    @property
    def stopping(self) -> bool:
        return self._phase in (P.STOPPING, P.KILLED, P.EXITED)

    @property
    def recycling(self) -> bool:
        """It has had its recycle turn: no longer current, whatever its generation."""
        return self._phase is P.RECYCLING or (self._stop is not None and self._stop.was is P.RECYCLING)

    @property
    def state(self) -> str:
        """What `status` shows: the master's view while starting or stopping, else the child's."""
        if self._phase is P.STARTING:
            return "starting"
        if self.stopping:
            return "draining"
        return self._activity.value

    # --- transitions ------------------------------------------------------------------------

    def _go(self, event: Event) -> Phase:
        to = TRANSITIONS[event].get(self._phase)
        if to is None:
            raise IllegalTransition(self, repr(event.value))
        was, self._phase = self._phase, to
        return was

    def said_ready(self, now: float) -> None:
        self._go(Event.READY)
        self._ready_at = now

    def asked_recycle(self, why: str, now: float) -> None:
        if self._go(Event.ASK_RECYCLE) is P.READY:
            self._recycle = RecycleRequest(why, now + random.uniform(0, RECYCLE_JITTER))

    def give_recycle_turn(self) -> None:
        self._go(Event.RECYCLE)

    def terminate(self, reason: str, grace: float, now: float, *, hung: bool = False) -> None:
        """SIGTERM follows; SIGKILL ``grace`` seconds later if it is still there."""
        was = self._go(Event.STOP)
        self._stop = StopOrder(reason, not hung, term_at=now, kill_at=now + grace, was=was)

    def hasten(self, deadline: float) -> None:
        """Kill it by ``deadline`` at the latest (the shutdown's); not a transition."""
        if self._phase is not P.STOPPING or self._stop is None:
            raise IllegalTransition(self, "earlier kill deadline")
        if self._stop.kill_at > deadline:
            self._stop = replace(self._stop, kill_at=deadline)

    def kill(self) -> None:
        self._go(Event.KILL)

    def reaped(self) -> None:
        self._go(Event.EXIT)

    # --- what it says -----------------------------------------------------------------------

    def feed(self, data: bytes, now: float) -> list[Message]:
        """Beat-pipe bytes in; each whole message applied; the ones it applied out."""
        applied = []
        for message in self.reader.feed(data):
            try:
                self.receive(message, now)
            except IllegalTransition as exc:
                log.warning("%s (the message is dropped)", exc)
                continue
            applied.append(message)
        return applied

    def receive(self, message: Message, now: float) -> None:
        self.last_beat = now
        if isinstance(message, Ready):
            self.said_ready(now)
        elif isinstance(message, Recycle):
            self.asked_recycle(message.why, now)
        elif isinstance(message, Beat):
            self._beat = message
            self._activity = message.state
        elif isinstance(message, Draining):
            self._activity = Activity.DRAINING

    def snapshot(self, now: float, current_generation: int) -> dict[str, object]:
        beat = self._beat
        return {
            "pid": self.pid,
            "slot": self.slot,
            "state": self.state,
            "uptime": round(now - self.forked_at, 1),
            "ready": self.ready,
            "rss": beat.rss if beat else 0,
            "cpu": beat.cpu if beat else 0.0,
            "in_flight": beat.in_flight if beat else 0,
            "done": beat.done if beat else 0,
            "paused": beat.paused if beat else None,
            # The database server it reaches (as the master's own "server": address, since, previous).
            "server": ({"address": beat.server, "since": beat.server_since, "previous": beat.server_previous}
                       if beat and beat.server else None),
            "owner": self.owner,
            "current": self.generation == current_generation and not self.recycling,
            "stop_reason": self._stop.reason if self._stop else None,
            "recycle": self._recycle.why if self._recycle else None,
        }
