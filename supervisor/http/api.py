"""`/api/v1/...`: the operations as JSON, described by `/api/v1/openapi.json`.

Each endpoint's docstring carries its OpenAPI fragment after ``---`` (Starlette's
SchemaGenerator reads it). Handlers parse the request, call ``data`` or
``supervisor.admin``, and render; nothing else. Actions (POST) pass the
``auth.ActionGuard`` before they get here.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

import psycopg
from dramatiq.errors import BrokerConnectionError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.routing import Route
from starlette.schemas import SchemaGenerator

from .. import admin, jobsearch
from . import data, new_job
from .auth import note
from .render import Json, error
from .state import state_of

schemas = SchemaGenerator({"openapi": "3.0.0", "info": {"title": "actor-supervisor", "version": "1"}})

MAX_PAGE = 500
DEFAULT_PAGE = 50
MAX_BULK = 10_000
# The job filter's own fields, then the search's: one name each, as the query takes them.
FILTER_KEYS = (*(f.name for f in dataclasses.fields(admin.JobFilter) if f.name != "search"), *jobsearch.NAMES)


class BadRequest(ValueError):
    pass


# --- parsing --------------------------------------------------------------------------------


def _time(name: str, value: Any) -> datetime | None:
    if value in (None, ""):
        return None
    try:
        when = datetime.fromisoformat(str(value))
    except ValueError:
        raise BadRequest(f"{name}: expected an ISO 8601 time like 2026-01-31T12:00:00Z, got {value!r}") from None
    if when.tzinfo is None:
        raise BadRequest(f"{name}: give a time zone (for example Z or +02:00), got {value!r}")
    return when


def _filter(source: dict[str, Any]) -> admin.JobFilter:
    unknown = set(source) - set(FILTER_KEYS) - {"limit", "cursor"}
    if unknown:
        raise BadRequest(f"unknown filter(s) {', '.join(sorted(unknown))} (known: {', '.join(FILTER_KEYS)})")
    try:
        status = admin.job_status(source.get("status"))
    except ValueError as exc:
        raise BadRequest(f"status: {exc}") from None
    try:
        search = jobsearch.Search.parse(source)
    except jobsearch.SearchError as exc:
        raise BadRequest(str(exc)) from None
    return admin.JobFilter(
        status=status, queue=source.get("queue") or None, actor=source.get("actor") or None,
        text=source.get("text") or None, search=search,
        **{k: _time(k, source.get(k)) for k in FILTER_KEYS if k.endswith(("_after", "_before"))},
    )


def _limit(value: Any, default: int, maximum: int) -> int:
    if value in (None, ""):
        return default
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise BadRequest(f"limit: expected a whole number, got {value!r}") from None
    if not 1 <= n <= maximum:
        raise BadRequest(f"limit: must be from 1 to {maximum}, got {n}")
    return n


def _job_id(request: Request) -> str:
    try:
        return str(uuid.UUID(request.path_params["job_id"]))
    except ValueError:
        raise BadRequest(f"{request.path_params['job_id']!r} is not a job id (a UUID)") from None


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError:
        raise BadRequest("the body must be a JSON object") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def _handles_errors(fn: Callable[[Request], Any]) -> Callable[[Request], Any]:
    """400 for bad input, 503 when the database is away: always a JSON error."""
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def run_async(request: Request) -> Any:
            try:
                return await fn(request)
            except BadRequest as exc:
                return error(400, str(exc))
            except (psycopg.Error, TimeoutError) as exc:
                return error(503, f"database unavailable: {exc}")
        return run_async

    @functools.wraps(fn)
    def run(request: Request) -> Any:
        try:
            return fn(request)
        except BadRequest as exc:
            return error(400, str(exc))
        except (psycopg.Error, TimeoutError) as exc:
            return error(503, f"database unavailable: {exc}")
    return run


# For the routes other modules add under /api/v1 (api_actors.py).
handles_errors, limit_param, json_body = _handles_errors, _limit, _body


# --- reads ------------------------------------------------------------------------------------


@_handles_errors
def queues(request: Request) -> Json:
    """
    ---
    summary: Every queue with its counts, pause and capacity plan (v_queue_capacity), and the start waits
      of the last hour's jobs (wait_p50_s, wait_p95_s, wait_p99_s)
    responses:
      200: {description: "{queues: [...]}"}
    """
    with state_of(request).reading() as conn:
        return Json({"queues": admin.queue_capacity(conn)})


@_handles_errors
def jobs(request: Request) -> Json:
    """
    ---
    summary: "Jobs, newest first, filtered; page with next_cursor (keyset paging). A filter by queue, actor,
      text, key or match reads the newest 100,000 jobs per page: `scan` says where it stopped, and
      next_cursor goes on from there. The first page (no cursor) has the count of the jobs that match:
      {count, exact, estimated_by} (exact up to 10,000; past it the planner's estimate; a search's: the
      matches in its window, counted_to when older jobs were left uncounted)"
    parameters:
      - {name: status, in: query, schema: {type: string}}
      - {name: queue, in: query, schema: {type: string}}
      - {name: actor, in: query, schema: {type: string}}
      - {name: text, in: query, description: substring of the JSON arguments, schema: {type: string}}
      - {name: id, in: query, description: a job id or the start of one (hex digits), schema: {type: string}}
      - {name: dedupe_key, in: query, schema: {type: string}}
      - {name: concurrency_key, in: query, schema: {type: string}}
      - {name: match, in: query, description: "a value inside the arguments: kwargs.user_id = 7, args[0] = 42",
         schema: {type: string}}
      - {name: created_after, in: query, schema: {type: string, format: date-time}}
      - {name: created_before, in: query, schema: {type: string, format: date-time}}
      - {name: finished_after, in: query, schema: {type: string, format: date-time}}
      - {name: finished_before, in: query, schema: {type: string, format: date-time}}
      - {name: limit, in: query, schema: {type: integer, maximum: 500}}
      - {name: cursor, in: query, schema: {type: string}}
    responses:
      200: {description: "{jobs: [...], next_cursor, count: {count, exact, estimated_by}, scan}"}
      400: {description: a bad filter}
    """
    params = dict(request.query_params)
    where = _filter(params)
    limit = _limit(params.get("limit"), DEFAULT_PAGE, MAX_PAGE)
    try:
        page = data.jobs_page(state_of(request), where, limit=limit, cursor=params.get("cursor"))
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    return Json(page)


@_handles_errors
def job(request: Request) -> Json:
    """
    ---
    summary: One job with args, attempts, timeline of events, progress, result and last error
    responses:
      200: {description: the job}
      404: {description: no such job}
    """
    job_id = _job_id(request)
    found = data.job_detail(state_of(request), job_id)
    return Json(found) if found is not None else error(404, f"no job {job_id}")


@_handles_errors
def workers(request: Request) -> Json:
    """
    ---
    summary: The workers registry (host, pid, role, state, RSS, CPU, in flight / capacity, paused why)
    responses:
      200: {description: "{workers: [...]}"}
    """
    return Json({"workers": data.workers(state_of(request))})


@_handles_errors
def schedules(request: Request) -> Json:
    """
    ---
    summary: Schedules with cron, time zone, catch_up, last and next fire (UTC and the zone's), the next 3, and recent runs
    responses:
      200: {description: "{schedules: [...]}"}
    """
    return Json({"schedules": data.schedules(state_of(request))})


def system_state(request: Request) -> Json:
    """
    ---
    summary: "The master (when local), the database, job counts by status ({status: {count, exact,
      estimated_by}}: exact up to 10,000, past it the planner's estimate), paused queues, the apps in use"
    responses:
      200: {description: the state}
    """
    return Json(data.system_state(state_of(request)))


# --- actions ------------------------------------------------------------------------------------


def _one_job_action(change: Callable[[psycopg.Connection, str], bool], to: str,
                    allowed: str) -> Callable[[Request], Any]:
    @_handles_errors
    def action(request: Request) -> Json:
        job_id = _job_id(request)
        with state_of(request).reading() as conn:
            if change(conn, job_id):
                note(request, job_ids=[job_id])
                return Json({"id": job_id, "status": to})
            exists = admin.show_job(conn, job_id) is not None
        return error(409, f"job {job_id} is not {allowed}") if exists else error(404, f"no job {job_id}")
    return action


def _bulk_action(change: Callable[[psycopg.Connection, str], bool], to: str) -> Callable[[Request], Any]:
    @_handles_errors
    async def action(request: Request) -> Json:
        body = await _body(request)
        where = _filter({k: v for k, v in body.items() if k != "limit"})
        if where.empty:
            raise BadRequest(f"give at least one filter ({', '.join(FILTER_KEYS)}); nothing was changed")
        limit = _limit(body.get("limit"), MAX_BULK, MAX_BULK)
        state = state_of(request)

        def run() -> tuple[list[str], int]:
            with state.connection() as conn:
                return admin.change_matching(conn, where, change, limit=limit)

        changed, matched = await run_in_threadpool(run)
        note(request, job_ids=changed, filter={k: v for k, v in body.items() if k != "limit"})
        return Json({"status": to, "matched": matched, "changed": len(changed), "ids": changed})
    return action


retry_job = _one_job_action(admin.retry_job, "pending", "failed or cancelled")
retry_job.__doc__ = """
    ---
    summary: Put a failed or cancelled job back to pending
    responses:
      200: {description: retried}
      404: {description: no such job}
      409: {description: the job is not failed or cancelled}
    """
cancel_job = _one_job_action(admin.cancel_job, "cancelled", "cancellable (pending or retryable)")
cancel_job.__doc__ = """
    ---
    summary: Cancel a job
    responses:
      200: {description: cancelled}
      404: {description: no such job}
      409: {description: the job cannot be cancelled}
    """
retry_jobs = _bulk_action(admin.retry_job, "pending")
retry_jobs.__doc__ = """
    ---
    summary: Retry every failed or cancelled job matching a filter (JSON body, same keys as GET jobs)
    responses:
      200: {description: "{matched, changed, ids}"}
      400: {description: no filter, or a bad one}
    """
cancel_jobs = _bulk_action(admin.cancel_job, "cancelled")
cancel_jobs.__doc__ = """
    ---
    summary: Cancel every cancellable job matching a filter (JSON body, same keys as GET jobs)
    responses:
      200: {description: "{matched, changed, ids}"}
      400: {description: no filter, or a bad one}
    """


@_handles_errors
async def pause_queue(request: Request) -> Json:
    """
    ---
    summary: Pause a queue (no new claims; running jobs finish); body may give a reason
    responses:
      200: {description: the pause}
    """
    body = await _body(request)
    queue = request.path_params["queue"]
    reason = body.get("reason")
    who = f"http {request.client.host if request.client else '?'}"
    note(request, detail={"reason": reason} if reason else None)
    state = state_of(request)

    def run() -> dict[str, Any]:
        with state.connection() as conn:
            admin.pause_queue(conn, queue, str(reason) if reason else None, who=who)  # twice keeps the first
            return next(p for p in admin.paused_queues(conn) if p["queue"] == queue)

    return Json({"paused": await run_in_threadpool(run)})


@_handles_errors
def resume_queue(request: Request) -> Json:
    """
    ---
    summary: Resume a paused queue
    responses:
      200: {description: "{queue, resumed}: resumed is false if it was not paused"}
    """
    queue = request.path_params["queue"]
    with state_of(request).connection() as conn:
        return Json({"queue": queue, "resumed": admin.resume_queue(conn, queue)})


@_handles_errors
async def create_job(request: Request) -> Json:
    """
    ---
    summary: "Send a job: {actor, queue, args, kwargs, options: {delay (ms), priority, dedupe_key,
      concurrency_key, max_retries}}"
    responses:
      201: {description: "{id, deduplicated: false}"}
      200: {description: "a live job had the dedupe key: {id: that job's id, deduplicated: true}"}
      400: {description: one bad field, named}
    """
    try:
        job = new_job.parse(await _body(request))
    except new_job.InvalidJob as exc:
        raise BadRequest(str(exc)) from None
    producer = state_of(request).producer()
    try:
        sent = await run_in_threadpool(producer.enqueue, job.message, delay=job.delay_ms or None)
    except BrokerConnectionError as exc:
        return error(503, str(exc))
    hit = sent.message_id != job.message.message_id
    note(request, job_ids=[] if hit else [sent.message_id], target=f"actor {job.message.actor_name}")
    return Json({"id": sent.message_id, "deduplicated": hit, "queue": job.message.queue_name,
                 "actor": job.message.actor_name}, status_code=200 if hit else 201)


def openapi(request: Request) -> Json:
    return Json(schemas.get_schema(routes=request.app.routes))


routes = [
    Route("/queues", queues, methods=["GET"]),
    Route("/queues/{queue}/pause", pause_queue, methods=["POST"]),
    Route("/queues/{queue}/resume", resume_queue, methods=["POST"]),
    Route("/jobs", jobs, methods=["GET"]),
    Route("/jobs", create_job, methods=["POST"]),
    Route("/jobs/retry", retry_jobs, methods=["POST"]),
    Route("/jobs/cancel", cancel_jobs, methods=["POST"]),
    Route("/jobs/{job_id}", job, methods=["GET"]),
    Route("/jobs/{job_id}/retry", retry_job, methods=["POST"]),
    Route("/jobs/{job_id}/cancel", cancel_job, methods=["POST"]),
    Route("/workers", workers, methods=["GET"]),
    Route("/schedules", schedules, methods=["GET"]),
    Route("/system/state", system_state, methods=["GET"]),
    Route("/openapi.json", openapi, methods=["GET"], include_in_schema=False),
]
