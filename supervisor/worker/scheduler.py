"""Cron schedules: enqueue periodic work, once per fire time across all hosts.

Every worker process whose config has ``schedules:`` runs this thread. At each
fire time every such process tries to take the schedule's ``scheduler_locks``
lease for that fire time; the one that wins records a ``job_runs`` row, enqueues
the schedule's actor by name (it need not be declared in this process), and
releases the lease. The run then follows its job: succeeded or failed when the
job finishes, crashed when the scheduler died before enqueueing (found at start)
or the job vanished. A schedule never has two live jobs: its messages share the
dedupe key ``schedule:<name>``, so a fire while the previous job is still pending
or running is recorded as ``skipped``.

Fire times are computed in UTC from the cron expression and are the same on every
host, so clock skew between hosts cannot make a schedule fire twice. Fires missed
by more than ``grace_seconds`` (the process was stopped or suspended) are skipped,
as cron does.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import psycopg
from dramatiq.broker import Broker, MessageProxy
from dramatiq.message import Message
from dramatiq.middleware import Middleware

from .. import cron, defaults
from ..broker import PostgresBroker, threads
from ..config import ScheduleConfig
from . import scheduler_sql as sql

log = logging.getLogger(__name__)

def utcnow() -> datetime:
    return datetime.now(UTC)


def rows_affected(result: Any) -> int | None:
    """An actor reports rows affected by returning an int, or a dict with an int "rows_affected"."""
    value = result.get("rows_affected") if isinstance(result, dict) else result
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class RunResults(Middleware):
    """Records what a scheduled job reports (``rows_affected``) on its ``job_runs`` row."""

    def after_process_message(self, broker: Broker, message: MessageProxy, *, result: Any = None,
                              exception: BaseException | None = None) -> None:
        schedule, fire_at = message.options.get("schedule"), message.options.get("scheduled_for")
        rows = rows_affected(result) if exception is None else None
        if not schedule or not fire_at or rows is None:
            return
        try:
            with cast(PostgresBroker, broker).pool.connection() as conn:
                conn.execute(sql.SET_ROWS_AFFECTED, {"rows": rows, "name": schedule, "fire_at": fire_at})
        except Exception as exc:  # bookkeeping only: the job itself succeeded
            log.warning("schedule %s: could not record rows_affected: %s", schedule, exc)


class Scheduler(threading.Thread):
    def __init__(
        self,
        broker: PostgresBroker,
        schedules: Iterable[ScheduleConfig],
        *,
        holder: str,
        clock: Callable[[], datetime] = utcnow,
        sync_seconds: float = 5.0,
        grace_seconds: float = 60.0,
    ) -> None:
        super().__init__(name="scheduler", daemon=True)
        self.broker = broker
        self.schedules = list(schedules)
        self.crons = {s.name: cron.parse(s.cron) for s in self.schedules}
        self.holder = holder
        self.clock = clock
        self.sync_seconds = sync_seconds
        self.grace = timedelta(seconds=grace_seconds)
        self._halt = threading.Event()
        self.fired: list[tuple[str, datetime, str]] = []  # (schedule, fire time, outcome), for status and tests

    # --- one fire -------------------------------------------------------------

    def fire(self, schedule: ScheduleConfig, fire_at: datetime) -> str:
        """Run ``schedule`` for ``fire_at`` if this process wins the lease.
        Returns: fired | skipped | failed | not-ours."""
        ttl = schedule.lock_ttl_seconds
        key = {"name": schedule.name, "holder": self.holder, "fire_at": fire_at}
        with self.broker.pool.connection() as conn:
            if conn.execute(sql.ACQUIRE, {**key, "ttl_s": ttl}).fetchone() is None:
                return "not-ours"
            try:
                return self._run(conn, schedule, fire_at)
            finally:
                conn.execute(sql.RELEASE, key)

    def _run(self, conn: psycopg.Connection, schedule: ScheduleConfig, fire_at: datetime) -> str:
        row = conn.execute(sql.START_RUN, {"name": schedule.name, "fire_at": fire_at,
                                           "holder": self.holder}).fetchone()
        if row is None:
            return "not-ours"  # recorded already (the lease row was reset by hand)
        run_id = row[0]
        message: Message[Any] = Message(
            queue_name=schedule.queue,
            actor_name=schedule.actor,
            args=tuple(schedule.args or ()),
            kwargs=dict(schedule.kwargs or {}),
            options={"dedupe_key": f"schedule:{schedule.name}", "schedule": schedule.name,
                     "scheduled_for": fire_at.isoformat()},
        )
        try:
            sent = self.broker.enqueue(message)
        except Exception as exc:
            conn.execute(sql.COMPLETE_RUN, {"id": run_id, "status": "failed",
                                            "error": f"could not enqueue: {type(exc).__name__}: {exc}"})
            log.error("schedule %s: could not enqueue %s: %s", schedule.name, schedule.actor, exc)
            return "failed"
        if sent.message_id != message.message_id:
            conn.execute(sql.COMPLETE_RUN, {
                "id": run_id, "status": "skipped",
                "error": f"the previous run's job {sent.message_id} is still pending or running"})
            log.warning("schedule %s: previous job %s still live; skipped %s",
                        schedule.name, sent.message_id, fire_at.isoformat())
            return "skipped"
        conn.execute(sql.SET_RUN_JOB, {"id": run_id, "job_id": message.message_id})
        log.info("schedule %s fired for %s: %s job %s", schedule.name, fire_at.isoformat(), schedule.actor,
                 message.message_id)
        return "fired"

    # --- bookkeeping ------------------------------------------------------------

    def recover(self) -> int:
        """Mark runs orphaned by a crash (old runs go with the upkeep's retention)."""
        stale = max((s.lock_ttl_seconds for s in self.schedules),
                    default=defaults.SCHEDULE_LOCK_TTL)
        with self.broker.pool.connection() as conn:
            crashed = conn.execute(sql.RECOVER_CRASHED, {"stale_s": stale}).rowcount
        if crashed:
            log.warning("scheduler: %d crashed run(s) found", crashed)
        return crashed

    def sync(self) -> None:
        """Copy finished jobs' outcomes onto their runs."""
        with self.broker.pool.connection() as conn:
            conn.execute(sql.SYNC_FINISHED)
            conn.execute(sql.SYNC_LOST)

    # --- the thread ---------------------------------------------------------------

    def stop(self, timeout: float | None = 5.0) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(timeout)

    def _safely(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except threads.EXPECTED as exc:  # the database may be away; try again next tick
            threads.warn(log, f"scheduler: {what}", exc)
            return None

    def run(self) -> None:
        with threads.lifetime(self.name, self._halt.is_set):
            self._run_forever()

    def _run_forever(self) -> None:
        recovered = self._safely("recovery", self.recover) is not None
        now = self.clock()
        due = {s.name: self.crons[s.name].next_after(now) for s in self.schedules}
        last_sync = last_purge = now
        while not self._halt.is_set():
            now = self.clock()
            for s in self.schedules:
                fire_at = due[s.name]
                if fire_at > now:
                    continue
                if now - fire_at > self.grace:
                    log.warning("schedule %s: missed %s (late by %s); waiting for the next time",
                                s.name, fire_at.isoformat(), now - fire_at)
                    outcome = "missed"
                else:
                    outcome = self._safely(f"firing {s.name}", functools.partial(self.fire, s, fire_at)) or "failed"
                self.fired.append((s.name, fire_at, outcome))
                due[s.name] = self.crons[s.name].next_after(max(fire_at, now - self.grace))
            if (now - last_sync).total_seconds() >= self.sync_seconds:
                self._safely("syncing runs", self.sync)
                last_sync = now
            if not recovered or (now - last_purge) > timedelta(days=1):
                recovered = self._safely("recovery", self.recover) is not None or recovered
                last_purge = now
            wake = min(due.values(), default=now + timedelta(seconds=self.sync_seconds))
            wait = min(self.sync_seconds, max(0.0, (wake - self.clock()).total_seconds()))
            self._halt.wait(wait)
