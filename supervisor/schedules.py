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
    (ISO 8601 with the offset, which tells the UTC instant too), ``next_fire`` in UTC
    and ``next_fire_local`` in its zone (datetimes)."""
    expr = cron.parse(schedule.cron, schedule.timezone)
    upcoming = expr.upcoming(now, count)
    return {"name": schedule.name, "cron": schedule.cron, "timezone": expr.timezone, "catch_up": schedule.catch_up,
            "actor": schedule.actor, "queue": schedule.queue,
            "last_fire": expr.local(last_fire).isoformat() if last_fire is not None else None,
            "next": [expr.local(t).isoformat() for t in upcoming],
            "next_fire": upcoming[0] if upcoming else None,
            "next_fire_local": expr.local(upcoming[0]) if upcoming else None}
