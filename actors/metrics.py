"""The price tracker's gauges on /metrics (through ``App.gauges``): each source's breaker."""

from __future__ import annotations

from collections.abc import Iterable

import psycopg

from supervisor.apps import Gauge

from .queries import sources


def gauges(conn: psycopg.Connection) -> Iterable[Gauge]:
    rows = conn.execute(sources.BREAKERS).fetchall()
    # name, enabled, failure_streak, paused_until, paused_now, ...
    open_ = tuple(((r[0],), 1.0 if r[4] else 0.0) for r in rows)
    streak = tuple(((r[0],), float(r[2] or 0)) for r in rows)
    return (
        Gauge("actor_supervisor_breaker_open", "1 while the source's circuit breaker holds its polls back",
              ("source",), open_),
        Gauge("actor_supervisor_breaker_failure_streak", "Consecutive failed fetches of the source",
              ("source",), streak),
    )
