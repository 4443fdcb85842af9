"""The `http:` section: the HTTP child's listen address, token and read-only mode."""

from __future__ import annotations

from dataclasses import dataclass

from .. import defaults


@dataclass(frozen=True)
class HttpConfig:
    """The HTTP child (off unless the config has an `http:` section)."""

    host: str = defaults.HTTP_HOST
    port: int = defaults.HTTP_PORT
    # Actions (every non-GET request) need this token when it is set.
    token: str | None = None
    # Refuse every action, whatever the token.
    read_only: bool = False

    @property
    def listen(self) -> str:
        return f"{self.host}:{self.port}"
