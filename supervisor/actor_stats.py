"""Figures per actor over a recent window: finished per minute, failure rate, run time
and start wait p50 / p95 / p99, in flight, retries, time spent. Shared by the Actors
page, GET /api/v1/actors and /metrics (the start waits, which Dramatiq's metrics lack).

A job's run time and wait are its last attempt's (migration 028): the run from
started_at to finished_at, the wait from max(created_at, run_at) to started_at.
A window with more than SCAN_CAP finished jobs is read from its newest SCAN_CAP: its
rates are then over the time those cover (``complete`` false, ``covered_since``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

from . import db
from .broker import sql
from .broker.reads import actor_reads

WINDOWS = {"15m": 900, "1h": 3600, "6h": 6 * 3600}
DEFAULT_WINDOW = "1h"
SCAN_CAP = 100_000
# What the figures of a window that held more than SCAN_CAP finished jobs stand on.
BY_CAP = (f"the window's newest {SCAN_CAP:,} finished jobs, from covered_since: counts are at least these, "
          "rates per the time they cover")
# /metrics' start waits per actor: over jobs finished this recently (read at each scrape).
METRICS_WINDOW_S = 300
PERCENTILES = ("p50", "p95", "p99")


def actor_stats(conn: psycopg.Connection, *, window_s: float) -> dict[str, Any]:
    """Every actor that finished, failed an attempt or runs a job in the window, most
    time spent first."""
    now: datetime = db.one(conn.execute(sql.NOW))
    params = {"window_s": window_s, "cap": SCAN_CAP}
    done = {r["actor"]: r for r in db.dicts(conn, actor_reads.ACTORS, params)}
    retried = {r["actor"]: r for r in db.dicts(conn, actor_reads.ACTOR_RETRIES, params)}
    flying = {r["actor"]: r["in_flight"] for r in db.dicts(conn, actor_reads.IN_FLIGHT)}
    # each read that hit the cap covers from its oldest row on: both, from the later
    starts = [min(r["oldest"] for r in rows.values()) for rows, n in ((done, "rows_read"), (retried, "failed_attempts"))
              if rows and sum(r[n] for r in rows.values()) >= SCAN_CAP]
    covered_since = max(starts) if starts else None
    # a capped read covers less than the window: rates are per the time it covers
    span_s = (now - covered_since).total_seconds() if covered_since else window_s
    out = []
    for name in sorted(set(done) | set(retried) | set(flying)):
        d, r = done.get(name, {}), retried.get(name, {})
        finished, failed = int(d.get("finished") or 0), int(d.get("failed") or 0)
        out.append({
            "actor": name, "finished": finished, "failed": failed,
            "per_minute": round(finished * 60 / span_s, 3) if span_s > 0 else None,
            "failure_rate": failed / finished if finished else None,
            "busy_s": float(d.get("busy_s") or 0.0),
            **_percentiles("run", d.get("run_pct")), **_percentiles("wait", d.get("wait_pct")),
            "in_flight": int(flying.get(name, 0)),
            "retries": int(r.get("retries") or 0), "failed_attempts": int(r.get("failed_attempts") or 0),
        })
    out.sort(key=lambda a: (-a["busy_s"], -a["finished"], a["actor"]))
    return {"window_s": window_s, "now": now, "complete": covered_since is None, "covered_since": covered_since,
            "exact": covered_since is None, "estimated_by": None if covered_since is None else BY_CAP,
            "actors": out}


def _percentiles(name: str, values: list[float | None] | None) -> dict[str, float | None]:
    """{name_p50_s: ..., name_p95_s: ..., name_p99_s: ...} in seconds, to the millisecond."""
    got = values or [None] * len(PERCENTILES)
    return {f"{name}_{p}_s": None if v is None else round(v, 3) for p, v in zip(PERCENTILES, got, strict=True)}


def start_waits(conn: psycopg.Connection, *, window_s: float = METRICS_WINDOW_S) -> dict[str, dict[str, float]]:
    """Per actor, the start waits p50 / p95 / p99 (seconds) of the jobs finished in the
    last ``window_s`` seconds (only actors that finished one that ran)."""
    rows = db.dicts(conn, actor_reads.ACTORS, {"window_s": window_s, "cap": SCAN_CAP})
    return {r["actor"]: dict(zip(PERCENTILES, r["wait_pct"], strict=True))
            for r in rows if r["wait_pct"] and r["wait_pct"][0] is not None}
