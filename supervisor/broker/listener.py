"""One LISTEN connection per process that wakes the consumers of a queue."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import psycopg

from ..db import redact

log = logging.getLogger(__name__)

CHANNEL = "actor_supervisor_jobs"
# A short fixed pace, not a growing backoff: claims resume within a fraction of a
# second of the database coming back (a refused connection costs next to nothing).
RETRY_SECONDS = 0.25
# Payload: the id of a running job an operator cancelled (see sql.CANCEL).
CANCEL_CHANNEL = "actor_supervisor_cancel"


class Listener(threading.Thread):
    """Turns NOTIFY payloads (queue names) into ``threading.Event`` wake-ups.

    If the connection drops, every consumer is woken (so they poll once) and
    the listener reconnects with backoff; consumers keep polling meanwhile.
    """

    def __init__(self, url: str, *, on_notify: dict[str, Callable[[str], None]] | None = None) -> None:
        super().__init__(name="pg-listener", daemon=True)
        self.url = url
        # Other channels this connection listens to, and what to call with a payload.
        self.on_notify = dict(on_notify or {})
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

    def _wake_all(self) -> None:
        with self._lock:
            for event in self._events.values():
                event.set()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        failures = 0
        while not self._halt.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=10) as conn:
                    for channel in (CHANNEL, *self.on_notify):
                        conn.execute(f"LISTEN {channel}")
                    self.connected.set()
                    if failures:
                        log.warning("listener back on %s after %d failed tries", redact(self.url), failures)
                    failures = 0
                    self._wake_all()  # anything inserted while we were away
                    while not self._halt.is_set():
                        for note in conn.notifies(timeout=1.0):
                            handler = self.on_notify.get(note.channel)
                            if handler is not None:
                                handler(note.payload)
                                continue
                            event = self._events.get(note.payload)
                            if event is not None:
                                event.set()
            except psycopg.Error as exc:
                self.connected.clear()
                if self._halt.is_set():
                    break
                if not failures:
                    log.warning("listener lost %s (%s); reconnecting every %.2fs", redact(self.url), exc, RETRY_SECONDS)
                failures += 1
                # Each try also wakes every consumer, so they claim (or find the
                # database still away) at this pace until NOTIFY works again.
                self._wake_all()
                self._halt.wait(RETRY_SECONDS)
        self.connected.clear()
