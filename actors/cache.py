"""A TTL cache of fetched search pages in PostgreSQL, shared by every process and
host (the scrape worker we replace kept one per container in SQLite).

Keyed by source, query and page. A hit is served without a request; a scrape sent
while its page is fresh carries no limits (scraping.py), so it takes no token either.
``pipeline.cache: {ttl: 1h, enabled: true}`` sets it (``enabled: false`` turns it
off). Expired rows are pruned by refresh_baselines.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from . import settings, store
from .queries import cache as sql


@dataclass(frozen=True)
class Page:
    url: str
    body: str
    content_type: str


def get(conn, source_id: int, query: str, page: int = 1) -> Page | None:
    if not settings.cache().enabled:
        return None
    row = conn.execute(sql.GET, {"source_id": source_id, "query": query, "page": page}).fetchone()
    return Page(*row) if row else None


def fresh(conn, pairs: Iterable[tuple[int, str]]) -> set[tuple[int, str]]:
    """The (source id, query) pairs whose first page is cached now (none with the cache off)."""
    pairs = list(pairs)
    if not pairs or not settings.cache().enabled:
        return set()
    rows = conn.execute(sql.FRESH, {"source_ids": [p[0] for p in pairs], "queries": [p[1] for p in pairs]})
    return {(int(sid), query) for sid, query in rows}


def put(conn, source_id: int, query: str, fetched: Page, page: int = 1) -> None:
    cfg = settings.cache()
    if not cfg.enabled or cfg.ttl <= 0:
        return
    conn.execute(sql.PUT, {"source_id": source_id, "query": query, "page": page, "url": fetched.url,
                           "body": fetched.body, "content_type": fetched.content_type, "ttl_s": cfg.ttl})


def prune() -> int:
    with store.pool().connection() as conn:
        return conn.execute(sql.PRUNE).rowcount
