"""The extraction role: structured attributes, a product key, a score, an alert.

``extract_listing`` reads a listing's title and description (rules by default,
an OpenAI-compatible model when ``pipeline.extraction.llm`` is set), stores the
attributes and product key, scores the unit price against the product's
baseline and the watch's target, and for a deal creates an alert (one pending
per watch and listing) and chains its notification -- in one transaction.

``refresh_baselines`` is the scheduled job that recomputes every product's
price baseline from recent listings; ``reextract_incomplete`` the one that reads
again the listings whose product key came out short.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import dramatiq
from dramatiq.middleware import CurrentMessage
from psycopg.types.json import Jsonb

from . import cache, deferral, extract_rules, llm, pacing, settings, store
from .notification import deliver_alert
from .queries import pipeline as sql
from .scoring import Verdict, composite_score, fraction_under, judge, time_score

log = logging.getLogger(__name__)

QUEUE = "extraction"


@dramatiq.actor(queue_name=QUEUE, max_retries=5, min_backoff=2_000, max_backoff=120_000)
def extract_listing(listing_id: int, watch_id: int | None = None, reextract: bool = False) -> None:
    run_extraction(listing_id, watch_id, reextract)


def _asks_model(cfg: settings.LlmSettings | None, row) -> bool:
    attributes, extractor = row[-3], row[-1]
    # Already read by this model (the listing was re-scraped): it is not asked twice.
    return cfg is not None and not (extractor == llm.limit_key(cfg) and attributes is not None)


def _extract(pool, row, cfg: settings.LlmSettings | None, in_job: bool) -> extract_rules.Extraction:
    _, title, description, condition, price_cents, *_rest, attributes, product_key, extractor = row
    if cfg is None:
        return extract_rules.extract(title, description, condition)
    if not _asks_model(cfg, row):
        return extract_rules.Extraction(attributes, product_key, int(attributes.get("quantity") or 1), extractor)
    return llm.extract(cfg, pool, title, description, condition, in_job=in_job)


def _baseline(conn, product_key: str | None, scoring: settings.ScoringSettings) -> tuple[float | None, int]:
    if not product_key:
        return None, 0
    row = conn.execute(sql.BASELINE, {"product_key": product_key}).fetchone()
    if row is None or not row[2] or row[1] < scoring.min_samples:
        # Missing, stale or still cold: bring this one product's baseline up to date now.
        conn.execute(sql.REFRESH_BASELINES, {"days": scoring.window_days, "product_key": product_key})
        row = conn.execute(sql.BASELINE, {"product_key": product_key}).fetchone()
    return (float(row[0]), int(row[1])) if row else (None, 0)


def run_extraction(listing_id: int, watch_id: int | None = None, reextract: bool = False) -> dict:
    """Extract, score and maybe alert. ``reextract``: an operator's or the schedule's
    re-extraction, which may find a deal but never notifies a listing again that was
    notified before (only the listing coming back, or its price moving, is news)."""
    pool = store.pool()
    with pool.connection() as conn:
        row = conn.execute(sql.LISTING_FOR_EXTRACTION, {"id": listing_id}).fetchone()
    if row is None:
        log.info("listing %s no longer exists; nothing to extract", listing_id)
        return {"skipped": "listing does not exist"}
    price_cents, currency, price_type = row[4], row[5], row[6]
    listing_type, auction_ends_at, first_seen_at, now = row[8], row[9], row[10], row[11]
    cfg = settings.llm()
    current = CurrentMessage.get_current_message()
    if (cfg is not None and current is not None and _asks_model(cfg, row)
            and pacing.message_key(current) != llm.limit_key(cfg)):
        # A job sent without the model's limits (a bare send, or sent before the model was
        # configured or renamed): sent again with them, it waits for the model's token and
        # slot at its claim instead of taking them here.
        deferral.defer(store.broker(), 0, f"sent again with model {cfg.model}'s limits", llm.limits(cfg))
        return {"listing_id": listing_id, "deferred": "sent again with the model's limits"}
    extraction = _extract(pool, row, cfg, in_job=current is not None)
    unit_price = price_cents / max(1, extraction.quantity)
    scoring, alerting = settings.scoring(), settings.alerts()
    broker = store.broker()
    alert_id = None
    with pool.connection() as conn, conn.transaction(), broker.transaction(conn):
        conn.execute(sql.SAVE_EXTRACTION, {
            "id": listing_id, "attributes": Jsonb(extraction.attributes), "product_key": extraction.product_key,
            "unit_price_cents": round(unit_price), "extractor": extraction.extractor,
        })
        median, samples = _baseline(conn, extraction.product_key, scoring)
        watch = conn.execute(sql.WATCH_FOR_SCORING, {"id": watch_id}).fetchone() if watch_id else None
        if watch is None:
            verdict = judge(unit_price_cents=unit_price, currency=currency, price_type=price_type,
                            target_price_cents=None, deal_threshold=scoring.deal_threshold,
                            baseline_median=median, baseline_samples=samples, min_samples=scoring.min_samples)
            verdict = Verdict(False, verdict.score, "no watch to alert")
        else:
            _, enabled, target, threshold, webhook = watch
            verdict = judge(unit_price_cents=unit_price, currency=currency, price_type=price_type,
                            target_price_cents=target,
                            deal_threshold=threshold if threshold is not None else scoring.deal_threshold,
                            baseline_median=median, baseline_samples=samples, min_samples=scoring.min_samples)
        timing = time_score(listing_type=listing_type, auction_ends_at=auction_ends_at,
                            first_seen_at=first_seen_at, now=now)
        conn.execute(sql.SAVE_SCORE, {"id": listing_id, "score": verdict.score, "time_score": timing,
                                      "composite": composite_score(verdict.score, timing)})
        if verdict.deal and watch is not None and watch[1]:
            created = conn.execute(sql.CREATE_ALERT, {
                "watch_id": watch_id, "listing_id": listing_id, "price_cents": price_cents,
                "baseline_cents": median, "score": verdict.score, "reason": verdict.reason,
                "re_alerts": alerting.re_alerts_enabled, "cooldown_s": alerting.re_alerts_cooldown,
                "reextract": reextract,
            }).fetchone()
            alert_id = created[0] if created else None
            if alert_id is not None and watch[4]:
                deliver_alert.send_with_options(args=(alert_id,), dedupe_key=f"notify:{alert_id}")
    result = {"listing_id": listing_id, "product_key": extraction.product_key, "extractor": extraction.extractor,
              "deal": verdict.deal, "reason": verdict.reason, "alert_id": alert_id}
    log.info("extracted listing %s: %s", listing_id, result)
    return result


@dramatiq.actor(queue_name=QUEUE, max_retries=3, min_backoff=10_000)
def refresh_baselines() -> dict:
    """Recompute every product's baseline, then re-score every listing against it."""
    baselines = refresh_all_baselines()
    rescored = rescore_all()
    pruned = cache.prune()
    return {"baselines": baselines, "rescored": rescored, "cache_pruned": pruned,
            "rows_affected": baselines + rescored}


