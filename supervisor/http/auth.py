"""The one check every action passes (read-only mode, the token and its role), and the
audit log's row for it.

GET, HEAD and OPTIONS are reads and always allowed. Anything else is an action
(``roles.match`` names it and the role it needs): refused with 403 in read-only mode;
with tokens configured it needs one, either as ``Authorization: Bearer TOKEN`` (scripts)
or in the ``X-Supervisor-Token`` header (browsers: a cross-site form or image cannot set
a custom header, and a cross-origin fetch that sets one needs a CORS preflight we never
grant), so a request forged by another site never carries it. No token or one no one
has: 401; a role below the action's: 403; both JSON errors naming the role needed.

Every action, done or refused, is written to ``audit_log`` before its answer leaves
(handlers add what they changed with ``note``). A pure ASGI middleware, so the
dashboard's routes get the same check without doing anything.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import audit
from ..config import HttpConfig
from . import roles
from .render import Json, error

log = logging.getLogger(__name__)

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
TOKEN_HEADER = "x-supervisor-token"
AUDIT_KEY = "supervisor_audit"  # the request state's audit entry


def presented_token(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.headers.get(TOKEN_HEADER)


def _how() -> str:
    return f"send 'Authorization: Bearer TOKEN' or '{TOKEN_HEADER}: TOKEN'"


def refusal(http: HttpConfig, action: roles.Matched, who: roles.Principal | None) -> Json | None:
    """The JSON error refusing ``action`` to ``who`` (None: a token no one has), or None."""
    needs = {"action": action.action, "needs": action.role}
    if http.read_only:
        return error(403, "read-only: this server refuses every action (http.read_only is true)", **needs)
    if who is None or who.role is None:
        why = "this token is not one of the configured tokens" if who is None else "no token was sent"
        response = error(401, f"{action.action} needs a token of role {roles.at_least(action.role)} ({why}): "
                              f"{_how()}", **needs)
        response.headers["WWW-Authenticate"] = "Bearer"
        return response
    if not who.may(action.role):
        return error(403, f"token {who.name} is a {who.role}: {action.action} needs role "
                          f"{roles.at_least(action.role)}", **needs, token=who.name, role=who.role)
    return None


def note(request: Request, **fields: Any) -> None:
    """Add to this action's audit row what the handler knows: ``job_ids`` (those changed),
    ``filter``, ``detail``, ``target``, ``outcome``."""
    entry = request.scope.get("state", {}).get(AUDIT_KEY)
    if entry is None:
        return
    ids = fields.pop("job_ids", None)
    if ids is not None:
        fields.update(job_ids=[str(i) for i in ids], affected=len(ids))
    for key, value in fields.items():
        setattr(entry, key, value)


class ActionGuard:
    def __init__(self, app: ASGIApp, http: HttpConfig) -> None:
        self.app = app
        self.http = http

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in SAFE_METHODS:
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        action = roles.match(scope["method"], scope["path"])
        who = roles.identify(self.http, presented_token(request))
        entry = audit.Entry(action=action.action, token_name=who.name if who else None,
                            role=who.role if who else None, target=action.target,
                            client=request.client.host if request.client else None)
        refused = refusal(self.http, action, who)
        if refused is not None:
            entry.outcome = json.loads(bytes(refused.body))["error"]
            await self._record(scope, replace(entry, status=refused.status_code))
            await refused(scope, receive, send)
            return
        scope.setdefault("state", {})[AUDIT_KEY] = entry
        answered = False

        async def recording_send(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.start" and not answered:
                answered = True
                entry.status = message["status"]
                await self._record(scope, entry)  # before the answer: a caller sees its row at once
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        except Exception:
            if not answered:
                entry.status, entry.outcome = 500, entry.outcome or "the server failed"
                await self._record(scope, entry)
            raise

    async def _record(self, scope: Scope, entry: audit.Entry) -> None:
        state = scope["app"].state.supervisor

        def write() -> None:
            with state.connection() as conn:
                audit.record(conn, entry)

        try:
            await run_in_threadpool(write)
        except Exception as exc:  # the action stands; its row is what is lost
            log.warning("audit log: %s %s (status %s) not written: %s", entry.action, entry.target or "",
                        entry.status, exc)
