"""Is a listing a deal? Against the watch's target price or the product's baseline."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class Verdict:
    deal: bool
    score: float | None  # fraction under the baseline median (negative: over it)
    reason: str


def money(cents: float, currency: str = "USD") -> str:
    sign = {"USD": "$", "EUR": "€", "GBP": "£"}.get(currency, "")
    text = f"{cents / 100:,.2f}"
    return f"{sign}{text}" if sign else f"{text} {currency}"


def judge(*, unit_price_cents: float, currency: str, price_type: str, target_price_cents: int | None,
          deal_threshold: float, baseline_median: float | None, baseline_samples: int,
          min_samples: int) -> Verdict:
    median = baseline_median if baseline_median is not None and baseline_median > 0 else None
    score = fraction_under(unit_price_cents, median, baseline_samples, min_samples)
    warm = score is not None
    price = money(unit_price_cents, currency)
    if price_type == "sold":
        return Verdict(False, score, "already sold")
    if target_price_cents is not None and unit_price_cents <= target_price_cents:
        return Verdict(True, score, f"{price} is at or under the target {money(target_price_cents, currency)}")
    if median is not None and score is not None and score >= deal_threshold:
        return Verdict(True, score, f"{price} is {score:.0%} under the median {money(median, currency)}"
                                    f" of {baseline_samples} listings")
    if not warm and target_price_cents is None:
        return Verdict(False, score, f"no warm baseline yet ({baseline_samples} of {min_samples} listings)")
    return Verdict(False, score, "not a deal")


# The plan's time factor: an auction about to end is the most urgent, a listing
# new to the tracker next, everything else waits.
AUCTION_ENDING_SOON = timedelta(hours=4)
NEW_LISTING = timedelta(hours=24)
TIME_WEIGHT = 0.05  # of the composite score; the rest is value against the baseline


def time_score(*, listing_type: str, auction_ends_at: datetime | None, first_seen_at: datetime,
               now: datetime) -> int:
    if listing_type == "auction" and auction_ends_at is not None and auction_ends_at - now < AUCTION_ENDING_SOON:
        return 100
    if now - first_seen_at < NEW_LISTING:
        return 80
    return 30


def composite_score(fraction_under: float | None, time: int) -> float:
    """0..100: value (100 at half the baseline median or less, 0 at or over it;
    50 with no warm baseline) weighted 95%, the time score 5%."""
    value = 50.0 if fraction_under is None else max(0.0, min(100.0, fraction_under * 200.0))
    return round((1 - TIME_WEIGHT) * value + TIME_WEIGHT * time, 2)


def fraction_under(unit_price_cents: float, median: float | None, samples: int, min_samples: int) -> float | None:
    """How far under the baseline median the price is, once the baseline is warm."""
    if median is None or median <= 0 or samples < min_samples:
        return None
    return (median - unit_price_cents) / median
