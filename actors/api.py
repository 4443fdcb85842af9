"""The price tracker's own /api/v1 routes (through ``App.routes``; the HTTP child
mounts them, answering only where the tracker is in use).

``GET /api/v1/watches`` lists the watches as ``supervisor watches list --json`` does.
``POST /api/v1/reextract`` is the synchronous re-extraction (decision 8 of the
refactor plan): the listings are extracted in the HTTP process, one at a time, and
the answer carries the counts. ``{"enqueue": true}`` sends them to the extraction
role instead, at priority 1 (what the nightly schedule does).
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
from starlette.requests import Request
from starlette.routing import Route

from supervisor import runtime
from supervisor.http.render import Json, error
from supervisor.http.state import state_of

from . import catalog, tracker

KEYS = ("watch", "incomplete", "enqueue")


def _options(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw) if raw.strip() else {}
    except ValueError as exc:
        raise ValueError(f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    unknown = sorted(set(body) - set(KEYS))
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown field (the fields are {', '.join(KEYS)})")
    for key in ("incomplete", "enqueue"):
        if not isinstance(body.get(key, False), bool):
            raise ValueError(f"{key}: must be true or false")
    watch = body.get("watch")
    if watch is not None and not isinstance(watch, (int, str)) or isinstance(watch, bool):
        raise ValueError("watch: must be a watch's id or name")
    return body


async def reextract(request: Request) -> Json:
    """
    ---
    summary: "Extract listings again: {watch (id or name; else all), incomplete (only those whose
      extraction was incomplete), enqueue (send them at priority 1 instead of extracting here)}"
    responses:
      200: {description: "{listings, deals, errors} extracted here, or {enqueued, priority}"}
      400: {description: a bad field, named}
    """
    from starlette.concurrency import run_in_threadpool

    try:
        body = _options(await request.body())
    except ValueError as exc:
        return error(400, str(exc))
    state = state_of(request)

    def run() -> Json:
        watch_id = None
        if body.get("watch") is not None:
            with state.connection() as conn:
                try:
                    watch_id = catalog.watch_id(conn, str(body["watch"]))
                except catalog.CatalogError as exc:
                    return error(400, f"watch: {exc}")
        producer = state.producer()
        incomplete = bool(body.get("incomplete"))
        if body.get("enqueue"):
            count = tracker.reextract(producer, watch_id, incomplete)
            return Json({"enqueued": count, "watch_id": watch_id, "priority": tracker.REEXTRACT_PRIORITY})
        # The extraction reads its settings from the config's pipeline: section, as a worker would.
        runtime.configure(app_settings=state.config.app_settings if state.config is not None else {})
        return Json({**tracker.reextract_now(producer, watch_id, incomplete), "watch_id": watch_id})

    return await run_in_threadpool(run)


def watches(request: Request) -> Json:
    """
    ---
    summary: "The watches: last polled (whatever the outcome), next_poll_at (a failing watch backs off:
      its interval, doubling per failed poll up to a day), last_error and failures, pending alerts"
    responses:
      200: {description: "{watches: [...]}"}
      503: {description: the database is unavailable}
    """
    try:
        with state_of(request).connection() as conn:
            return Json({"watches": catalog.list_watches(conn)})
    except (psycopg.Error, TimeoutError) as exc:
        return error(503, f"database unavailable: {exc}")


def routes() -> list[Route]:
    return [Route("/reextract", reextract, methods=["POST"]), Route("/watches", watches, methods=["GET"])]