@dramatiq.actor(queue_name=QUEUE, max_retries=3, min_backoff=10_000)
def reextract_incomplete() -> dict:
    """The scheduled re-extraction: every listing whose extraction was incomplete,
    enqueued at priority 1 (ahead of new listings)."""
    from .tracker import reextract

    return {"rows_affected": reextract(store.broker(), incomplete=True)}


def refresh_all_baselines() -> int:
    scoring = settings.scoring()
    with store.pool().connection() as conn:
        count = conn.execute(sql.REFRESH_BASELINES, {"days": scoring.window_days, "product_key": None}).rowcount
    log.info("refreshed %d price baselines", count)
    return count


RESCORE_BATCH = 200


def rescore_pages(batch: int) -> Iterator[tuple[int, int]]:
    """Re-score every listing against the current baselines, ``batch`` rows at a
    time by id cursor (``WHERE id > cursor ORDER BY id LIMIT batch``), so one
    scored against a cold baseline is re-scored once it warms. Each page commits
    on its own: a large table is never held in one long transaction. Yields
    (cursor, rows) per page."""
    min_samples = settings.scoring().min_samples
    after = 0
    while True:
        with store.pool().connection() as conn:
            rows = conn.execute(sql.RESCORE_PAGE, {"after": after, "limit": batch}).fetchall()
            if not rows:
                return
            ids, scores, times, composites = [], [], [], []
            for lid, unit, kind, ends, first_seen, median, samples, now in rows:
                timing = time_score(listing_type=kind, auction_ends_at=ends, first_seen_at=first_seen, now=now)
                under = fraction_under(unit, median, samples, min_samples) if unit is not None else None
                ids.append(lid)
                scores.append(under)
                times.append(timing)
                composites.append(composite_score(under, timing))
            conn.execute(sql.SAVE_SCORES, {"ids": ids, "scores": scores, "time_scores": times,
                                           "composites": composites})
        yield after, len(rows)
        after = rows[-1][0]
        if len(rows) < batch:
            return


def rescore_all(batch: int | None = None) -> int:
    total = sum(n for _, n in rescore_pages(batch or RESCORE_BATCH))
    log.info("re-scored %d listings", total)
    return total
