"""`/healthz` (the master is alive and beating) and `/readyz` (the database answers
and every role runs its wanted count). Both answer JSON; 503 names what is wrong."""

from __future__ import annotations

from starlette.requests import Request
from starlette.routing import Route

from . import data
from .render import Json
from .state import state_of


def healthz(request: Request) -> Json:
    report = data.master_health(state_of(request))
    return Json(report, status_code=200 if report["ok"] else 503)


def readyz(request: Request) -> Json:
    report = data.readiness(state_of(request))
    return Json(report, status_code=200 if report["ok"] else 503)


routes = [
    Route("/healthz", healthz, methods=["GET"], include_in_schema=False),
    Route("/readyz", readyz, methods=["GET"], include_in_schema=False),
]
