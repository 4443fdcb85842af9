"""``create_app``: the Starlette app of the HTTP child.

Routes are grouped by module (``health``, ``metrics``, ``api``); a dashboard adds
its own with ``extra_routes`` (server-rendered pages under ``/``, an SSE stream)
and gets the same action guard and shared state (``state.state_of(request)``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Literal

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.routing import BaseRoute, Mount, Route

from .. import apps
from ..config import Config, HttpConfig
from . import access, api, api_actors, api_limits, api_workflows, dashboard, health, metrics
from .auth import ActionGuard
from .render import error
from .state import AppState, state_of


def _only_in_use(app: apps.App, endpoint: Callable[[Request], Any]) -> Callable[[Request], Any]:
    """``endpoint``, answering only where ``app`` is in use (elsewhere 404, one line)."""
    @functools.wraps(endpoint)
    async def guarded(request: Request) -> Any:
        try:
            in_use = app in state_of(request).apps_in_use()
        except Exception as exc:  # the database is away: it cannot tell
            return error(503, f"database unavailable: {exc}")
        if not in_use:
            return error(404, f"{request.url.path}: the app {app.name!r} is not in use here (its config does"
                              " not use it, or its migrations are not applied)")
        if inspect.iscoroutinefunction(endpoint):
            return await endpoint(request)
        return await run_in_threadpool(endpoint, request)

    return guarded


def app_routes() -> list[BaseRoute]:
    """Every installed app's /api/v1 routes, each answering only where its app is in use."""
    out: list[BaseRoute] = []
    for app in apps.installed():
        for route in app.routes() if app.routes is not None else ():
            out.append(Route(route.path, _only_in_use(app, route.endpoint), methods=route.methods,
                             name=route.name))
    return out


def create_app(*, url: str, http: HttpConfig, config: Config | None = None,
               extra_routes: Sequence[BaseRoute] = (), listen_url: str | None = None,
               apps_from: Literal["config", "database"] | None = None) -> Starlette:
    """The app for database ``url``, served with ``http``'s token and read-only mode.
    ``config`` (when there is one) names the roles and the local control socket;
    ``listen_url`` is where the dashboard LISTENs (default url; "" for nowhere);
    ``apps_from``: whether the apps in use (their pages, alerts, gauges) are those the
    config uses (the default with a config: the HTTP child) or any installed app
    (`supervisor http`, and the default without a config); either way only those whose
    migrations the database holds (``AppState.apps_in_use``)."""
    chosen = apps_from or ("config" if config is not None else "database")
    state = AppState(url=url, http=http, config=config, apps_from=chosen)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state.open()  # in the serving process (after any fork), never before
        # chart history, live-update signal
        app.state.dashboard_recorder = dashboard.start(url if listen_url is None else listen_url or url,
                                                       listen=listen_url != "")
        try:
            yield
        finally:
            app.state.dashboard_recorder.stop()
            state.close()

    app = Starlette(
        routes=[*health.routes, *metrics.routes,
                Mount("/api/v1", routes=[*api.routes, *api_actors.routes, *api_limits.routes, *api_workflows.routes, *access.routes, *app_routes()]),
                *extra_routes, *dashboard.routes],
        middleware=[Middleware(ActionGuard, http=http)],
        lifespan=lifespan,
    )
    app.state.supervisor = state
    return app
