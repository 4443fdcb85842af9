"""`/api/v1/limits`: every limit key as the claim sees it (GET), and an operator's override
of one key's limits (PUT sets it, DELETE clears it), the JSON of the Limits page.

Mounted beside ``api.routes`` with the same error handling (400 with one line for a bad
value, 503 when the database is away); PUT and DELETE pass the action guard (a token of
role operator or admin when tokens are configured) and are written to the audit log with
the override set and the one it replaced.
"""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.routing import Route

from .. import limits
from .api import BadRequest, handles_errors, json_body, limit_param
from .auth import AUDIT_KEY, note
from .render import Json
from .state import state_of


def who(request: Request) -> str:
    """Who changes a limit, for the bucket's ``override_by``: the token's name, else the client."""
    entry = request.scope.get("state", {}).get(AUDIT_KEY)
    if entry is not None and entry.token_name:
        return f"token {entry.token_name}"
    return f"http {request.client.host if request.client else '?'}"


def _key(request: Request) -> str:
    try:
        return limits.check_key(request.path_params["key"])
    except limits.LimitValueError as exc:
        raise BadRequest(str(exc)) from None


@handles_errors
def list_limits(request: Request) -> Json:
    """
    ---
    summary: "Every limit key in use (jobs waiting on it or running under it, or a bucket), as the next claim
      sees it: rate, burst, tokens now, quota and quota_used today, blocked_until, concurrency and running,
      waiting (counted up to 1,000 per queue: waiting_more says there are more), wait_s (how long the
      oldest due job has waited), allow (jobs it lets start now), opens_in_s and gated_by (blocked, quota,
      rate, concurrency) when it lets none, the operator's override. Keys in order, up to `limit`
      (default 500); next_after pages on"
    parameters:
      - {name: after, in: query, description: keys after this one (the previous page's next_after),
         schema: {type: string}}
      - {name: limit, in: query, schema: {type: integer, maximum: 500}}
    responses:
      200: {description: "{keys: [...], next_after}"}
    """
    params = dict(request.query_params)
    unknown = set(params) - {"after", "limit"}
    if unknown:
        raise BadRequest(f"unknown parameter(s) {', '.join(sorted(unknown))} (known: after, limit)")
    max_keys = limit_param(params.get("limit"), limits.MAX_KEYS, limits.MAX_KEYS)
    with state_of(request).reading() as conn:
        seen = limits.seen(conn, after=params.get("after") or "", max_keys=max_keys)
    return Json({"keys": [limits.as_json(k) for k in seen.keys], "next_after": seen.next_after})


@handles_errors
async def set_limit(request: Request) -> Json:
    """
    ---
    summary: "Override a key's limits at runtime, on every process and host from the next claim: a JSON
      object with any of rate (\\"10/s\\", \\"30/m burst 5\\"), burst, daily_quota, concurrency; null lifts
      that limit, a field not given keeps the jobs' own. Replaces the key's override, if it had one"
    responses:
      200: {description: "{key, override, previous, override_by, override_at}"}
      400: {description: a bad value, named in one line}
      401: {description: no token (tokens are configured)}
      403: {description: the token's role may not change limits, or the server is read-only}
    """
    key = _key(request)
    body = await json_body(request)
    try:
        override = limits.parse(body)
    except limits.LimitValueError as exc:
        raise BadRequest(str(exc)) from None
    state, by = state_of(request), who(request)

    def run() -> dict[str, Any]:
        with state.connection() as conn:
            return limits.set_override(conn, key, override, by)

    row = await run_in_threadpool(run)
    note(request, target=f"limit {key}", detail={"override": row["override"], "previous": row["previous"]})
    return Json(limits.as_json(row))


@handles_errors
def clear_limit(request: Request) -> Json:
    """
    ---
    summary: Clear a key's override (its jobs' own limits apply again from the next claim)
    responses:
      200: {description: "{key, cleared, previous}: cleared is false if it had none"}
      401: {description: no token (tokens are configured)}
      403: {description: the token's role may not change limits, or the server is read-only}
    """
    key = _key(request)
    with state_of(request).connection() as conn:
        previous = limits.clear_override(conn, key, who(request))
    note(request, target=f"limit {key}", detail={"previous": previous},
         outcome=None if previous is not None else "it had no override")
    return Json({"key": key, "cleared": previous is not None, "previous": previous})


routes = [
    Route("/limits", list_limits, methods=["GET"]),
    Route("/limits/{key:path}", set_limit, methods=["PUT"]),
    Route("/limits/{key:path}", clear_limit, methods=["DELETE"]),
]
