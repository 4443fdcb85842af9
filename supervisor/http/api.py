"""`/api/v1/...`: the operations as JSON, described by `/api/v1/openapi.json`.

Each endpoint's docstring carries its OpenAPI fragment after ``---`` (Starlette's
SchemaGenerator reads it). Handlers parse the request, call ``data`` or
``supervisor.admin``, and render; nothing else.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.routing import Route
from starlette.schemas import SchemaGenerator

from .. import admin
from .render import Json
from .state import state_of

schemas = SchemaGenerator({"openapi": "3.0.0", "info": {"title": "actor-supervisor", "version": "1"}})


def queues(request: Request) -> Json:
    """
    ---
    summary: Every queue with its counts and capacity plan
    responses:
      200: {description: "a list of queues"}
    """
    with state_of(request).connection() as conn:
        return Json({"queues": admin.queue_stats(conn)})


def openapi(request: Request) -> Json:
    return Json(schemas.get_schema(routes=request.app.routes))


routes = [
    Route("/queues", queues, methods=["GET"]),
    Route("/openapi.json", openapi, methods=["GET"], include_in_schema=False),
]
