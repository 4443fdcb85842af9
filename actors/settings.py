"""The bundled actors' settings, read from the config's ``pipeline:`` section.

Every value has a default, so the actors run without any configuration. Read at
call time (not import time) so a reload that changes ``pipeline:`` takes effect
in the processes it restarts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from supervisor import runtime
from supervisor.units import parse_duration

from .breaker import BreakerSettings

DEFAULT_USER_AGENT = "actor-supervisor/0.1 (price tracker; +https://github.com/actor-supervisor)"
SECTION = "pipeline"


def seconds(value: Any, what: str) -> float:
    """A duration in the config's grammar (the config validated it already; tests may set raw values)."""
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise ValueError(f"{SECTION}.{what}: {exc}") from None


def section(*path: str) -> Mapping[str, Any]:
    node: Any = runtime.section(SECTION)
    for key in path:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else {}


@dataclass(frozen=True)
class HttpSettings:
    user_agent: str = DEFAULT_USER_AGENT
    timeout: float = 15.0


def http() -> HttpSettings:
    s = section("http")
    return HttpSettings(
        user_agent=str(s.get("user_agent") or DEFAULT_USER_AGENT),
        timeout=seconds(s.get("timeout", 15.0), "http.timeout"),
    )


@dataclass(frozen=True)
class ScrapingSettings:
    max_inline_wait: float = 5.0  # sleep through rate-limit waits up to this; defer longer ones
    min_match_strength: float = 0.0


def scraping() -> ScrapingSettings:
    s = section("scraping")
    return ScrapingSettings(
        max_inline_wait=seconds(s.get("max_inline_wait", 5.0), "scraping.max_inline_wait"),
        min_match_strength=float(s.get("min_match_strength", 0.0)),
    )


def breaker() -> BreakerSettings:
    s = section("breaker")
    return BreakerSettings(
        threshold=int(s.get("threshold", 5)),
        cooldown_seconds=seconds(s.get("cooldown", 300), "breaker.cooldown"),
        probe_seconds=seconds(s.get("probe", 60), "breaker.probe"),
    )


@dataclass(frozen=True)
class LlmSettings:
    base_url: str
    model: str
    api_key: str | None
    concurrency: int = 2
    rate_per_minute: float = 60.0
    timeout: float = 30.0


def llm() -> LlmSettings | None:
    s = section("extraction", "llm")
    if not s or not s.get("base_url") or not s.get("model"):
        return None
    key_env = s.get("api_key_env")
    return LlmSettings(
        base_url=str(s["base_url"]).rstrip("/"),
        model=str(s["model"]),
        api_key=os.environ.get(str(key_env)) if key_env else None,
        concurrency=max(1, int(s.get("concurrency", 2))),
        rate_per_minute=float(s.get("rate_per_minute", 60)),
        timeout=seconds(s.get("timeout", 30), "extraction.llm.timeout"),
    )


@dataclass(frozen=True)
class ScoringSettings:
    deal_threshold: float = 0.15  # a deal is this fraction under the baseline median
    min_samples: int = 5  # a baseline with fewer listings is too cold to judge by
    window_days: int = 30


def scoring() -> ScoringSettings:
    s = section("scoring")
    return ScoringSettings(
        deal_threshold=float(s.get("deal_threshold", 0.15)),
        min_samples=int(s.get("min_samples", 5)),
        window_days=int(s.get("window_days", 30)),
    )


@dataclass(frozen=True)
class AlertSettings:
    re_alerts_enabled: bool = False
    re_alerts_cooldown: float = 24 * 3600.0


def alerts() -> AlertSettings:
    s = section("alerts")
    return AlertSettings(
        re_alerts_enabled=bool(s.get("re_alerts_enabled", False)),
        re_alerts_cooldown=seconds(s.get("re_alerts_cooldown", "24h"), "alerts.re_alerts_cooldown"),
    )


@dataclass(frozen=True)
class NotificationSettings:
    timeout: float = 10.0
    # After a worker died mid-request or a response timed out, the webhook may or
    # may not have the message. False (default): do not resend (no duplicates; the
    # alert stays unnotified with an 'unknown' attempt). True: resend, carrying the
    # same Idempotency-Key, for receivers that deduplicate.
    resend_unknown: bool = False
    username: str = "Price tracker"


def notification() -> NotificationSettings:
    s = section("notification")
    return NotificationSettings(
        timeout=seconds(s.get("timeout", 10), "notification.timeout"),
        resend_unknown=bool(s.get("resend_unknown", False)),
        username=str(s.get("username", "Price tracker")),
    )


@dataclass(frozen=True)
class ForecastSettings:
    horizon_days: int = 14
    min_days: int = 10
    history_days: int = 180
    level: float = 0.95


def forecasting() -> ForecastSettings:
    s = section("forecasting")
    return ForecastSettings(
        horizon_days=int(s.get("horizon_days", 14)),
        min_days=int(s.get("min_days", 10)),
        history_days=int(s.get("history_days", 180)),
        level=float(s.get("level", 0.95)),
    )
