"""Lease upkeep, and a row in the `workers` registry, for a broker consumed outside a
supervisor worker process (the dramatiq CLI)."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from ... import defaults
from ...registry import Beat, Registration
from .. import threads
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
        self.registration: Registration | None = None
        self._done: Callable[[], int] = lambda: 0
        self._registered = False

    def register_as(self, registration: Registration, done: Callable[[], int]) -> None:
        """Beat ``registration`` (role "dramatiq") after each renewal, with the jobs this
        process holds and has finished (``done``): `nodes`, the dashboard's Workers page
        and the metrics see a dramatiq CLI process as they see a supervisor worker, and
        the reaper skips its rows while it beats (it renews them first, as a worker's
        upkeep does). Before start()."""
        self.registration, self._done = registration, done

    def stop(self) -> None:
        """Stop beating; the registry row says so (a process killed outright leaves it to
        go stale, as a worker's does)."""
        self._halt.set()
        if self.ident is not None:
            self.join(2.0)  # a beat in flight must not land after the stop below
        if self.registration is not None and self._registered:
            try:
                self.registration.stop()
            except threads.EXPECTED as exc:
                threads.warn(log, "marking this process stopped in the workers registry", exc)

    def run(self) -> None:
        with threads.lifetime(self.name, self._halt.is_set):
            next_reap = time.monotonic() + random.uniform(0, self.reap_seconds)
            self._beat()
            while not self._halt.wait(self.beat_seconds):
                try:
                    self.leases.heartbeat()
                    if time.monotonic() >= next_reap:
                        next_reap = time.monotonic() + self.reap_seconds * random.uniform(0.8, 1.2)
                        self.leases.reap_expired()
                except threads.EXPECTED as exc:
                    threads.warn(log, "lease upkeep", exc)
                    continue  # no beat without the renewal before it
                self._beat()

    def _beat(self) -> None:
        """Register (again until it takes, e.g. after an outage at start), else beat."""
        if self.registration is None or self._halt.is_set():
            return
        try:
            if not self._registered:
                self.registration.register(timeout=10.0)
                self._registered = True
            self.registration.beat(Beat("running", in_flight=self.leases.count(), done=self._done()))
        except threads.EXPECTED as exc:
            threads.warn(log, "beat in the workers registry", exc)
