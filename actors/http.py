"""Outgoing HTTP for the bundled actors: one configured client, Retry-After,
and URL redaction so webhook secrets never reach a log or a job row."""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit, urlunsplit

import httpx

from . import settings

# httpx logs every request URL at INFO: for webhooks that URL is the secret.
logging.getLogger("httpx").setLevel(logging.WARNING)
logging.getLogger("httpcore").setLevel(logging.WARNING)

TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
_WORDY = re.compile(r"^[a-z][a-z_-]{0,15}$")


def client(timeout: float | None = None) -> httpx.Client:
    s = settings.http()
    t = s.timeout if timeout is None else timeout
    return httpx.Client(
        timeout=httpx.Timeout(t, connect=min(t, 10.0)),
        headers={"User-Agent": s.user_agent},
        follow_redirects=True,
    )


def retry_after_seconds(response: httpx.Response, default: float = 60.0, cap: float = 3600.0) -> float:
    """Seconds to wait from Retry-After (delta-seconds or an HTTP date), or a
    JSON body's ``retry_after`` (Discord), else ``default``; at most ``cap``."""
    value = response.headers.get("retry-after")
    wait: float | None = None
    if value:
        value = value.strip()
        try:
            wait = float(value)
        except ValueError:
            try:
                when = parsedate_to_datetime(value)
                wait = (when - datetime.now(UTC)).total_seconds()
            except (TypeError, ValueError):
                wait = None
    if wait is None and "json" in response.headers.get("content-type", ""):
        try:
            body = response.json()
            if isinstance(body, dict) and isinstance(body.get("retry_after"), int | float):
                wait = float(body["retry_after"])
        except ValueError:
            pass
    if wait is None:
        wait = default
    return max(0.0, min(cap, wait))


def redact_url(url: str) -> str:
    """Scheme, host and plain path words only: tokens, ids, credentials and
    query values become ***. https://discord.com/api/webhooks/123/abc ->
    https://discord.com/api/webhooks/***/***"""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "***"
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    path = "/".join(seg if not seg or _WORDY.match(seg) else "***" for seg in parts.path.split("/"))
    query = "&".join(f"{p.split('=', 1)[0]}=***" for p in parts.query.split("&") if p) if parts.query else ""
    return urlunsplit((parts.scheme, host, path, query, ""))
