"""`/api/v1/errors` (failed attempts grouped, and actions on a group) and
`/api/v1/actors` (figures per actor): the JSON of the Errors and Actors pages.

Mounted beside ``api.routes`` with the same error handling (400 for bad input, 503
when the database is away); the POSTs pass the action guard like every action.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.routing import Route

from .. import actor_stats, error_groups
from .api import BadRequest, handles_errors, json_body, limit_param
from .auth import note
from .render import Json
from .state import state_of


def _params(request: Request, known: tuple[str, ...]) -> dict[str, str]:
    params = dict(request.query_params)
    unknown = set(params) - set(known)
    if unknown:
        raise BadRequest(f"unknown parameter(s) {', '.join(sorted(unknown))} (known: {', '.join(known)})")
    return params


def _window(value: Any, default: str) -> float:
    try:
        return error_groups.parse_window(None if value in (None, "") else str(value), default)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None


@handles_errors
def errors(request: Request) -> Json:
    """
    ---
    summary: "Failed attempts (retried or failed for good) of the last `since` grouped by actor,
      exception type and where (the innermost frame of the actor's own code, file:function): per group
      attempts, retried, failed, first_seen (earliest kept), first_in_window, last_seen, buckets
      ([start, attempts] oldest first) and a sample (job_id, message, traceback, reason). complete and
      exact are false when the window held more than 100,000 failed attempts: then the newest ones from
      covered_since are counted (estimated_by says so)"
    parameters:
      - {name: since, in: query, description: "a duration up to 30d (default 24h)", schema: {type: string}}
      - {name: actor, in: query, schema: {type: string}}
      - {name: limit, in: query, description: groups (most attempts first), schema: {type: integer, maximum: 500}}
    responses:
      200: {description: "{window_s, since, complete, exact, estimated_by, covered_since, attempts, groups_total,
        groups: [...]}"}
      400: {description: a bad parameter}
    """
    params = _params(request, ("since", "actor", "limit"))
    window_s = _window(params.get("since"), error_groups.DEFAULT_WINDOW)
    limit = limit_param(params.get("limit"), error_groups.DEFAULT_GROUPS, error_groups.MAX_GROUPS)
    with state_of(request).reading() as conn:
        found = error_groups.error_groups(conn, window_s=window_s, actor=params.get("actor") or None, limit=limit)
    return Json(found)


def _group_action(action: str) -> Callable[[Request], Any]:
    @handles_errors
    async def act(request: Request) -> Json:
        body = await json_body(request)
        unknown = set(body) - {"actor", "error_type", "where", "since"}
        if unknown:
            raise BadRequest(f"unknown field(s) {', '.join(sorted(unknown))} (known: actor, error_type, where, since)")
        for name in ("actor", "error_type"):
            if not isinstance(body.get(name), str) or not body[name]:
                raise BadRequest(f"{name}: required, the group's (as GET /api/v1/errors lists it)")
        if not isinstance(body.get("where", ""), str):
            raise BadRequest("where: a text (the group's; '' when it has no frame)")
        key = error_groups.GroupKey(body["actor"], body["error_type"], body.get("where", ""))
        window_s = _window(body.get("since"), error_groups.DEFAULT_WINDOW)
        state = state_of(request)

        def run() -> dict[str, Any]:
            with state.connection() as conn:
                return error_groups.change_group(conn, action, key, window_s=window_s)

        result = await run_in_threadpool(run)
        note(request, job_ids=result["ids"], filter={k: v for k, v in body.items()})
        return Json(result)
    return act


retry_group = _group_action("retry")
retry_group.__doc__ = """
    ---
    summary: "Retry every job of a group (JSON body: actor, error_type, where, since) that failed for
      good: those whose latest failed attempt in the window is of the group"
    responses:
      200: {description: "{action, matched, changed, ids}"}
      400: {description: a bad body}
    """
cancel_group = _group_action("cancel")
cancel_group.__doc__ = """
    ---
    summary: "Cancel every job of a group (JSON body: actor, error_type, where, since) waiting for its
      retry (retryable, or pending after a lost lease)"
    responses:
      200: {description: "{action, matched, changed, ids}"}
      400: {description: a bad body}
    """


@handles_errors
def actors(request: Request) -> Json:
    """
    ---
    summary: "Per actor over the last `since` (default 1h): finished, failed, per_minute, failure_rate,
      busy_s (time spent), run_p50_s / p95 / p99 and wait_p50_s / p95 / p99 (from due to running), in_flight,
      retries; most time spent first. complete and exact are false when more than 100,000 jobs finished in
      the window: then the newest ones from covered_since are counted (estimated_by says so)"
    parameters:
      - {name: since, in: query, description: "a duration up to 30d (default 1h)", schema: {type: string}}
    responses:
      200: {description: "{window_s, complete, exact, estimated_by, covered_since, actors: [...]}"}
      400: {description: a bad parameter}
    """
    params = _params(request, ("since",))
    window_s = _window(params.get("since"), actor_stats.DEFAULT_WINDOW)
    with state_of(request).reading() as conn:
        return Json(actor_stats.actor_stats(conn, window_s=window_s))


routes = [
    Route("/errors", errors, methods=["GET"]),
    Route("/errors/retry", retry_group, methods=["POST"]),
    Route("/errors/cancel", cancel_group, methods=["POST"]),
    Route("/actors", actors, methods=["GET"]),
]
