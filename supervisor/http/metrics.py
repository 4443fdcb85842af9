"""`/metrics`: Prometheus text format."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


def scrape(request: Request) -> Response:
    registry = CollectorRegistry()
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


routes = [Route("/metrics", scrape, methods=["GET"], include_in_schema=False)]
