"""Is a listing a deal? Against the watch's target price or the product's baseline."""

from __future__ import annotations

from dataclasses import dataclass


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
    warm = median is not None and baseline_samples >= min_samples
    score = (median - unit_price_cents) / median if median is not None and warm else None
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
