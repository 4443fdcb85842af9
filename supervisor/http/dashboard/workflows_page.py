"""The Workflows pages: a page of workflows (newest first, by state) and one workflow's
graph (``workflow_graph``), live as every page is (the event stream refetches ``<main>``),
with cancel and retry of the workflow and of a step and its descendants (``workflow_ops``,
as `supervisor workflows cancel|retry` does them).

Every read is bounded: a page of the list; a workflow's row, at most ``GRAPH_STEPS`` of its
steps (the graph draws a bounded part of them), and one probe per drawn enqueued step of
whether its job runs now.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Route

from ... import db, workflow_ops
from ...broker.sql import workflows as sql
from ..auth import note
from ..render import Json, error
from ..state import AppState, state_of
from . import views, workflow_graph
from .render import page

PAGE_SIZE = 50
# Past this many steps the graph is not drawn (the counts still are): reading a workflow's
# every step costs its size, and the page stays a bounded read.
GRAPH_STEPS = 20_000
ATTENTION = 50  # steps listed under the graph, with their actions
# The order steps are listed in under the graph: what needs a person first.
_URGENCY = {"failed": 0, "cancelled": 1, "running": 2, "enqueued": 3, "blocked": 4, "succeeded": 5}


def _cursor(text: str | None) -> tuple[datetime, str] | None:
    """The list's cursor: the created_at and id of the last row of the page before (the
    API's next_before has the same form)."""
    if not text:
        return None
    at, _, wid = text.rpartition("/")
    return datetime.fromisoformat(at), str(workflow_ops.check_id(wid))


def listing(request: Request) -> Response:
    q = request.query_params
    wanted = q.get("state") or None
    try:
        before = _cursor(q.get("cursor"))
        with state_of(request).reading() as conn:
            rows = workflow_ops.list_workflows(conn, state=wanted, limit=PAGE_SIZE + 1, before=before)
    except ValueError as exc:  # WorkflowError too: an unknown state, a cursor not ours
        return HTMLResponse(f"bad filter: {exc}", status_code=400)
    more = len(rows) > PAGE_SIZE
    rows = rows[:PAGE_SIZE]
    after = f"{rows[-1]['created_at'].isoformat()}/{rows[-1]['id']}" if more else None
    return page(request, "workflows.html", workflows=rows, state=wanted, states=workflow_ops.STATES,
                kept={"state": wanted} if wanted else {}, next=after)


def gather(conn: Any, wid: str) -> dict[str, Any] | None:
    """The workflow's row, its graph and the steps listed under it."""
    found = db.dicts(conn, sql.GET, {"id": wid})
    if not found:
        return None
    wf = found[0]
    steps = db.dicts(conn, sql.GRAPH, {"id": wid, "limit": GRAPH_STEPS + 1})
    wf["graph"] = None
    if len(steps) <= GRAPH_STEPS:
        for s in steps:
            # blocked steps never had a job (nor did one cancelled while blocked)
            s["linked"] = s.pop("enqueued_at") is not None or s["state"] in ("enqueued", "succeeded", "failed")
        graph = workflow_graph.layout(steps)
        drawn = {n.key for n in graph.nodes if not n.counts}
        waiting = [s["id"] for s in steps if s["state"] == "enqueued" and s["id"] in drawn]
        running = {r[0] for r in conn.execute(sql.RUNNING, {"ids": waiting})} if waiting else set()
        for s in steps:
            if s["id"] in running:
                s["state"] = "running"
        for n in graph.nodes:  # (a summary box's enqueued steps are waiting or running: not probed)
            if n.key in running:
                n.state = "running"
        wf["graph"] = graph
        wf["svg"] = workflow_graph.svg(graph, f"the steps of workflow {wf['name']} as a graph, parents to children")
    listed = sorted((s for s in steps[:GRAPH_STEPS] if s["state"] != "succeeded"),
                    key=lambda s: (_URGENCY.get(s["state"], 9), s["position"]))
    wf["attention"] = listed[:ATTENTION]
    wf["attention_more"] = max(0, len(listed) - ATTENTION)
    return wf


def workflow(request: Request) -> Response:
    wid = request.path_params["workflow_id"]
    try:
        workflow_ops.check_id(wid)
    except workflow_ops.WorkflowError as exc:
        return HTMLResponse(str(exc), status_code=404)
    with state_of(request).reading() as conn:
        found = gather(conn, wid)
    if found is None:
        return HTMLResponse(f"no workflow {wid}", status_code=404)
    return page(request, "workflow.html", wf=found, states=workflow_graph.STATES, graph_steps=GRAPH_STEPS)


def _change(state: AppState, wid: str, verb: str, step: str | None) -> dict[str, Any]:
    with state.connection() as conn:
        if verb == "cancel":
            done = workflow_ops.cancel(conn, wid, step=step)
            what = f"{done['cancelled']} step(s) cancelled"
            if done["interrupted"]:
                what += f", {done['interrupted']} running one(s) interrupted"
        else:
            done = workflow_ops.retry(conn, wid, step=step)
            what = f"{done['retried']} step(s) retried, {done['released']} enqueued now"
    return {"ok": True, "message": f"workflow {wid}{f' step {step}' if step else ''}: {what}"}


async def _body(request: Request) -> dict[str, Any]:
    """The action's JSON object; only ``application/json``, as every dashboard action takes
    (views._body says why: no form on another site can send it)."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise views.NotJson("actions take a JSON body (Content-Type: application/json)")
    try:
        body = await request.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


async def change(request: Request) -> Response:
    """Cancel or retry a workflow, or (``{"step": id}``) one step and its descendants."""
    wid, verb = request.path_params["workflow_id"], request.path_params["verb"]
    if verb not in ("cancel", "retry"):
        return error(404, f"no workflow action {verb!r} (cancel, retry)")
    try:
        body = await _body(request)
        step = body.get("step") or None
        result = await run_in_threadpool(_change, state_of(request), wid, verb, None if step is None else str(step))
    except views.NotJson as exc:
        return error(415, str(exc))
    except workflow_ops.WorkflowError as exc:
        note(request, target=f"workflow {wid}", outcome=str(exc))
        return Json({"ok": False, "message": str(exc)}, status_code=409)
    note(request, target=f"workflow {wid}", detail={"step": step} if step else None, outcome=result["message"])
    recorder = getattr(request.app.state, "dashboard_recorder", None)
    if recorder is not None:  # open pages refresh now, not at the next sample
        recorder.bump()
    return Json(result)


routes: list[BaseRoute] = [
    Route("/workflows", listing, methods=["GET"], include_in_schema=False),
    Route("/workflows/{workflow_id}", workflow, methods=["GET"], include_in_schema=False),
    Route("/ui/workflows/{workflow_id}/{verb:str}", change, methods=["POST"], include_in_schema=False),
]
