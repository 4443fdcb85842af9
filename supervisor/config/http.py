"""The `http:` section: the HTTP child's listen address, its tokens and read-only mode."""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import defaults
from . import checks as check
from .keys import key, section

# Who may do what, lowest first: each role may do everything the ones before it may.
# viewer: read; operator: retry, cancel, pause and resume; admin: also scale, schedules, send jobs.
ROLES = ("viewer", "operator", "admin")
# The name the single `token` (and `supervisor http --token`) acts under: an admin.
SINGLE_TOKEN_NAME = "token"


@dataclass(frozen=True)
class HttpToken:
    """One named token (`http.tokens.NAME`): its role and its secret (from the environment)."""

    name: str
    role: str = key(check.one_of(ROLES, "role"), "What it may do: viewer (read), operator (retry, cancel, "
                    "pause, resume), admin (also scale, schedules, send jobs).", required=True)
    secret: str = key(None, "The environment variable that holds its secret (never the file).", name="secret_env",
                      what="environment variable name", required=True, repr=False)
    line: int = field(default=0, compare=False)


@dataclass(frozen=True)
class HttpConfig:
    """The HTTP child (off unless the config has an `http:` section)."""

    host: str = key(check.listen, "The address it serves on.", defaults.HTTP_HOST, name="listen",
                    into=("host", "port"), shown=f"{defaults.HTTP_HOST}:{defaults.HTTP_PORT}")
    port: int = defaults.HTTP_PORT
    token: str | None = key(check.secret, "A token every action (every non-GET request) needs: an admin named "
                            f"{SINGLE_TOKEN_NAME!r}; empty: none.", None, repr=False)
    read_only: bool = key(check.boolean, "Refuse every action, whatever the token.", False)
    tokens: tuple[HttpToken, ...] = section(HttpToken, "Named tokens, each with a role.", (), named="<token>")

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
