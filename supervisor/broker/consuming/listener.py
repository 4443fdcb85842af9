"""Wake-ups: NOTIFY payloads (queue names, cancelled job ids) turned into events.

A process gets them from one of two sources:

- ``Listener``: its own LISTEN connection (a standalone ``supervisor worker``,
  the dramatiq CLI, a producer waiting on results);
- ``PipeWakeups``: lines from its supervisor, whose one LISTEN connection per
  host is relayed to every child over a pipe (``master/wakeups.py``), so a
  fleet of N hosts holds N LISTEN connections, not one per process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import threading
from collections.abc import Callable, Mapping

import psycopg

from ... import servers
from ...db import redact, session_kwargs
from .. import threads
from . import gates

log = logging.getLogger(__name__)

CHANNEL = "actor_supervisor_jobs"
# Payload: the id of a running job an operator cancelled (see sql.CANCEL).
CANCEL_CHANNEL = "actor_supervisor_cancel"
CHANNELS = (CHANNEL, CANCEL_CHANNEL)
# A short fixed pace, not a growing backoff: claims resume within a fraction of a
# second of the database coming back (a refused connection costs next to nothing).
RETRY_SECONDS = 0.25
# A relayed line that means "notifications may have been missed: look at everything".
GAP = b"*\n"


class Wakeups(threading.Thread):
    """The table of wake-up events, fed by a subclass's ``run``.

    ``deliver(channel, payload)``: a handler of that channel gets the payload (cancel),
    else the event watching that payload is set. ``wake_all``: every event is set
    (the source was away, so consumers poll once).
    """

    def __init__(self, name: str, *, on_notify: Mapping[str, Callable[[str], None]] | None = None) -> None:
        super().__init__(name=name, daemon=True)
        self.on_notify = dict(on_notify or {})
        # '~queue seconds' (a limit key of the queue opens then) and '+queue' (the queue has
        # waiting rows: gates.py) go here.
        self.on_gate: Callable[[str, float], None] | None = None
        self.on_waiting: Callable[[str], None] | None = None
        self._events: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self.connected = threading.Event()

    def event_for(self, queue: str) -> threading.Event:
        with self._lock:
            return self._events.setdefault(queue, threading.Event())

    def watch(self, payload: str, event: threading.Event) -> None:
        """Set ``event`` on NOTIFY ``payload`` too (several payloads may share one event)."""
        with self._lock:
            self._events[payload] = event

    def deliver(self, channel: str, payload: str) -> None:
        handler = self.on_notify.get(channel)
        if handler is not None:
            handler(payload)
            return
        event = self._events.get(payload)
        if event is not None:
            event.set()
            return
        queue = gates.waiting_queue(payload)
        if queue is not None:
            if self.on_waiting is not None:
                self.on_waiting(queue)
            event = self._events.get(queue)
            if event is not None:
                event.set()
            return
        gate = gates.parse(payload)
        if gate is not None and self.on_gate is not None:
            self.on_gate(*gate)

    def wake_all(self) -> None:
        with self._lock:
            for event in self._events.values():
                event.set()

    def stop(self) -> None:
        self._halt.set()


class Listener(Wakeups):
    """Its own LISTEN connection. If the connection drops, every consumer is woken
    (so they poll once) and it reconnects at a short fixed pace."""

    def __init__(self, url: str, *, on_notify: Mapping[str, Callable[[str], None]] | None = None,
                 name: str = "pg-listener") -> None:
        super().__init__(name, on_notify=on_notify)
        self.url = url

    def run(self) -> None:
        with threads.lifetime(self.name, self._halt.is_set):
            self._listen()

    def _listen(self) -> None:
        # Any psycopg error ends only this connection, which is made again: the
        # policy's one line (threads.py) for all of them, since a LISTEN connection
        # holds nothing but its place. Anything else ends the process.
        failures = 0
        while not self._halt.is_set():
            try:
                with psycopg.connect(self.url, **session_kwargs(self.url)) as conn:
                    servers.note_server(self.url, conn)
                    for channel in CHANNELS:
                        conn.execute(f"LISTEN {channel}")
                    self.connected.set()
                    if failures:
                        log.warning("listener back on %s after %d failed tries", redact(self.url), failures)
                    failures = 0
                    self.wake_all()  # anything inserted while we were away
                    while not self._halt.is_set():
                        for note in conn.notifies(timeout=1.0):
                            self.deliver(note.channel, note.payload)
            except psycopg.Error as exc:
                if self.connected.is_set() and not self._halt.is_set():
                    servers.lost(exc)  # a LISTEN connection that served ended (not a failed try)
                self.connected.clear()
                if self._halt.is_set():
                    break
                if not failures:
                    log.warning("listener lost %s (%s); reconnecting every %.2fs", redact(self.url), exc, RETRY_SECONDS)
                failures += 1
                # Each try also wakes every consumer, so they claim (or find the
                # database still away) at this pace until NOTIFY works again.
                self.wake_all()
                self._halt.wait(RETRY_SECONDS)
        self.connected.clear()


def encode(channel: str, payload: str) -> bytes:
    """One relayed notification as a line (JSON: payloads are free text)."""
    return json.dumps([channel, payload], separators=(",", ":")).encode() + b"\n"


class PipeWakeups(Wakeups):
    """Notifications relayed by the supervisor over a pipe (see ``encode``, ``GAP``).

    The pipe closing means the master is gone; the child's own checks stop it,
    and meanwhile its consumers poll."""

    def __init__(self, fd: int, *, on_notify: Mapping[str, Callable[[str], None]] | None = None) -> None:
        super().__init__("pipe-wakeups", on_notify=on_notify)
        self.fd = fd

    def run(self) -> None:
        with threads.lifetime(self.name, self._halt.is_set):
            self._relay()

    def _relay(self) -> None:
        self.connected.set()
        buffer = b""
        try:
            while not self._halt.is_set():
                ready, _, _ = select.select([self.fd], [], [], 1.0)
                if not ready:
                    continue
                data = os.read(self.fd, 65536)
                if not data:
                    break
                *lines, buffer = (buffer + data).split(b"\n")
                for line in lines:
                    self._handle(line)
        except OSError as exc:
            log.warning("wake-up pipe failed (%s); polling from now on", exc)
        finally:
            self.connected.clear()
            self.wake_all()
            with contextlib.suppress(OSError):
                os.close(self.fd)

    def _handle(self, line: bytes) -> None:
        if line + b"\n" == GAP:
            self.wake_all()
            return
        try:
            channel, payload = json.loads(line)
        except (ValueError, TypeError):
            log.warning("ignoring a malformed wake-up line: %r", line[:100])
            return
        self.deliver(str(channel), str(payload))
