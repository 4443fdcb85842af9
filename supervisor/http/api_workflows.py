"""`/api/v1/workflows`: durable workflows (migration 049), a page of them by state, and one
with its steps. Mounted beside ``api.routes`` with the same error handling (400 with one
line for a bad value, 503 when the database is away)."""

from __future__ import annotations

from datetime import datetime

from starlette.requests import Request
from starlette.routing import Route

from .. import workflow_ops
from .api import BadRequest, handles_errors, limit_param
from .render import Json, error
from .state import state_of

MAX_LIMIT = 500


def _cursor(text: str | None) -> tuple[datetime, str] | None:
    if not text:
        return None
    at, _, wid = text.rpartition("/")
    try:
        return datetime.fromisoformat(at), str(workflow_ops.check_id(wid))
    except (ValueError, workflow_ops.WorkflowError):
        raise BadRequest(f"before takes CREATED_AT/ID (the next_before of a page), not {text!r}") from None


@handles_errors
def list_workflows(request: Request) -> Json:
    """
    ---
    summary: "Workflows, newest first: name, policy, state, step counts per state, reason, times.
      Filter by state; page with before (the previous page's next_before)"
    parameters:
      - {name: state, in: query, schema: {type: string, enum: [running, succeeded, failed, cancelled]}}
      - {name: limit, in: query, schema: {type: integer, maximum: 500}}
      - {name: before, in: query, schema: {type: string}}
    responses:
      200: {description: "{workflows: [...], next_before}"}
    """
    params = dict(request.query_params)
    unknown = set(params) - {"state", "limit", "before"}
    if unknown:
        raise BadRequest(f"unknown parameter(s) {', '.join(sorted(unknown))} (known: before, limit, state)")
    limit = limit_param(params.get("limit"), 50, MAX_LIMIT)
    with state_of(request).reading() as conn:
        try:
            found = workflow_ops.list_workflows(conn, state=params.get("state") or None, limit=limit,
                                                before=_cursor(params.get("before")))
        except workflow_ops.WorkflowError as exc:
            raise BadRequest(str(exc)) from None
    last = found[-1] if len(found) == limit else None
    return Json({"workflows": found,
                 "next_before": f"{last['created_at'].isoformat()}/{last['id']}" if last else None})


@handles_errors
def workflow(request: Request) -> Json:
    """
    ---
    summary: One workflow with its steps (in the order added) - state, parents, children, job id, enqueued and
      finished times, result, reason
    responses:
      200: {description: the workflow}
      404: {description: no such workflow}
    """
    wid = request.path_params["workflow_id"]
    with state_of(request).reading() as conn:
        try:
            found = workflow_ops.show(conn, wid)
        except workflow_ops.WorkflowError as exc:
            raise BadRequest(str(exc)) from None
    return Json(found) if found is not None else error(404, f"no workflow {wid}")


routes = [
    Route("/workflows", list_workflows, methods=["GET"]),
    Route("/workflows/{workflow_id}", workflow, methods=["GET"]),
]
