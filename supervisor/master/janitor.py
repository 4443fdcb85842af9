"""The master's only database user: a background thread with its own small pool.

The master's loop must never wait on PostgreSQL (a slow or dead database must
not stop it reaping, replacing children or answering systemd), so everything it
wants written goes through this queue: release a dead child's leases, mark its
`workers` row, keep the master's own row fresh, recover orphans at start.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import psutil

from .. import backoff, db
from ..broker import Leases
from ..identity import node_name
from ..registry import Beat, Registration

log = logging.getLogger(__name__)

RELEASE_AGAIN_AFTER = 2.0  # seconds; longer than a claim statement takes


@dataclass
class Task:
    what: str
    run: Callable[[], None]
    give_up_at: float  # monotonic; past it the lease expiry recovers the jobs anyway


class Janitor(threading.Thread):
    def __init__(self, url: str, owner: str, *, queues: list[str], on_done: Callable[[], None]) -> None:
        super().__init__(name="janitor", daemon=True)
        self.owner = owner
        self.on_done = on_done
        self.tasks: queue.Queue[Task | None] = queue.Queue()
        # Opened lazily (min_size=0) and by this thread only: the master's loop never waits on it.
        self.pool = db.make_pool(url, min_size=0, max_size=2, name="janitor")
        self.leases = Leases(self.pool, owner, lease_seconds=0)
        self.registration = Registration(self.pool, owner, role="master", queues=queues)
        self.idle = threading.Event()
        self.idle.set()

    def submit(self, what: str, fn: Callable[[], None], *, retry_for: float = 60.0) -> None:
        self.idle.clear()
        self.tasks.put(Task(what, fn, time.monotonic() + retry_for))

    # --- what the master asks for -------------------------------------------------

    def release(self, owner: str, why: str, *, lease_seconds: float, again: bool = True) -> None:
        def fn() -> None:
            rows = self.leases.release_owner(owner, why=why)
            if rows:
                log.warning("released %d job(s) of %s (%s)", len(rows), owner, why)

        self.submit(f"release {owner}", fn, retry_for=lease_seconds)
        if again:
            # A claim the dead process had sent may still commit on the server after
            # the first release (the server finishes a statement before it notices
            # the client is gone): release once more when any such statement is done.
            timer = threading.Timer(RELEASE_AGAIN_AFTER, self.release, (owner, why),
                                    {"lease_seconds": lease_seconds, "again": False})
            timer.daemon = True
            timer.start()

    def mark_stopped(self, owner: str, state: str) -> None:
        self.submit(f"mark {owner} {state}", lambda: self.registration.stop(state, worker_id=owner))

    def register_master(self) -> None:
        self.submit("register master", self.registration.register)

    def beat_master(self, state: str) -> None:
        params = self.registration.sample(Beat(state))  # sampled now, written when the thread gets to it
        self.submit("beat master", lambda: self.registration.beat(Beat(state), params), retry_for=0)

    def recover_orphans(self) -> None:
        """Release the leases of processes of this host that died with a previous master."""
        for wid, host, pid, role, _q, _state, started_at, _hb, stopped_at, *_ in self.registration.list():
            if host != node_name() or stopped_at is not None or wid == self.owner or _alive_since(pid, started_at):
                continue
            released = self.leases.release_owner(wid, why=f"{role} process {pid} died with its master")
            self.registration.stop("lost", worker_id=wid)
            log.warning("recovered %d job(s) of %s (pid %d gone)", len(released), wid, pid)

    def stop(self, timeout: float) -> bool:
        """Finish queued work (up to ``timeout``), then close. True if all was done."""
        self.tasks.put(None)
        self.join(timeout)
        return not self.is_alive()

    # --- the thread -------------------------------------------------------------------

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
            self.pool.close()

    def _do(self, task: Task) -> None:
        try:
            backoff.retry(task.run, f"janitor: {task.what}", first=0.2, cap=5.0,
                          give_up_after=max(0.0, task.give_up_at - time.monotonic()), logger=log)
        except Exception as exc:
            log.warning("janitor gave up on %s: %s", task.what, exc)


def _alive_since(pid: int, started_at: datetime) -> bool:
    """Is ``pid`` the same process that registered at ``started_at``?"""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        if any("supervisor" in part for part in proc.cmdline()):
            return True  # a live worker or master: never release it, whatever the clocks say
        created = proc.create_time()
    except psutil.Error:
        return False
    return created <= started_at.timestamp() + 5.0  # a younger, unrelated process reused the pid
