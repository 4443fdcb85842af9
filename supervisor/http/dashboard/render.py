"""Rendering pages: the Jinja2 environment (templates shipped in the package) and the
filters that turn numbers and times into what a person reads."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse

from ... import limits, units
from .. import roles
from ..state import read_from, state_of
from . import charts
from .gather import app_pages

PARTIAL_HEADER = "x-dashboard-partial"  # the live refresh asks for <main> only


def ago(value: datetime | None) -> str:
    if value is None:
        return "—"
    return duration((datetime.now(UTC) - value).total_seconds()) + " ago"


def until(value: datetime | None) -> str:
    if value is None:
        return "—"
    return "in " + duration((value - datetime.now(UTC)).total_seconds())


def clock(value: datetime | str | None) -> str:
    """A wall-clock time with its offset (a fire time in a schedule's zone, or in UTC)."""
    if value is None:
        return "—"
    when = datetime.fromisoformat(value) if isinstance(value, str) else value
    offset = when.utcoffset()
    if not offset:
        return when.strftime("%Y-%m-%d %H:%M UTC")
    return when.strftime("%Y-%m-%d %H:%M ") + when.strftime("%z")[:3] + ":" + when.strftime("%z")[3:]


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    s = abs(float(seconds))
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if s < 2 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def rate(per_second: float | None) -> str:
    return "—" if per_second is None else limits.rate_text(per_second)


def size(n: float | None) -> str:
    return "—" if n is None else units.human_bytes(int(n))


def percent(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


env = Environment(loader=PackageLoader("supervisor.http.dashboard", "templates"),
                  autoescape=select_autoescape(["html"]), trim_blocks=True, lstrip_blocks=True)
env.filters.update(ago=ago, until=until, clock=clock, duration=duration, size=size, percent=percent, rate=rate)
env.globals.update(charts=charts)


def page(request: Request, template: str, **context: Any) -> HTMLResponse:
    http = state_of(request).http
    html = env.get_template(template).render(
        request=request, partial=request.headers.get(PARTIAL_HEADER) == "1",
        actions=not http.read_only, token_needed=http.auth_required and not http.read_only, needs=roles.NEEDS,
        app_pages=app_pages(state_of(request)), path=request.url.path, read_from=read_from.get(),
        standby=state_of(request).read_url is not None, **context)
    return HTMLResponse(html, headers={"Cache-Control": "no-store"})
