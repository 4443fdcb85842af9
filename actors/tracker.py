"""Operator-facing reads and actions on the whole tracker, without the actors
loaded (the CLI and the HTTP surface use them from any process)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import psycopg
from dramatiq.message import Message

from . import llm
from .queries import pipeline as pipeline_sql
from .queries import state as sql

log = logging.getLogger(__name__)

REEXTRACT_PRIORITY = 1  # ahead of new listings (priority 0)


def system_state(conn: psycopg.Connection) -> dict[str, Any]:
    """The ``system_state`` view as a dict, in one query."""
    cursor = conn.execute(sql.SYSTEM_STATE)
    row = cursor.fetchone()
    assert cursor.description is not None and row is not None
    return {c.name: int(v) for c, v in zip(cursor.description, row, strict=True)}


def to_reextract(broker, watch_id: int | None = None, incomplete: bool = False) -> list[tuple[int, int | None]]:
    """(listing id, watch id) of one watch's listings (None: every listing), only
    those whose extraction was incomplete when ``incomplete``."""
    with broker.actor_pool.connection() as conn:
        return [(int(lid), wid) for lid, wid in conn.execute(
            pipeline_sql.LISTINGS_TO_REEXTRACT, {"watch_id": watch_id, "incomplete": incomplete})]


def reextract(broker, watch_id: int | None = None, incomplete: bool = False) -> int:
    """Enqueue extraction of one watch's listings (None: every listing; only the
    incomplete ones when ``incomplete``) at priority 1, so they run before new
    listings. Returns how many."""
    rows = to_reextract(broker, watch_id, incomplete)
    limits = llm.job_options()  # the model's, when one is configured (llm.py)
    messages: list[Message[Any]] = [
        Message(queue_name="extraction", actor_name="extract_listing", args=(lid, wid), kwargs={"reextract": True},
                options={"priority": REEXTRACT_PRIORITY, "dedupe_key": f"reextract:{lid}", **limits})
        for lid, wid in rows
    ]
    broker.enqueue_many(messages)
    return len(messages)


def reextract_now(broker, watch_id: int | None = None, incomplete: bool = False,
                  progress: Callable[[int, int], None] | None = None) -> dict[str, int]:
    """The synchronous path (decision 8 of the refactor plan): extract the listings in
    this process, one at a time, instead of enqueueing them. Deals alert and notify
    as the extraction role's would (the notification is enqueued). ``progress(done,
    total)`` is called after each listing. Returns counts: listings, deals, errors."""
    import dramatiq

    dramatiq.set_broker(broker)  # the actors bind to the global broker when imported
    from .extraction import run_extraction

    rows = to_reextract(broker, watch_id, incomplete)
    counts = {"listings": len(rows), "deals": 0, "errors": 0}
    for done, (lid, wid) in enumerate(rows, 1):
        try:
            counts["deals"] += bool(run_extraction(lid, wid, reextract=True).get("deal"))
        except Exception as exc:  # one listing's failure must not stop the rest: counted, logged
            counts["errors"] += 1
            log.warning("re-extraction of listing %s failed: %s: %s", lid, type(exc).__name__, exc)
        if progress is not None:
            progress(done, len(rows))
    return counts
