"""The `http:` section: the HTTP child's listen address, its tokens and read-only mode."""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import defaults

# Who may do what, lowest first: each role may do everything the ones before it may.
# viewer: read; operator: retry, cancel, pause and resume; admin: also scale, schedules, send jobs.
ROLES = ("viewer", "operator", "admin")
# The name the single `token` (and `supervisor http --token`) acts under: an admin.
SINGLE_TOKEN_NAME = "token"


@dataclass(frozen=True)
class HttpToken:
    """One named token (`http.tokens.NAME`): its role and its secret (from the environment)."""

    name: str
    role: str
    secret: str = field(repr=False)
    line: int = field(default=0, compare=False)


@dataclass(frozen=True)
class HttpConfig:
    """The HTTP child (off unless the config has an `http:` section)."""

    host: str = defaults.HTTP_HOST
    port: int = defaults.HTTP_PORT
    # Actions (every non-GET request) need this token when it is set: an admin named "token".
    token: str | None = field(default=None, repr=False)
    # Refuse every action, whatever the token.
    read_only: bool = False
    # Named tokens, each with a role (`http.tokens`).
    tokens: tuple[HttpToken, ...] = ()

    @property
    def listen(self) -> str:
        return f"{self.host}:{self.port}"

    def principals(self) -> tuple[HttpToken, ...]:
        """Every token an action may present: the named ones and the single `token` (an admin)."""
        single = (HttpToken(SINGLE_TOKEN_NAME, "admin", self.token),) if self.token else ()
        return self.tokens + single

    @property
    def auth_required(self) -> bool:
        """Whether an action needs a token (with none configured, anyone who reaches the address may act)."""
        return bool(self.token or self.tokens)
