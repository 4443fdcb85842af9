"""Cron schedules: enqueue periodic work, once per fire time across all hosts.

Every worker process whose config has ``schedules:`` runs this thread. At each
fire time every such process tries to take the schedule's ``scheduler_locks``
lease for that fire time; the one that wins records a ``job_runs`` row, enqueues
the schedule's actor by name (it need not be declared in this process), and
releases the lease. The run then follows its job: succeeded or failed when the
job finishes, crashed when the scheduler died before enqueueing (found at start)
or the job vanished. A fire's message has the dedupe key ``schedule:<name>``, so a
fire while the previous fire's job is still pending or running is recorded as
``skipped`` (and, but for the missed fires of ``catch_up: all``, a schedule never has
two live jobs).

Fire times are wall-clock times in the schedule's zone (``timezone``, else
``supervisor.timezone``), with cron.py's DST rules, held as UTC instants: the same on
every host, so neither clock skew nor a host's own zone can make a schedule fire twice.

A fire no scheduler took within ``grace_seconds`` of its time (none ran: the fleet was
down, its host suspended, the database away) is missed; the schedule's ``catch_up`` says
what becomes of it, counted from the last fire time any host took (``scheduler_locks``):

- ``none`` (the default, and the behaviour before catch_up existed): skipped, as cron
  does. A starting scheduler waits for the next fire time (fires before its start, even
  within the grace, are left to the hosts that were up); a running one that finds a fire
  more than the grace late logs it as missed. Nothing is recorded in ``job_runs``.
- ``last``: the latest missed fire runs (at start, or as soon as the scheduler finds it
  is late), as a fire would; older ones are skipped.
- ``all``: the fire that runs next also runs each missed fire before it, oldest first, up
  to ``catch_up_limit`` of the latest ones, under the same lease: one host records every
  run (a ``job_runs`` row each, scheduled_for its fire time) and enqueues its job. Their
  jobs and the schedule's own carry the concurrency key ``schedule:<name>``, so they run
  one at a time, oldest first; a missed fire's job has no dedupe key (each of them runs).

``catch_up_window`` skips missed fires older than it (last and all). Either way each
fire time runs at most once across every host: the lease is taken for the newest fire
time, which no host can take again, and ``job_runs`` holds one row per fire time.
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

    # A run that returned None reports nothing: skipped then (broker/signals.py).
    inert_when_planned = frozenset({"after_process_message"})

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
        grace_seconds: float = defaults.SCHEDULE_GRACE,
    ) -> None:
        super().__init__(name="scheduler", daemon=True)
        self.broker = broker
        self.schedules = list(schedules)
        self.crons = {s.name: cron.parse(s.cron, s.timezone) for s in self.schedules}
        self.holder = holder
        self.clock = clock
        self.sync_seconds = sync_seconds
        self.grace = timedelta(seconds=grace_seconds)
        self._halt = threading.Event()
        self.fired: list[tuple[str, datetime, str]] = []  # (schedule, fire time, outcome), for status and tests
        # Each schedule's next fire time; None: not known yet (at start, while the database is away).
        self.due: dict[str, datetime | None] = {s.name: None for s in self.schedules}
        self._recovered = False
        self._last_sync: datetime | None = None  # tick(): when runs were last synced, crashed ones last looked for
        self._last_purge: datetime | None = None

    # --- one fire -------------------------------------------------------------

    def fire(self, schedule: ScheduleConfig, fire_at: datetime) -> str:
        """Run ``schedule`` for ``fire_at`` (with ``catch_up: all``, and the fires missed
        before it) if this process wins the lease; each fire time's outcome goes to
        ``fired``. Returns fire_at's: fired | skipped | failed | not-ours."""
        ttl = schedule.lock_ttl_seconds
        key = {"name": schedule.name, "holder": self.holder, "fire_at": fire_at}
        with self.broker.pool.connection() as conn:
            with conn.transaction():
                since = None  # where the missed fires start (catch_up: all), read as ACQUIRE replaces it
                if schedule.catch_up == "all":
                    since = (conn.execute(sql.SINCE_LOCKED, key).fetchone() or (None,))[0]
                acquired = conn.execute(sql.ACQUIRE, {**key, "ttl_s": ttl}).fetchone() is not None
            if not acquired:
                self.fired.append((schedule.name, fire_at, "not-ours"))
                return "not-ours"
            try:
                missed = self._missed(schedule, since, fire_at) if since is not None else []
                outcomes = self._run(conn, schedule, [*missed, fire_at])
            finally:
                conn.execute(sql.RELEASE, key)
        self.fired += [(schedule.name, t, outcome) for t, outcome in outcomes]
        return outcomes[-1][1]

    def _missed(self, schedule: ScheduleConfig, since: datetime, fire_at: datetime) -> list[datetime]:
        """The fire times after ``since`` and before ``fire_at`` that ``catch_up: all`` runs."""
        window = schedule.catch_up_window
        oldest = self.clock() - timedelta(seconds=window) if window is not None else None
        times, left_out = missed_fires(self.crons[schedule.name], since, fire_at, schedule.catch_up_limit, oldest)
        if times:
            log.warning("schedule %s: catching up %d missed fire(s), %s to %s", schedule.name, len(times),
                        times[0].isoformat(), times[-1].isoformat())
        if left_out:
            log.warning("schedule %s: older missed fires (after %s) skipped: beyond catch_up_limit %d or "
                        "catch_up_window", schedule.name, since.isoformat(), schedule.catch_up_limit)
        return times

    def _run(self, conn: psycopg.Connection, schedule: ScheduleConfig,
             fires: list[datetime]) -> list[tuple[datetime, str]]:
        """Record a run per fire time, then enqueue their jobs in that order (so they are
        claimed in it); a fire time recorded already is not ours."""
        rows = conn.execute(sql.START_RUNS, {"name": schedule.name, "fires": fires, "holder": self.holder})
        runs = {when: run_id for run_id, when in rows.fetchall()}
        out: list[tuple[datetime, str]] = []
        error: str | None = None
        for when in fires:
            run_id = runs.get(when)
            if run_id is None:
                out.append((when, "not-ours"))  # recorded already (the lease row was reset by hand)
            elif error is not None:  # an earlier enqueue failed: so would this one
                conn.execute(sql.COMPLETE_RUN, {"id": run_id, "status": "failed", "error": error})
                out.append((when, "failed"))
            else:
                try:
                    out.append((when, self._enqueue(conn, schedule, run_id, when, missed=when != fires[-1])))
                except Exception as exc:
                    error = f"could not enqueue: {type(exc).__name__}: {exc}"
                    conn.execute(sql.COMPLETE_RUN, {"id": run_id, "status": "failed", "error": error})
                    log.error("schedule %s: could not enqueue %s: %s", schedule.name, schedule.actor, exc)
                    out.append((when, "failed"))
        return out

    def _enqueue(self, conn: psycopg.Connection, schedule: ScheduleConfig, run_id: int, fire_at: datetime, *,
                 missed: bool) -> str:
        options: dict[str, Any] = {"schedule": schedule.name, "scheduled_for": fire_at.isoformat()}
        if not missed:  # a fire while the previous fire's job is live is skipped; each missed one runs
            options["dedupe_key"] = f"schedule:{schedule.name}"
        if schedule.catch_up == "all":  # caught-up jobs and the schedule's own run one at a time
            options["concurrency_key"] = f"schedule:{schedule.name}"
        message: Message[Any] = Message(queue_name=schedule.queue, actor_name=schedule.actor,
                                        args=tuple(schedule.args or ()), kwargs=dict(schedule.kwargs or {}),
                                        options=options)
        # Its own transaction (the pool's), so each job's run_at is later than the one before.
        sent = self.broker.enqueue(message)
        if sent.message_id != message.message_id:
            conn.execute(sql.COMPLETE_RUN, {
                "id": run_id, "status": "skipped",
                "error": f"the previous run's job {sent.message_id} is still pending or running"})
            log.warning("schedule %s: previous job %s still live; skipped %s",
                        schedule.name, sent.message_id, fire_at.isoformat())
            return "skipped"
        conn.execute(sql.SET_RUN_JOB, {"id": run_id, "job_id": message.message_id})
        log.info("schedule %s %s for %s: %s job %s", schedule.name, "caught up" if missed else "fired",
                 fire_at.isoformat(), schedule.actor, message.message_id)
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

    def _first_due(self, schedule: ScheduleConfig, now: datetime) -> datetime:
        """A starting scheduler's first fire time: the next one; with catch_up, the latest
        one if it came after the last fire any host took (it was missed: fire() runs it,
        or finds it fired already)."""
        cron_expr = self.crons[schedule.name]
        if schedule.catch_up == "none":
            return cron_expr.next_after(now)
        with self.broker.pool.connection() as conn:
            conn.execute(sql.KNOW, {"name": schedule.name, "holder": self.holder, "now": now})
            since = conn.execute(sql.SINCE, {"name": schedule.name}).fetchone()
        latest = cron_expr.last_at_or_before(now)
        return latest if since is None or since[0] is None or latest > since[0] else cron_expr.next_after(now)

    def _due(self, schedule: ScheduleConfig, fire_at: datetime, now: datetime) -> datetime:
        """Fire ``fire_at``, now due; a missed one as the schedule's catch_up says.
        Returns the fire time handled (with catch_up, the latest one due)."""
        late = now - fire_at
        if late > self.grace and schedule.catch_up != "none":
            fire_at = self.crons[schedule.name].last_at_or_before(now)  # the latest missed fire
            late = now - fire_at
        window = schedule.catch_up_window
        if late > self.grace and (schedule.catch_up == "none" or window is not None and late.total_seconds() > window):
            log.warning("schedule %s: missed %s (late by %s, catch_up: %s); waiting for the next time",
                        schedule.name, fire_at.isoformat(), late, schedule.catch_up)
            self.fired.append((schedule.name, fire_at, "missed"))
        elif self._safely(f"firing {schedule.name}", functools.partial(self.fire, schedule, fire_at)) is None:
            self.fired.append((schedule.name, fire_at, "failed"))
        return fire_at

    def _run_forever(self) -> None:
        self._safely_recover()
        while not self._halt.is_set():
            wake = self.tick(self.clock())
            wait = min(self.sync_seconds, max(0.0, (wake - self.clock()).total_seconds()))
            self._halt.wait(wait)

    def _safely_recover(self) -> None:
        self._recovered = self._safely("recovery", self.recover) is not None or self._recovered

    def tick(self, now: datetime) -> datetime:
        """One pass at ``now``: fire what is due, sync and recover when their time
        comes; returns when the next fire is due. The thread calls it in a loop; a test
        calls it with the times of a clock it controls."""
        due = self.due
        if self._last_sync is None or self._last_purge is None:
            self._last_sync = self._last_purge = now
        for s in self.schedules:
            fire_at = due[s.name]
            if fire_at is None:
                fire_at = due[s.name] = self._safely(f"starting {s.name}", functools.partial(self._first_due, s, now))
            if fire_at is None or fire_at > now:
                continue
            handled = self._due(s, fire_at, now)
            # Not before now - grace: fires missed by more were handled as such just now.
            due[s.name] = self.crons[s.name].next_after(max(handled, now - self.grace))
        if (now - self._last_sync).total_seconds() >= self.sync_seconds:
            self._safely("syncing runs", self.sync)
            self._last_sync = now
        if not self._recovered or (now - self._last_purge) > timedelta(days=1):
            self._safely_recover()
            self._last_purge = now
        known = [d for d in due.values() if d is not None]
        return min(known, default=now + timedelta(seconds=self.sync_seconds))


def missed_fires(cron_expr: cron.CronExpr, since: datetime, until: datetime, limit: int,
                 oldest: datetime | None) -> tuple[list[datetime], bool]:
    """The fire times after ``since`` and before ``until``, not before ``oldest``: the
    latest ``limit`` of them, oldest first; and whether earlier ones were left out.
    Counted back from ``until``, so a long outage costs ``limit`` steps, not one per fire."""
    times: list[datetime] = []
    t = until
    while True:
        t = cron_expr.last_at_or_before(t - timedelta(microseconds=1))
        if t <= since or (oldest is not None and t < oldest):
            return times[::-1], oldest is not None and t > since
        if len(times) == limit:
            return times[::-1], True
        times.append(t)
