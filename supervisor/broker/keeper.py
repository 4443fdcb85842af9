"""Lease upkeep for a broker consumed outside a supervisor worker process (the dramatiq CLI)."""

from __future__ import annotations

import logging
import random
import threading
import time

from .. import defaults
from . import threads
from .leases import Leases

log = logging.getLogger(__name__)


class LeaseKeeper(threading.Thread):
    """Renews the leases this process holds, and now and then returns expired
    leases (of any process, e.g. a dramatiq CLI worker that died) to pending.

    ``supervisor worker`` does both in its upkeep thread instead; this is for a
    plain ``dramatiq.Worker`` or the ``dramatiq`` CLI on a broker made by
    ``setup_broker()``. Database errors are logged and retried on the next beat; any
    other error ends the process (see threads.py).
    """

    def __init__(self, leases: Leases) -> None:
        super().__init__(name="lease-keeper", daemon=True)
        self.leases = leases
        self.beat_seconds = min(defaults.HEARTBEAT_SECONDS, leases.lease_seconds / 3)
        self.reap_seconds = max(leases.lease_seconds / 2, 1.0)
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        with threads.lifetime(self.name, self._halt.is_set):
            next_reap = time.monotonic() + random.uniform(0, self.reap_seconds)
            while not self._halt.wait(self.beat_seconds):
                try:
                    self.leases.heartbeat()
                    if time.monotonic() >= next_reap:
                        next_reap = time.monotonic() + self.reap_seconds * random.uniform(0.8, 1.2)
                        self.leases.reap_expired()
                except threads.EXPECTED as exc:
                    threads.warn(log, "lease upkeep", exc)
