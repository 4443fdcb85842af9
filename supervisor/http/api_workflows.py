"""`/api/v1/workflows`: durable workflows (migration 049), a page of them by state, one with
its steps, and the operator's cancel and retry of a workflow or of a step and its
descendants (POST: actions, behind ``auth.ActionGuard`` with the roles of ``roles.py``).
Mounted beside ``api.routes`` with the same error handling (400 with one line for a bad
value, 503 when the database is away)."""

from __future__ import annotations

from datetime import datetime

from starlette.requests import Request
from starlette.routing import Route

from .. import workflow_ops
from .api import BadRequest, handles_errors, limit_param
from .auth import note
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


def _change(request: Request, change: str) -> Json:
    """``workflow_ops.cancel`` or ``retry`` of the path's workflow (and step): its counts, or
    404 for a workflow or step that is not there, 400 for an id that is none, 409 for a
    change it cannot take (nothing ended to retry)."""
    wid = request.path_params["workflow_id"]
    step = request.path_params.get("step_id")
    fn = workflow_ops.cancel if change == "cancel" else workflow_ops.retry
    with state_of(request).connection() as conn:
        try:
            counts = fn(conn, wid, step=step)
        except workflow_ops.WorkflowError as exc:
            status = (404 if isinstance(exc, workflow_ops.NotFound) else 400 if isinstance(exc, workflow_ops.BadId)
                      else 409)
            return error(status, str(exc))
    note(request, detail={"step": step, **counts} if step else counts)
    return Json({"workflow": wid, "step": step, **counts})


@handles_errors
def cancel_workflow(request: Request) -> Json:
    """
    ---
    summary: "Cancel every step of a workflow not ended, with their jobs (running ones interrupted):
      {workflow, step, cancelled, interrupted}"
    responses:
      200: {description: cancelled}
      404: {description: no such workflow}
    """
    return _change(request, "cancel")


@handles_errors
def retry_workflow(request: Request) -> Json:
    """
    ---
    summary: "Run again a workflow's failed and cancelled steps and their descendants (succeeded steps keep
      their results): {workflow, step, retried, released}"
    responses:
      200: {description: retried}
      404: {description: no such workflow}
      409: {description: no failed or cancelled step to retry}
    """
    return _change(request, "retry")


@handles_errors
def cancel_step(request: Request) -> Json:
    """
    ---
    summary: "Cancel a step of a workflow and its descendants, with their jobs (running ones interrupted)"
    responses:
      200: {description: cancelled}
      404: {description: no such workflow, or no such step in it}
    """
    return _change(request, "cancel")


@handles_errors
def retry_step(request: Request) -> Json:
    """
    ---
    summary: "Run again a step of a workflow and its descendants (ended ones, even succeeded)"
    responses:
      200: {description: retried}
      404: {description: no such workflow, or no such step in it}
      409: {description: the step and its descendants have not ended}
    """
    return _change(request, "retry")


routes = [
    Route("/workflows", list_workflows, methods=["GET"]),
    Route("/workflows/{workflow_id}", workflow, methods=["GET"]),
    Route("/workflows/{workflow_id}/cancel", cancel_workflow, methods=["POST"]),
    Route("/workflows/{workflow_id}/retry", retry_workflow, methods=["POST"]),
    Route("/workflows/{workflow_id}/steps/{step_id}/cancel", cancel_step, methods=["POST"]),
    Route("/workflows/{workflow_id}/steps/{step_id}/retry", retry_step, methods=["POST"]),
]
