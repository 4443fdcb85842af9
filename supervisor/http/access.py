"""`GET /api/v1/whoami` (which token this is, its role, what it may do) and `GET
/api/v1/audit` (the audit log of actions, newest first)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.routing import Route

from .. import audit
from . import roles
from .auth import presented_token
from .render import Json, error
from .state import state_of

MAX_PAGE = 500
DEFAULT_PAGE = 50


def whoami(request: Request) -> Json:
    """
    ---
    summary: "The token sent (Authorization: Bearer, or X-Supervisor-Token): its name, its role, and for each
      action the role it needs and whether this token may do it; 401 for a token no one has"
    responses:
      200: {description: "{name, role, auth_required, read_only, actions: {jobs.retry: {needs, allowed}, ...}}"}
      401: {description: a token that is not one of the configured tokens}
    """
    http = state_of(request).http
    who = roles.identify(http, presented_token(request))
    if who is None:
        return error(401, "this token is not one of the configured tokens")
    actions = {name: {"needs": role, "allowed": who.may(role) and not http.read_only}
               for name, role in roles.NEEDS.items()}
    return Json({"name": who.name, "role": who.role, "auth_required": http.auth_required,
                 "read_only": http.read_only, "actions": actions})


def audit_log(request: Request) -> Json:
    """
    ---
    summary: The audit log of actions (done and refused), newest first; filter by token and action
    parameters:
      - {name: token, in: query, description: a token's name, schema: {type: string}}
      - {name: action, in: query, description: "jobs.retry, jobs.cancel, queues.pause, ...", schema: {type: string}}
      - {name: limit, in: query, schema: {type: integer, maximum: 500}}
      - {name: cursor, in: query, description: the previous page's next_cursor, schema: {type: string}}
    responses:
      200: {description: "{entries: [{id, at, token_name, role, action, target, filter, detail, affected, job_ids,
        status, outcome, client}], next_cursor}"}
      400: {description: a bad limit or cursor}
    """
    q = request.query_params
    try:
        limit = int(q.get("limit") or DEFAULT_PAGE)
        before = int(q["cursor"]) if q.get("cursor") else None
    except ValueError:
        return error(400, "limit and cursor are whole numbers (cursor: the previous page's next_cursor)")
    if not 1 <= limit <= MAX_PAGE:
        return error(400, f"limit: must be from 1 to {MAX_PAGE}, got {limit}")
    try:
        with state_of(request).connection() as conn:
            rows = audit.recent(conn, token_name=q.get("token") or None, action=q.get("action") or None,
                                before_id=before, limit=limit + 1)
    except Exception as exc:
        return error(503, f"database unavailable: {exc}")
    more = len(rows) > limit
    rows = rows[:limit]
    return Json({"entries": rows, "next_cursor": str(rows[-1]["id"]) if more else None})


routes = [
    Route("/whoami", whoami, methods=["GET"]),
    Route("/audit", audit_log, methods=["GET"]),
]
