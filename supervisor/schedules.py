"""What the config's schedules do next, as every reader shows it: `supervisor schedules`,
GET /api/v1/schedules and the Schedules page. Needs the config only; the last fire
(``scheduler_locks.fire_at``) is the caller's to add when the database answers."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from . import cron
from .config import ScheduleConfig

NEXT_SHOWN = 3  # fire times listed per schedule


def describe(schedule: ScheduleConfig, now: datetime, last_fire: datetime | None = None,
             count: int = NEXT_SHOWN) -> dict[str, Any]:
    """A schedule and its next ``count`` fire times after ``now``: ``next`` in its zone
    (ISO 8601 with the offset, which tells the UTC instant too); the next and the last
    fire each as a UTC datetime (``next_fire``, ``last_fire``) and in the zone
    (``next_fire_local``, ``last_fire_local``: ISO 8601)."""
    expr = cron.parse(schedule.cron, schedule.timezone)
    upcoming = expr.upcoming(now, count)
    return {"name": schedule.name, "cron": schedule.cron, "timezone": expr.timezone, "catch_up": schedule.catch_up,
            "actor": schedule.actor, "queue": schedule.queue,
            "last_fire": last_fire, "last_fire_local": _local(expr, last_fire),
            "next_fire": upcoming[0], "next_fire_local": _local(expr, upcoming[0]),
            "next": [expr.local(t).isoformat() for t in upcoming]}


def _local(expr: cron.CronExpr, when: datetime | None) -> str | None:
    return expr.local(when).isoformat() if when is not None else None
