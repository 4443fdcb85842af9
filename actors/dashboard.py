"""The price tracker's dashboard page, its breakers on the Limits page, and an alert per
open breaker on the Overview (contributed through ``App.pages``; loaded only by the
HTTP child)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg

from supervisor import db
from supervisor.apps import Page, Table

from . import settings
from .queries import notifications, pipeline, sources

RECENT_ALERTS = 25



def _when(t: datetime | None) -> str | None:
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if t is not None else None


def _money(cents: int | None) -> str | None:
    return f"{cents / 100:.2f}" if cents is not None else None


def tracker_tables(conn: psycopg.Connection) -> list[Table]:
    counts = db.dicts(conn, pipeline.COUNTS)[0]
    watches = db.dicts(conn, pipeline.WATCHES_POLLED)
    alerts = db.dicts(conn, notifications.RECENT_ALERTS, {"limit": RECENT_ALERTS})
    return [
        Table("State", ("what", "count"), [(k.replace("_", " "), v) for k, v in counts.items()]),
        Table("Watches", ("id", "watch", "source", "enabled", "every (s)", "last polled", "next poll", "last error"),
              [(w["id"], w["watch"], w["source"], "yes" if w["enabled"] else "no", w["poll_interval_seconds"],
                _when(w["last_polled_at"]) or "never", _when(w["next_poll"]) or "now", w["last_error"] or "")
               for w in watches],
              note="a failing watch is tried again after its interval, doubling per failed poll up to a day"),
        Table("Recent alerts", ("id", "watch", "price", "reason", "created", "delivery", "HTTP", "attempts"),
              [(a["id"], a["watch"], _money(a["price_cents"]), a["reason"], _when(a["created_at"]),
                a["delivery"] or ("delivered" if a["notified"] else "not tried"), a["http_status"], a["attempts"])
               for a in alerts],
              note="delivery: the latest attempt in the notification ledger"),
    ]


def _state(row: dict[str, Any], threshold: int) -> str:
    if row["paused_now"]:
        return "open"
    return "half-open" if row["failure_streak"] >= threshold else "closed"


def breaker_tables(conn: psycopg.Connection) -> list[Table]:
    threshold = settings.breaker().threshold  # the config's pipeline.breaker, else the default
    rows = db.dicts(conn, sources.BREAKERS)
    return [Table("Circuit breakers (sources)", ("source", "state", "failure streak", "reopens", "last error"),
                  [(r["name"], _state(r, threshold), r["failure_streak"],
                    _when(r["paused_until"]) if r["paused_now"] else None, r["last_error"]) for r in rows],
                  note=f"open after {threshold} failures in a row; half-open lets one probe through")]


def breaker_alerts(conn: psycopg.Connection) -> list[str]:
    return [f"breaker of source {r['name']} is open until {_when(r['paused_until'])}"
            for r in db.dicts(conn, sources.BREAKERS) if r["paused_now"]]


def pages() -> list[Page]:
    return [Page(slug="tracker", title="Price tracker", tables=tracker_tables, limits=breaker_tables,
                 alerts=breaker_alerts)]
