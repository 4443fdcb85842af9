"""The master's only database user: a background thread with its own broker.

The master's loop must never wait on PostgreSQL (a slow or dead database must
not stop it reaping, replacing children or answering systemd), so everything it
wants written goes through this queue: release a dead child's leases, mark its
`workers` row, keep the master's own row fresh.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from .broker import PostgresBroker
from .queries import workers as workers_sql

log = logging.getLogger(__name__)


@dataclass
class Task:
    what: str
    run: Callable[[PostgresBroker], None]
    give_up_at: float  # monotonic; past it the lease expiry recovers the jobs anyway


class Janitor(threading.Thread):
    def __init__(self, url: str, owner: str, *, on_done: Callable[[], None] = lambda: None) -> None:
        super().__init__(name="janitor", daemon=True)
        self.url = url
        self.owner = owner
        self.on_done = on_done
        self.tasks: queue.Queue[Task | None] = queue.Queue()
        self.released: list[tuple[float, str, int]] = []  # (monotonic, owner, jobs), for status
        self._broker: PostgresBroker | None = None
        self._proc = psutil.Process()
        self.idle = threading.Event()
        self.idle.set()

    def submit(self, what: str, fn: Callable[[PostgresBroker], None], *, retry_for: float = 60.0) -> None:
        self.idle.clear()
        self.tasks.put(Task(what, fn, time.monotonic() + retry_for))

    # --- what the master asks for -------------------------------------------------

    def release(self, owner: str, why: str, *, lease_seconds: float) -> None:
        def fn(broker: PostgresBroker) -> None:
            rows = broker.release_owner(owner, why=why)
            if rows:
                log.warning("released %d job(s) of %s (%s)", len(rows), owner, why)
            self.released.append((time.monotonic(), owner, len(rows)))
            del self.released[:-50]

        self.submit(f"release {owner}", fn, retry_for=lease_seconds)

    def mark_stopped(self, owner: str, state: str) -> None:
        def fn(broker: PostgresBroker) -> None:
            with broker.pool.connection(timeout=10) as c:
                c.execute(workers_sql.STOPPED, {"id": owner, "state": state})

        self.submit(f"mark {owner} {state}", fn)

    def register_master(self, queues: list[str]) -> None:
        def fn(broker: PostgresBroker) -> None:
            with broker.pool.connection(timeout=10) as c:
                c.execute(workers_sql.REGISTER, {"id": self.owner, "host": socket.gethostname(), "pid": os.getpid(),
                                                 "role": "master", "queues": queues})

        self.submit("register master", fn)

    def beat_master(self, state: str) -> None:
        rss = self._proc.memory_info().rss
        cpu = self._proc.cpu_percent(None)

        def fn(broker: PostgresBroker) -> None:
            with broker.pool.connection(timeout=10) as c:
                c.execute(workers_sql.BEAT, {"id": self.owner, "state": state, "rss": rss, "cpu": cpu,
                                             "in_flight": 0, "done": 0})

        self.submit("beat master", fn, retry_for=0)

    def stop(self, timeout: float) -> bool:
        """Finish queued work (up to ``timeout``), then close. True if all was done."""
        self.tasks.put(None)
        self.join(timeout)
        return not self.is_alive()

    # --- the thread -------------------------------------------------------------------

    def _get_broker(self) -> PostgresBroker:
        if self._broker is None:
            self._broker = PostgresBroker(self.url, pool_size=2, owner=self.owner)
        return self._broker

    def run(self) -> None:
        try:
            while True:
                if self.tasks.empty():
                    self.idle.set()
                task = self.tasks.get()
                if task is None:
                    break
                self._do(task)
                self.on_done()
        finally:
            if self._broker is not None:
                self._broker.close()

    def _do(self, task: Task) -> None:
        delay = 0.2
        while True:
            try:
                task.run(self._get_broker())
                return
            except Exception as exc:
                if time.monotonic() + delay > task.give_up_at:
                    log.warning("janitor gave up on %s: %s", task.what, exc)
                    return
                log.warning("janitor: %s failed (%s); retrying in %.1fs", task.what, exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
