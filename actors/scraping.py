"""The scraping role: fetch a watch's search page, record what it lists.

``scrape_watch`` respects its source's circuit breaker, fetches with httpx,
parses listings (JSON or HTML), upserts them, inserts price points deduplicated by
``dedupe_key``, chains an extraction job for each listing that is new to the watch
(or whose price moved) and sets ``watches.last_polled_at`` -- all of the writes in
one transaction. A failed fetch or parse is a poll too: the watch records the attempt
and its error, and is tried again after its interval, doubling per failed poll up to a
day (``MAX_BACKOFF_S``), instead of on every ``poll_due_watches`` tick.

The source's politeness (a rate per minute with a burst, a daily quota) is the
runtime's flow control: each scrape job carries its source's limits as its own
message options, key ``source:<id>`` (``send_scrape``, ``enqueue_due_watches``), so
a scrape the source cannot take yet waits in the database (status ``waiting``,
no thread held) and is claimed when a token is free. A 429 raises ``RateLimited``:
the source's key is blocked fleet-wide for its Retry-After and the job goes back
without spending a retry. The bucket is the row ``source:<id>`` of
``rate_limiter_state``, the one the in-job limiter used before: its tokens, quota
and block carry over.

``poll_due_watches`` is the scheduled job that enqueues scrapes of the watches
whose last poll is older than their interval.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote_plus

import dramatiq
import httpx
from dramatiq.middleware import CurrentMessage
from psycopg.types.json import Jsonb

from supervisor import RateLimited

from . import breaker, cache, deferral, http, llm, pacing, settings, store
from .dedupe import dedupe_key, match_strength, normalise_title, url_key
from .extraction import extract_listing
from .parsing import ParseError, parse
from .queries import pipeline as sql

log = logging.getLogger(__name__)

QUEUE = "scraping"
# A scrape's dedupe key is this and its watch's id: one live scrape per watch.
DEDUPE_PREFIX = "scrape:"
# A failing watch's next try is its interval doubled per failed poll, at most this (or its
# interval, if that is longer).
MAX_BACKOFF_S = 86_400


class PermanentScrapeError(Exception):
    """Retrying will not help: 404, a page that cannot be parsed, a bad source."""


class TransientScrapeError(Exception):
    """Timeouts, connection errors, 5xx: retried with backoff."""


@dataclass(frozen=True)
class _Target:
    watch_id: int
    query: str
    watch_enabled: bool
    last_ok_at: datetime | None  # its last successful poll
    source_id: int
    source_name: str
    search_url: str
    fmt: str
    source_enabled: bool
    limits: dict[str, Any] | None  # the flow options a scrape of this source carries (None: quota 0)


def _load(conn, watch_id: int) -> _Target | None:
    row = conn.execute(sql.WATCH_WITH_SOURCE, {"id": watch_id}).fetchone()
    if row is None:
        return None
    wid, query, wenabled, last_ok, sid, sname, url, fmt, senabled, rate, burst, quota = row
    return _Target(wid, query, wenabled, last_ok, sid, sname, url, fmt, senabled,
                   source_limits(sid, rate, burst, quota))


def limiter_key(source_id: int) -> str:
    return f"source:{source_id}"


def source_limits(source_id: int, per_minute: float, burst: int, daily_quota: int | None) -> dict[str, Any] | None:
    """The message options of a scrape of this source: its rate, burst and daily quota on
    its limiter key. None for a daily quota of 0 (no request at all: nothing to send).

    They are read from the sources table when the job is sent, so a change of a source's
    rate applies to the scrapes sent after it. A scrape already waiting keeps the limits
    it was sent with: the claim reads a key's limits from its first waiting job, so the
    old rate holds until those jobs have started (at most one live scrape per watch: one
    poll round), then the new one; the bucket row is the same throughout."""
    if daily_quota is not None and daily_quota <= 0:
        return None
    return pacing.options(limiter_key(source_id), per_minute=float(per_minute), burst=int(burst),
                          daily_quota=daily_quota)


def search_url(template: str, query: str) -> str:
    return template.replace("{query}", quote_plus(query))


@dramatiq.actor(queue_name=QUEUE, max_retries=5, min_backoff=5_000, max_backoff=300_000,
                throws=(PermanentScrapeError,))
def scrape_watch(watch_id: int, requested_at: float | None = None) -> dict:
    """Send it with ``send_scrape`` (or ``enqueue_due_watches``): they add the source's
    limits. A bare ``send`` is sent again with them by its first run."""
    return run_scrape(watch_id, requested_at)


def send_scrape(watch_id: int, requested_at: float | None = None, **options: Any) -> dramatiq.Message | None:
    """Enqueue a scrape of one watch carrying its source's limits, or none while its page
    is cached (None: the watch does not exist, or its source's daily quota is 0)."""
    with store.pool().connection() as conn:
        target = _load(conn, watch_id)
        cached = target is not None and bool(cache.fresh(conn, [(target.source_id, target.query)]))
    if target is None or target.limits is None:
        return None
    return scrape_watch.send_with_options(args=(watch_id, requested_at), **({} if cached else target.limits),
                                          **options)


def run_scrape(watch_id: int, requested_at: float | None = None) -> dict:
    pool = store.pool()
    with pool.connection() as conn:
        target = _load(conn, watch_id)
        if target is None:
            log.info("watch %s no longer exists; nothing to scrape", watch_id)
            return {"skipped": "watch does not exist"}
        if not (target.watch_enabled and target.source_enabled):
            return {"skipped": "watch or source disabled"}
        if requested_at and target.last_ok_at and target.last_ok_at.timestamp() >= requested_at:
            # A scrape that succeeded after this one was asked for already has fresh data.
            return {"skipped": "already polled since requested"}
        # A cached page costs the source nothing: no breaker, no request, and no token when
        # the scrape was sent while it was cached (then it carries no limits).
        cached = cache.get(conn, target.source_id, target.query)
        current = CurrentMessage.get_current_message()
        # Sent without its source's limits (a bare scrape_watch.send, or its watch moved
        # to another source since): no request from here; sent again with them, it waits
        # for the source's token at its claim. (Called outside a job, it fetches at once.)
        unlimited = current is not None and pacing.message_key(current) != limiter_key(target.source_id)
        admission = (breaker.admit(conn, target.source_id, settings.breaker())
                     if cached is None and not unlimited else None)
    if cached is not None:
        with _recorded(pool, target):
            listings = _parse(target, cached)
        return {**_store(pool, target, listings), "cached": True}
    if unlimited:
        if target.limits is None:
            return {"skipped": "the source's daily quota is 0"}
        deferral.defer(store.broker(), 0, f"sent again with source {target.source_name}'s limits", target.limits)
        return {"deferred": "sent again with the source's limits"}
    assert admission is not None
    if not admission.allowed:
        deferral.defer(store.broker(), int(admission.wait_seconds * 1000) + 100,
                       f"source {target.source_name} paused by its circuit breaker")
        return {"deferred": "breaker open", "seconds": admission.wait_seconds}

    # The source's token was taken when this job was claimed (its limits: source_limits).
    with _recorded(pool, target):
        page = _fetch(pool, target)
        listings = _parse(target, page)
    with pool.connection() as conn:
        cache.put(conn, target.source_id, target.query, page)
    return _store(pool, target, listings)


@contextlib.contextmanager
def _recorded(pool, target: _Target) -> Iterator[None]:
    """A failed fetch or parse is recorded on the watch (the attempt, its error and the
    watch's next try: sql.MARK_FAILED), then raised for the job's own retries."""
    try:
        yield
    except (PermanentScrapeError, TransientScrapeError) as exc:
        current = CurrentMessage.get_current_message()
        with pool.connection() as conn:
            row = conn.execute(sql.MARK_FAILED, {
                "id": target.watch_id, "error": f"{type(exc).__name__}: {exc}",
                "job": current.message_id if current is not None else None, "max_backoff_s": MAX_BACKOFF_S,
            }).fetchone()
        if row is not None:  # None: the watch was deleted meanwhile
            log.warning("watch %s failed (%d in a row), next try at %s: %s", target.watch_id, row[0],
                        row[1].isoformat(timespec="seconds"), exc)
        raise


def _where(target: _Target) -> str:
    return f"source {target.source_name} ({http.redact_url(search_url(target.search_url, target.query))})"


def _fetch(pool, target: _Target) -> cache.Page:
    url = search_url(target.search_url, target.query)
    bsettings = settings.breaker()
    where = _where(target)
    try:
        with http.client() as client:
            response = client.get(url, headers={"Accept": "application/json, text/html;q=0.9"})
    except httpx.TransportError as exc:
        with pool.connection() as conn:
            breaker.record_failure(conn, target.source_id, f"{type(exc).__name__}: {exc}", bsettings)
        raise TransientScrapeError(f"{where}: {type(exc).__name__}: {exc}") from None

    status = response.status_code
    if status == 429:
        # The job's key (the source's) is blocked for the wait on every process and host,
        # and the job goes back to wait for it without spending a retry.
        wait = http.retry_after_seconds(response)
        raise RateLimited(retry_after=wait, message=f"{where}: HTTP 429, retry after {wait:.0f}s")
    if status >= 500 or status == 408:
        with pool.connection() as conn:
            breaker.record_failure(conn, target.source_id, f"HTTP {status}", bsettings)
        raise TransientScrapeError(f"{where}: HTTP {status}")
    if status >= 400:
        raise PermanentScrapeError(f"{where}: HTTP {status}; check the source's search_url and the query")
    with pool.connection() as conn:
        breaker.record_success(conn, target.source_id)
    return cache.Page(str(response.url), response.text, response.headers.get("content-type", ""))


def _parse(target: _Target, page: cache.Page):
    try:
        return parse(page.body, content_type=page.content_type, fmt=target.fmt, base_url=page.url)
    except ParseError as exc:
        raise PermanentScrapeError(f"{_where(target)}: {exc}") from None


def _store(pool, target: _Target, listings) -> dict:
    today = datetime.now(UTC).date()
    min_strength = settings.scraping().min_match_strength
    broker = store.broker()
    extraction_options = llm.job_options()
    new_listings = new_points = chained = 0
    with pool.connection() as conn, conn.transaction(), broker.transaction(conn):
        for item in listings:
            strength = match_strength(target.query, item.title)
            if strength < min_strength:
                continue
            external_id = item.external_id or (url_key(item.url) if item.url else
                                               url_key("title:" + normalise_title(item.title)))
            listing_id, inserted, old_price, reappeared = conn.execute(sql.UPSERT_LISTING, {
                "source_id": target.source_id, "external_id": external_id, "url": item.url,
                "title": item.title, "description": item.description, "price_cents": item.price_cents,
                "currency": item.currency, "price_type": item.price_type, "condition": item.condition,
                "raw": Jsonb(item.raw), "listing_type": item.listing_type, "auction_ends_at": item.auction_ends_at,
                "previous_poll": target.last_ok_at,
            }).fetchone()
            key = dedupe_key(external_id=item.external_id, url=item.url, title=item.title,
                             price_cents=item.price_cents, day=today, price_type=item.price_type)
            point = conn.execute(sql.UPSERT_PRICE_POINT, {
                "watch_id": target.watch_id, "source_id": target.source_id, "listing_id": listing_id,
                "dedupe_key": key, "price_cents": item.price_cents, "currency": item.currency,
                "price_type": item.price_type, "observed_on": today, "match_strength": strength,
            }).fetchone()
            point_is_new = point is not None and point[1]
            new_listings += bool(inserted)
            new_points += bool(point_is_new)
            # Judged again only when something a verdict depends on changed: a new listing,
            # a new price, or one back after a poll that did not find it. A daily price
            # point of an unchanged listing is history, not news (it must not re-alert).
            if inserted or reappeared or (old_price is not None and old_price != item.price_cents):
                extract_listing.send_with_options(
                    args=(listing_id, target.watch_id),
                    dedupe_key=f"extract:{target.watch_id}:{listing_id}", **extraction_options,
                )
                chained += 1
        conn.execute(sql.MARK_POLLED, {"id": target.watch_id})
    summary = {"watch_id": target.watch_id, "listings": len(listings), "new_listings": new_listings,
               "new_price_points": new_points, "extractions": chained}
    log.info("scraped watch %s from %s: %s", target.watch_id, target.source_name, summary)
    return summary


@dramatiq.actor(queue_name=QUEUE, max_retries=3, min_backoff=10_000)
def poll_due_watches(limit: int = 500, older_than_seconds: float | None = None) -> dict:
    """Enqueue a scrape for every enabled watch not polled within its interval
    (at most one live scrape per watch: the dedupe key)."""
    return {"rows_affected": enqueue_due_watches(limit, older_than_seconds)}


def enqueue_due_watches(limit: int = 500, older_than_seconds: float | None = None) -> int:
    broker = store.broker()
    with broker.actor_pool.connection() as conn:
        due = conn.execute(sql.DUE_WATCHES, {"limit": limit, "older_than_s": older_than_seconds, "queue": QUEUE,
                                             "dedupe_prefix": DEDUPE_PREFIX}).fetchall()
        cached = cache.fresh(conn, [(sid, query) for _, query, sid, *_ in due])
    now = time.time()
    # A watch whose page is cached is sent without limits: it costs the source no token
    # (should the page expire before it runs, the job sends itself again with them).
    messages = [scrape_watch.message_with_options(
        args=(wid, now), dedupe_key=f"{DEDUPE_PREFIX}{wid}",
        **({} if (sid, query) in cached else source_limits(sid, rate, burst, quota) or {}))
        for wid, query, sid, rate, burst, quota in due]
    broker.enqueue_many(messages)
    log.info("poll_due_watches: %d watches due", len(due))
    return len(due)
