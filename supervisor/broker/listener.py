"""One LISTEN connection per process that wakes the consumers of a queue."""

from __future__ import annotations

import logging
import threading

import psycopg

from .. import backoff
from ..db import redact

log = logging.getLogger(__name__)

CHANNEL = "actor_supervisor_jobs"


class Listener(threading.Thread):
    """Turns NOTIFY payloads (queue names) into ``threading.Event`` wake-ups.

    If the connection drops, every consumer is woken (so they poll once) and
    the listener reconnects with backoff; consumers keep polling meanwhile.
    """

    def __init__(self, url: str) -> None:
        super().__init__(name="pg-listener", daemon=True)
        self.url = url
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
        waits = backoff.delays(first=0.2, cap=10.0)
        while not self._halt.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=10) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.connected.set()
                    waits = backoff.delays(first=0.2, cap=10.0)
                    self._wake_all()  # anything inserted while we were away
                    while not self._halt.is_set():
                        for note in conn.notifies(timeout=1.0):
                            event = self._events.get(note.payload)
                            if event is not None:
                                event.set()
            except psycopg.Error as exc:
                self.connected.clear()
                if self._halt.is_set():
                    break
                delay = next(waits)
                log.warning("listener lost %s (%s); reconnecting in %.1fs", redact(self.url), exc, delay)
                self._wake_all()
                self._halt.wait(delay)
        self.connected.clear()
