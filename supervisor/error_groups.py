"""Failed attempts of a recent window, grouped by actor, exception type and where (the
innermost frame of the actor's own code, see ``broker/error_key.py``), and the
actions on a group. Shared by `supervisor errors`, GET /api/v1/errors and the Errors page.

Every failed attempt counts: those retried (after an exception, or a lost lease)
and those that failed for good. A window with more than SCAN_CAP of them is counted
from its newest SCAN_CAP (``complete`` false, ``covered_since`` when they start).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg

from . import admin, db, units
from .broker import sql
from .broker.reads import actor_reads

# The windows the page offers (the CLI and the API take any duration up to MAX_WINDOW_S).
WINDOWS = {"1h": 3600, "24h": 24 * 3600, "7d": 7 * 24 * 3600}
DEFAULT_WINDOW = "24h"
MAX_WINDOW_S = 30 * 24 * 3600  # job_events are kept 30 days by default
SPARK_BUCKETS = 24
SCAN_CAP = 100_000
# What a count of a window that held more than SCAN_CAP failed attempts stands on.
BY_CAP = f"the window's newest {SCAN_CAP:,} failed attempts, from covered_since: at least this many"
DEFAULT_GROUPS = 100
MAX_GROUPS = 500
# Jobs one action on a group changes at most (one statement per job, like the bulk actions).
GROUP_LIMIT = 10_000


@dataclass(frozen=True)
class GroupKey:
    actor: str
    error_type: str
    where: str  # '' when the error names no frame

    @property
    def id(self) -> str:
        """A short stable name for the group (page anchors, element ids)."""
        raw = "\0".join((self.actor, self.error_type, self.where)).encode()
        return hashlib.sha1(raw, usedforsecurity=False).hexdigest()[:12]


def parse_window(value: str | None, default: str = DEFAULT_WINDOW) -> float:
    """Seconds of a window: 1h, 24h, 7d, or any duration up to 30 days. ValueError with
    what was wrong, in one line."""
    text = (value or default).strip()
    try:
        seconds = units.parse_duration(text)
    except ValueError:
        raise ValueError(f"since: expected a duration like 1h, 24h or 7d, got {text!r}") from None
    if not 0 < seconds <= MAX_WINDOW_S or not math.isfinite(seconds):
        raise ValueError(f"since: must be more than 0 and at most 30d, got {text!r}")
    return seconds


def error_groups(conn: psycopg.Connection, *, window_s: float, actor: str | None = None,
                 limit: int = DEFAULT_GROUPS) -> dict[str, Any]:
    """The groups of the last ``window_s`` seconds, most attempts first: per group its
    attempts (retried, failed), first sighting ever kept and in the window, last one,
    attempts per bucket (SPARK_BUCKETS of them, oldest first), and a sample."""
    step = max(1, math.ceil(window_s / SPARK_BUCKETS))
    now: datetime = db.one(conn.execute(sql.NOW))
    rows = db.dicts(conn, actor_reads.ERROR_BUCKETS,
                    {"window_s": window_s, "step_s": step, "cap": SCAN_CAP, "actor": actor})
    found: dict[GroupKey, dict[str, Any]] = {}
    for r in rows:
        key = GroupKey(r["actor"], r["error_type"], r["error_where"])
        g = found.setdefault(key, {"attempts": 0, "failed": 0, "first_in_window": r["first_at"],
                                   "last_seen": r["last_at"], "per_bucket": {}})
        g["attempts"] += r["attempts"]
        g["failed"] += r["failed"]
        g["first_in_window"] = min(g["first_in_window"], r["first_at"])
        g["last_seen"] = max(g["last_seen"], r["last_at"])
        g["per_bucket"][r["t"]] = g["per_bucket"].get(r["t"], 0) + r["attempts"]
    total = sum(g["attempts"] for g in found.values())
    complete = total < SCAN_CAP
    chosen = sorted(found.items(), key=lambda kv: (-kv[1]["attempts"], -kv[1]["last_seen"].timestamp()))[:limit]
    details = _details(conn, [k for k, _ in chosen], window_s)
    start = now - timedelta(seconds=window_s)
    first_bucket = datetime.fromtimestamp(math.floor(start.timestamp() / step) * step, tz=now.tzinfo)
    buckets = [first_bucket + timedelta(seconds=i * step)
               for i in range(math.ceil((now - first_bucket).total_seconds() / step))]
    groups = []
    for key, g in chosen:
        detail = details.get(key, {})
        per_bucket = g.pop("per_bucket")
        groups.append({
            "id": key.id, "actor": key.actor, "error_type": key.error_type, "where": key.where,
            "attempts": g["attempts"], "retried": g["attempts"] - g["failed"], "failed": g["failed"],
            "first_seen": detail.get("first_seen") or g["first_in_window"], "first_in_window": g["first_in_window"],
            "last_seen": g["last_seen"],
            "buckets": [(t, per_bucket.get(t, 0)) for t in buckets],
            "sample": {k: detail.get(k) for k in ("job_id", "message", "traceback", "reason")},
        })
    return {"window_s": window_s, "since": start, "now": now, "step_s": step, "actor": actor,
            "attempts": total, "groups_total": len(found), "complete": complete,
            "exact": complete, "estimated_by": None if complete else BY_CAP,
            "covered_since": None if complete else min(g["first_in_window"] for g in found.values()),
            "groups": groups}


def _details(conn: psycopg.Connection, keys: list[GroupKey], window_s: float) -> dict[GroupKey, dict[str, Any]]:
    if not keys:
        return {}
    rows = db.dicts(conn, actor_reads.GROUP_DETAILS, {
        "actors": [k.actor for k in keys], "types": [k.error_type for k in keys], "wheres": [k.where for k in keys],
        "window_s": window_s})
    return {keys[r["i"] - 1]: r for r in rows}


# --- actions on a group ----------------------------------------------------------------------

# action -> (the change of one job, the statuses it applies to, what it did)
ACTIONS: dict[str, tuple[Callable[[psycopg.Connection, str], bool], tuple[str, ...], str]] = {
    "retry": (admin.retry_job, ("failed",), "retried"),
    "cancel": (admin.cancel_job, ("retryable", "pending"), "cancelled"),
}


def change_group(conn: psycopg.Connection, action: str, key: GroupKey, *, window_s: float,
                 limit: int = GROUP_LIMIT) -> dict[str, Any]:
    """``retry``: every job of the group that failed for good; ``cancel``: every job of
    the group waiting for another attempt (retryable; or pending: after a lost lease, or
    retried by an operator). A job counts in the group whose latest failed
    attempt, in the window, is of it. One job at a time (each its own fenced statement),
    oldest failure first, at most ``limit``."""
    change, statuses, verb = ACTIONS[action]
    ids = [r[0] for r in conn.execute(actor_reads.GROUP_JOBS, {
        "actor": key.actor, "error_type": key.error_type, "error_where": key.where, "window_s": window_s,
        "statuses": list(statuses), "limit": limit}).fetchall()]
    done = [i for i in ids if change(conn, i)]
    return {"action": action, "verb": verb, "matched": len(ids), "changed": len(done), "ids": done}
