"""The dashboard's routes: pages (GET, server-rendered), actions (POST, JSON), and the
server-sent event stream that tells open pages to refresh.

Handlers parse the request, call ``gather`` or ``actions`` and render; the action
guard in front of the app has already checked the token and read-only mode.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from ... import admin, servers
from ... import limits as flow_limits
from .. import api_limits
from ..auth import note
from ..render import Json, error
from ..state import state_of
from . import actions, errors_actors, gather
from .render import page

# A stream ends after this long and the browser reconnects (Last-Event-ID carries what
# it has seen), so a stopping server never waits on an open stream for long.
STREAM_SECONDS = 5.0
DEBOUNCE_SECONDS = 1.0
WATCH_INTERVAL = 0.25


def overview(request: Request) -> Response:
    window = request.query_params.get("window", "1h")
    if window not in gather.WINDOWS:
        return HTMLResponse(f"unknown window (one of {', '.join(gather.WINDOWS)})", status_code=400)
    state = state_of(request)
    # The server this process's connections reach, and the one before a failover it saw.
    seen = servers.server_seen(state.url)
    return page(request, "overview.html", o=gather.overview(state, window), windows=list(gather.WINDOWS),
                server=seen, server_since=datetime.fromtimestamp(seen.since, UTC) if seen else None)


def queues(request: Request) -> Response:
    return page(request, "queues.html", queues=gather.queues(state_of(request)))


def jobs(request: Request) -> Response:
    try:
        where = gather.form_filter(request.query_params)
        found = gather.jobs(state_of(request), where, request.query_params.get("cursor"))
    except ValueError as exc:
        return HTMLResponse(f"bad filter: {exc}", status_code=400)
    return page(request, "jobs.html", where=where, filter_query=gather.form_fields(where),
                statuses=admin.JOB_STATUSES, **found)


def job(request: Request) -> Response:
    job_id = request.path_params["job_id"]
    try:
        found = gather.job(state_of(request), str(uuid.UUID(job_id)))
    except ValueError:  # not a job id at all
        found = None
    if found is None:
        return HTMLResponse(f"no job {job_id}", status_code=404)
    return page(request, "job.html", job=found)


def workers(request: Request) -> Response:
    return page(request, "workers.html", w=gather.workers(state_of(request)))


def schedules(request: Request) -> Response:
    return page(request, "schedules.html", schedules=gather.schedules(state_of(request)))


def limits(request: Request) -> Response:
    return page(request, "limits.html", limits=gather.limits(state_of(request), request.query_params.get("after", "")))


def errors(request: Request) -> Response:
    window = request.query_params.get("window", errors_actors.ERROR_DEFAULT)
    actor = request.query_params.get("actor") or None
    if window not in errors_actors.ERROR_WINDOWS:
        return HTMLResponse(f"unknown window (one of {', '.join(errors_actors.ERROR_WINDOWS)})", status_code=400)
    return page(request, "errors.html", e=errors_actors.errors(state_of(request), window, actor), window=window,
                windows=errors_actors.ERROR_WINDOWS)


def actors(request: Request) -> Response:
    window = request.query_params.get("window", errors_actors.ACTOR_DEFAULT)
    if window not in errors_actors.ACTOR_WINDOWS:
        return HTMLResponse(f"unknown window (one of {', '.join(errors_actors.ACTOR_WINDOWS)})", status_code=400)
    return page(request, "actors.html", a=errors_actors.actors(state_of(request), window), window=window,
                windows=errors_actors.ACTOR_WINDOWS)


def app_page(request: Request) -> Response:
    found = gather.app_page(state_of(request), request.path_params["slug"])
    if found is None:
        return HTMLResponse("no such page", status_code=404)
    return page(request, "app_page.html", **found)


# --- actions (POST, JSON in and out) -------------------------------------------------------


class NotJson(ValueError):
    pass


async def _body(request: Request) -> dict[str, Any]:
    """The JSON object an action sends. Only ``application/json`` is accepted: a form on
    another site cannot send that type without a CORS preflight, which is never granted,
    so even without a token a page elsewhere cannot drive these actions."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise NotJson("actions take a JSON body (Content-Type: application/json)")
    try:
        body = await request.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


async def change_jobs(request: Request) -> Response:
    action = request.path_params["action"]
    if action not in actions.CHANGES:
        return error(404, f"no job action {action!r} (retry, cancel)")
    try:
        body = await _body(request)
        where = gather.form_filter(body.get("filter") or {}) if body.get("all") else None
        ids = [str(i) for i in body.get("ids") or []]
        if where is None and not ids:
            return error(400, "select jobs, or all matching the filter")
        result = await _run(actions.change_jobs, state_of(request), action, ids, where)
        note(request, job_ids=result["changed"], filter=gather.form_fields(where) if where else None,
             outcome=result["message"])
    except NotJson as exc:
        return error(415, str(exc))
    except ValueError as exc:
        return error(400, str(exc))
    _changed(request)
    return Json(result)


async def change_error_group(request: Request) -> Response:
    action = request.path_params["action"]
    if action not in ("retry", "cancel"):
        return error(404, f"no error group action {action!r} (retry, cancel)")
    try:
        body = await _body(request)
        result = await _run(errors_actors.change_group, state_of(request), action, body)
    except NotJson as exc:
        return error(415, str(exc))
    except ValueError as exc:
        return error(400, str(exc))
    note(request, job_ids=result.get("changed") or [], filter=body, outcome=result.get("message"))
    _changed(request)
    return Json(result)


