"""Operator-facing reads and actions on the whole tracker, without the actors
loaded (the CLI and the HTTP surface use them from any process)."""

from __future__ import annotations

from typing import Any

import psycopg
from dramatiq.message import Message

from supervisor import db

from .queries import pipeline as pipeline_sql
from .queries import state as sql

REEXTRACT_PRIORITY = 1  # ahead of new listings (priority 0)


def system_state(conn: psycopg.Connection) -> dict[str, Any]:
    """The ``system_state`` view as a dict, in one query."""
    cursor = conn.execute(sql.SYSTEM_STATE)
    row = cursor.fetchone()
    assert cursor.description is not None and row is not None
    return {c.name: int(v) for c, v in zip(cursor.description, row, strict=True)}


def read_system_state(url: str | None = None) -> dict[str, Any]:
    """The same from a database URL (default: DATABASE_URL, else embedded)."""
    with db.connect(db.resolve_url(url)) as conn:
        return system_state(conn)


def reextract(broker, watch_id: int | None = None) -> int:
    """Enqueue extraction of one watch's listings (None: every listing) at
    priority 1, so they run before new listings. Returns how many."""
    with broker.actor_pool.connection() as conn:
        rows = conn.execute(pipeline_sql.LISTINGS_TO_REEXTRACT, {"watch_id": watch_id}).fetchall()
    messages: list[Message[Any]] = [
        Message(queue_name="extraction", actor_name="extract_listing", args=(lid, wid), kwargs={},
                options={"priority": REEXTRACT_PRIORITY, "dedupe_key": f"reextract:{lid}"})
        for lid, wid in rows
    ]
    broker.enqueue_many(messages)
    return len(messages)
