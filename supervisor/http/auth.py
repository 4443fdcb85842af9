"""The one check every action passes: read-only mode and the token.

GET, HEAD and OPTIONS are reads and always allowed. Anything else is an action:
refused with 403 in read-only mode; with a token set it needs either
``Authorization: Bearer TOKEN`` (scripts) or the token in the ``X-Supervisor-Token``
header (browsers: a cross-site form or image cannot set a custom header, and a
cross-origin fetch that sets one needs a CORS preflight we never grant), so a
request forged by another site never carries it. A pure ASGI middleware, so the
dashboard's routes get the same check without doing anything.
"""

from __future__ import annotations

import hmac

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from ..config import HttpConfig
from .render import error

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
TOKEN_HEADER = "x-supervisor-token"


def presented_token(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.headers.get(TOKEN_HEADER)


def refusal(request: Request, http: HttpConfig) -> tuple[int, str] | None:
    """Why this request may not run (status, message), or None when it may."""
    if request.method in SAFE_METHODS:
        return None
    if http.read_only:
        return 403, "read-only: this server refuses every action (http.read_only is true)"
    if http.token:
        given = presented_token(request)
        if given is None:
            return 401, f"this action needs the token: send 'Authorization: Bearer TOKEN' or '{TOKEN_HEADER}: TOKEN'"
        if not hmac.compare_digest(given.encode(), http.token.encode()):
            return 403, "wrong token"
    return None


class ActionGuard:
    def __init__(self, app: ASGIApp, http: HttpConfig) -> None:
        self.app = app
        self.http = http

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            why = refusal(Request(scope), self.http)
            if why is not None:
                status, message = why
                headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
                response = error(status, message)
                if headers:
                    response.headers.update(headers)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