async def pause(request: Request) -> Response:
    queue, verb = request.path_params["queue"], request.path_params["verb"]
    if verb not in ("pause", "resume"):
        return error(404, f"no queue action {verb!r} (pause, resume)")
    try:
        await _body(request)
    except NotJson as exc:
        return error(415, str(exc))
    result = await _run(actions.set_paused, state_of(request), queue, verb == "pause")
    note(request, outcome=result["message"])
    _changed(request)
    return Json(result)


async def run_schedule(request: Request) -> Response:
    try:
        await _body(request)
    except NotJson as exc:
        return error(415, str(exc))
    result = await _run(actions.run_schedule_now, state_of(request), request.path_params["name"])
    note(request, job_ids=[result["job_id"]] if result.get("job_id") else [], outcome=result["message"])
    _changed(request)
    return Json(result, status_code=200 if result["ok"] else 409)


async def scale(request: Request) -> Response:
    try:
        body = await _body(request)
    except NotJson as exc:
        return error(415, str(exc))
    processes = body.get("processes")
    if isinstance(processes, bool) or not isinstance(processes, int):
        return error(400, "processes must be a whole number")
    result = await _run(actions.scale, state_of(request), request.path_params["role"], processes)
    note(request, detail={"processes": processes}, outcome=result["message"])
    _changed(request)
    return Json(result, status_code=200 if result["ok"] else 409)


async def change_limit(request: Request) -> Response:
    """The Limits page's form (set a key's override) and its Clear buttons: JSON
    ``{key, rate, burst, daily_quota, concurrency}`` (empty: not given; "none" lifts)."""
    verb = request.path_params["verb"]
    if verb not in ("set", "clear"):
        return error(404, f"no limit action {verb!r} (set, clear)")
    try:
        body = await _body(request)
        key = flow_limits.check_key(body.pop("key", None))
        by = api_limits.who(request)
        if verb == "set":
            override = flow_limits.parse(body)
            row = await _run(actions.set_limit, state_of(request), key, override, by)
            message = f"limit {key}: override set ({flow_limits.override_text(row['override'])})"
            note(request, target=f"limit {key}", detail={"override": row["override"], "previous": row["previous"]},
                 outcome=message)
        else:
            previous = await _run(actions.clear_limit, state_of(request), key, by)
            message = f"limit {key}: override cleared" if previous is not None else f"limit {key} had no override"
            note(request, target=f"limit {key}", detail={"previous": previous}, outcome=message)
    except NotJson as exc:
        return error(415, str(exc))
    except ValueError as exc:
        return error(400, str(exc))
    _changed(request)
    return Json({"ok": True, "message": message})


async def _run(fn: Any, *args: Any) -> Any:
    return await run_in_threadpool(fn, *args)


def _changed(request: Request) -> None:
    recorder = getattr(request.app.state, "dashboard_recorder", None)
    if recorder is not None:
        recorder.bump()


# --- live updates ------------------------------------------------------------------------


async def events(request: Request) -> Response:
    """``event: change`` when the recorder saw a NOTIFY or took a sample, at most once
    per DEBOUNCE_SECONDS; the page refetches itself. Pages close the stream while hidden."""
    recorder = getattr(request.app.state, "dashboard_recorder", None)
    seen = request.headers.get("last-event-id")

    async def stream() -> AsyncIterator[str]:
        yield "retry: 1000\n\n"
        nonlocal seen
        ends = time.monotonic() + STREAM_SECONDS
        last_sent = 0.0
        while time.monotonic() < ends:
            version = str(recorder.version) if recorder is not None else "0"
            now = time.monotonic()
            if version != seen and now - last_sent >= DEBOUNCE_SECONDS:
                if seen is not None:
                    yield f"id: {version}\nevent: change\ndata: {version}\n\n"
                else:
                    yield f"id: {version}\n\n"  # first connection: remember where we start
                seen, last_sent = version, now
            await asyncio.sleep(WATCH_INTERVAL)

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


_GET = [("/", overview), ("/queues", queues), ("/jobs", jobs), ("/jobs/{job_id}", job), ("/workers", workers),
        ("/schedules", schedules), ("/limits", limits), ("/apps/{slug}", app_page), ("/events", events),
        ("/errors", errors), ("/actors", actors)]
_POST = [("/ui/jobs/{action:str}", change_jobs), ("/ui/queues/{queue:str}/{verb:str}", pause),
         ("/ui/errors/{action:str}", change_error_group),
         ("/ui/schedules/{name:str}/run", run_schedule), ("/ui/roles/{role:str}/scale", scale),
         ("/ui/limits/{verb:str}", change_limit)]

routes: list[BaseRoute] = [
    *(Route(path, fn, methods=["GET"], include_in_schema=False) for path, fn in _GET),
    *(Route(path, fn, methods=["POST"], include_in_schema=False) for path, fn in _POST),
    Mount("/static", app=StaticFiles(packages=[("supervisor.http.dashboard", "static")]), name="dashboard-static"),
]
