"""The price tracker's gauges on /metrics (through ``App.gauges``): each source's breaker,
and every column of the ``system_state`` view, read at each scrape."""

from __future__ import annotations

from collections.abc import Iterable

import psycopg

from supervisor.apps import Gauge

from .queries import sources
from .tracker import system_state


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
        Gauge("actor_supervisor_tracker_state",
              "The price tracker's system_state view, one series per column (watches, listings, baselines "
              "warm/cold at scoring.min_samples, extraction queue depth, listings_incomplete_extraction, ...)",
              ("column",), tuple(((name,), float(value)) for name, value in system_state(conn).items())),
    )
