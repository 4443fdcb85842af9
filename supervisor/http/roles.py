"""Who may do what: the one table of actions and the role each needs, and who a token is.

Every action (any request that is not GET, HEAD or OPTIONS) is matched here by method and
path, before routing: the API's and the dashboard's own (``/ui/...``) alike. The guard
(``auth.ActionGuard``) refuses what the token's role may not do, the audit log names the
action, and the dashboard hides the buttons of actions above the token's role. An action
with no rule (an app's route, one added without a rule) needs an admin.
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass

from starlette.routing import compile_path

from ..config import ROLES, HttpConfig

RANK = {role: rank for rank, role in enumerate(ROLES)}
DEFAULT_ROLE = "admin"


@dataclass(frozen=True)
class Rule:
    method: str
    path: str  # a Starlette path template
    action: str  # the name the audit log and the dashboard use
    role: str  # the lowest role that may do it
    target: str | None = None  # the path parameter naming what it acts on

    @property
    def pattern(self) -> re.Pattern[str]:
        return _compiled(self.path)


_PATTERNS: dict[str, re.Pattern[str]] = {}


def _compiled(path: str) -> re.Pattern[str]:
    if path not in _PATTERNS:
        _PATTERNS[path] = compile_path(path)[0]
    return _PATTERNS[path]


# Each action: the lowest role that may do it, and every route that does it (POST unless
# the path starts with its method). A path parameter names what the action acts on.
_ACTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "jobs.send": ("admin", ("/api/v1/jobs",)),
    "jobs.retry": ("operator", ("/api/v1/jobs/retry", "/api/v1/jobs/{job_id}/retry", "/ui/jobs/retry")),
    "jobs.cancel": ("operator", ("/api/v1/jobs/cancel", "/api/v1/jobs/{job_id}/cancel", "/ui/jobs/cancel")),
    "queues.pause": ("operator", ("/api/v1/queues/{queue}/pause", "/ui/queues/{queue}/pause")),
    "queues.resume": ("operator", ("/api/v1/queues/{queue}/resume", "/ui/queues/{queue}/resume")),
    "errors.retry": ("operator", ("/api/v1/errors/retry", "/ui/errors/retry")),
    "errors.cancel": ("operator", ("/api/v1/errors/cancel", "/ui/errors/cancel")),
    "schedules.run": ("admin", ("/ui/schedules/{name}/run",)),
    "roles.scale": ("admin", ("/ui/roles/{role}/scale",)),
    "limits.set": ("operator", ("PUT /api/v1/limits/{key:path}", "/ui/limits/set")),
    "limits.clear": ("operator", ("DELETE /api/v1/limits/{key:path}", "/ui/limits/clear")),
    "workflows.cancel": ("operator", ("/ui/workflows/{workflow_id}/cancel",)),
    "workflows.retry": ("operator", ("/ui/workflows/{workflow_id}/retry",)),
}


def _target(path: str) -> str | None:
    found = re.search(r"\{(\w+)(?::\w+)?\}", path)
    return found.group(1) if found else None


def _rule_of(action: str, role: str, route: str) -> Rule:
    method, _, path = route.rpartition(" ")
    return Rule(method or "POST", path, action, role, _target(path))


RULES = tuple(_rule_of(action, role, route) for action, (role, routes) in _ACTIONS.items() for route in routes)

# The role each named action needs (one per action, whichever route asks for it).
NEEDS: dict[str, str] = {}
for _rule in RULES:
    assert NEEDS.setdefault(_rule.action, _rule.role) == _rule.role, f"{_rule.action}: one role per action"
    assert _rule.role in RANK, _rule


@dataclass(frozen=True)
class Matched:
    """An action request: its rule (None: no rule, so an admin's) and what it acts on."""

    action: str
    role: str
    target: str | None


def match(method: str, path: str) -> Matched:
    for rule in RULES:
        if rule.method == method and (m := rule.pattern.match(path)) is not None:
            target = f"{rule.target.removesuffix('_id')} {m.group(rule.target)}" if rule.target else None
            return Matched(rule.action, rule.role, target)
    return Matched(f"{method} {path}", DEFAULT_ROLE, None)


@dataclass(frozen=True)
class Principal:
    """Who sent a request: a token's name and role; name None for no token (role None then
    means actions need one; with no token configured anyone may act, as an admin)."""

    name: str | None
    role: str | None

    def may(self, role: str) -> bool:
        return self.role is not None and RANK[self.role] >= RANK[role]


def identify(http: HttpConfig, presented: str | None) -> Principal | None:
    """The principal a presented token is (None: a token no one has)."""
    if not http.auth_required:
        return Principal(None, DEFAULT_ROLE)
    if presented is None:
        return Principal(None, None)
    found = None
    for token in http.principals():  # every one compared, in constant time each
        if hmac.compare_digest(presented.encode(), token.secret.encode()):
            found = token
    return Principal(found.name, found.role) if found is not None else None


def at_least(role: str) -> str:
    """'operator or admin': the roles that may do what ``role`` may."""
    above = ROLES[RANK[role]:]
    return " or ".join(above) if len(above) < 3 else "any role"
