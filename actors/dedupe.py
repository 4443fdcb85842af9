"""Price-point dedupe keys and how well a listing matches its watch's query."""

from __future__ import annotations

import hashlib
import re
from datetime import date
from urllib.parse import urlsplit, urlunsplit

_SPACE = re.compile(r"\s+")
_TOKEN = re.compile(r"[a-z0-9]+(?:\.[0-9]+)?")


def normalise_url(url: str | None) -> str:
    """Lowercased scheme and host, no query, no fragment, no trailing slash."""
    if not url:
        return ""
    parts = urlsplit(url.strip())
    path = parts.path.rstrip("/") or "/"
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), path, "", ""))


def normalise_title(title: str) -> str:
    return _SPACE.sub(" ", title).strip().lower()


def dedupe_key(*, external_id: str | None, url: str | None, title: str, price_cents: int,
               day: date, price_type: str) -> str:
    """``ext_<external id>`` when the source gives one, else ``hash_`` + the first
    16 hex of sha256 over the normalised URL, title, price in cents, day and
    price type: the same offer seen twice on one day is one price point."""
    if external_id:
        return f"ext_{external_id}"
    material = "|".join(
        [normalise_url(url), normalise_title(title), str(int(price_cents)), day.isoformat(), price_type]
    )
    return "hash_" + hashlib.sha256(material.encode()).hexdigest()[:16]


def url_key(url: str) -> str:
    """A stable listing id for sources that give none: from the normalised URL."""
    return "url_" + hashlib.sha256(normalise_url(url).encode()).hexdigest()[:16]


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def match_strength(query: str, title: str) -> float:
    """Share of the query's words found in the title (0..1)."""
    wanted = set(tokens(query))
    if not wanted:
        return 0.0
    have = set(tokens(title))
    # "32gb" in the query also matches "32 GB" in the title.
    joined = "".join(tokens(title))
    hits = sum(1 for w in wanted if w in have or (len(w) > 3 and w in joined))
    return round(hits / len(wanted), 4)
