"""The Audit page: every action taken over HTTP (done or refused), newest first,
filtered by token and action in its URL."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Route

from ... import audit
from .. import roles
from ..state import state_of
from .render import page

PAGE_SIZE = 50


def audit_page(request: Request) -> Response:
    q = request.query_params
    token, action = q.get("token") or None, q.get("action") or None
    try:
        before = int(q["cursor"]) if q.get("cursor") else None
    except ValueError:
        return HTMLResponse("bad cursor: follow the page's Older link", status_code=400)
    with state_of(request).reading() as conn:
        rows = audit.recent(conn, token_name=token, action=action, before_id=before, limit=PAGE_SIZE + 1)
    more = len(rows) > PAGE_SIZE
    rows = rows[:PAGE_SIZE]
    kept = {k: v for k, v in (("token", token), ("action", action)) if v}
    return page(request, "audit.html", entries=rows, token=token, action=action, kept=kept,
                action_names=sorted(roles.NEEDS), next=str(rows[-1]["id"]) if more else None)


routes: list[BaseRoute] = [Route("/audit", audit_page, methods=["GET"], include_in_schema=False)]
