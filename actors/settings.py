"""The bundled actors' settings, read from the config's ``pipeline:`` section.

Every value has a default, so the actors run without any configuration. Read at
call time (not import time) so a reload that changes ``pipeline:`` takes effect
in the processes it restarts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from supervisor import runtime
from supervisor.config import checks as check
from supervisor.config.checks import Item
from supervisor.config.keys import declared, key

from .breaker import BreakerSettings

DEFAULT_USER_AGENT = "actor-supervisor/0.1 (price tracker; +https://github.com/actor-supervisor)"
SECTION = "pipeline"


def section(*path: str) -> Mapping[str, Any]:
    node: Any = runtime.section(SECTION)
    for name in path:
        node = node.get(name) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else {}


T = TypeVar("T")


def _read(cls: type[T], *path: str, **fixed: Any) -> T:
    """Build ``cls`` from the section at ``path``: each key declared on its fields, checked
    by its declaration, else the field's own default, so every default is written once.
    The config checked the values already; the check runs again for values set in code
    (tests), so every check here takes its own output back unchanged."""
    s = section(*path)
    values: dict[str, Any] = dict(fixed)
    for k in declared(cls):
        if k.field in fixed or s.get(k.name) is None or k.check is None:
            continue
        where = ".".join((SECTION, *path, k.name))
        try:
            values[k.field] = k.check(Item(s[k.name], 0, where))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    return cls(**values)


@dataclass(frozen=True)
class HttpSettings:
    user_agent: str = key(check.string, "The User-Agent of every request.", DEFAULT_USER_AGENT)
    timeout: float = key(check.duration(0, strict=True), "Longest a request may take.", 15.0)


def http() -> HttpSettings:
    return _read(HttpSettings, "http")


@dataclass(frozen=True)
class ScrapingSettings:
    # Read by nothing since scrapes wait for their source's token in the database (flow
    # control, scraping.py); still accepted, so a config that sets it keeps loading.
    max_inline_wait: float = key(check.duration(0), "Unused: a scrape waits for its source's token in the database,"
                                 " holding no thread (kept so configs that set it load).", 5.0)
    min_match_strength: float = key(check.number(0, 1), "A listing whose title matches the watch's query less "
                                    "than this (0-1) is not stored.", 0.0)


def scraping() -> ScrapingSettings:
    return _read(ScrapingSettings, "scraping")


def breaker() -> BreakerSettings:
    return _read(BreakerSettings, "breaker")


@dataclass(frozen=True)
class LlmSettings:
    api_key: str | None  # read from the variable api_key_env names, never from the file
    base_url: str = key(check.string, "An OpenAI-compatible API's base URL; with model, listings are extracted by "
                        "the model (else by the rules only).", shown="unset: rules only")
    model: str = key(check.string, "The model's name.", shown="unset: rules only")
    api_key_env: str | None = key(check.string, "The environment variable holding the API key.", None)
    concurrency: int = key(check.integer(1), "Requests to the model at once, across every host.", 2)
    rate_per_minute: float = key(check.number(0), "Requests to the model per minute, across every host.", 60.0)
    timeout: float = key(check.duration(0, strict=True), "Longest a request to the model may take.", 30.0)


def llm() -> LlmSettings | None:
    s = section("extraction", "llm")
    if not s or not s.get("base_url") or not s.get("model"):
        return None
    key_env = s.get("api_key_env")
    settings = _read(LlmSettings, "extraction", "llm", base_url=str(s["base_url"]).rstrip("/"),
                     api_key=os.environ.get(str(key_env)) if key_env else None)
    return replace(settings, concurrency=max(1, settings.concurrency))


@dataclass(frozen=True)
class ScoringSettings:
    deal_threshold: float = key(check.number(0, 1), "A listing is a deal this fraction under its baseline's "
                                "median price (a watch's own target_price or deal_threshold wins).", 0.15)
    min_samples: int = key(check.integer(1), "A baseline with fewer listings is too cold to judge by.", 5)
    window_days: int = key(check.integer(1), "Days of prices a baseline is made of.", 30)


def scoring() -> ScoringSettings:
    return _read(ScoringSettings, "scoring")


@dataclass(frozen=True)
class AlertSettings:
    re_alerts_enabled: bool = key(check.boolean, "A listing may alert again (a watch's re_alerts wins).", False)
    re_alerts_cooldown: float = key(check.duration(0), "A listing notified this recently does not alert again.",
                                    24 * 3600.0)


def alerts() -> AlertSettings:
    return _read(AlertSettings, "alerts")


@dataclass(frozen=True)
class NotificationSettings:
    timeout: float = key(check.duration(0, strict=True), "Longest a webhook request may take.", 10.0)
    # After a worker died mid-request or a response timed out, the webhook may or
    # may not have the message. True (default, decision 6 of the refactor plan: a
    # rare duplicate after a timeout beats a lost alert): retry with backoff, every
    # attempt in the ledger, each carrying the same Idempotency-Key. False (strict):
    # never resend; the alert stays unnotified with an 'unknown' attempt until an
    # operator runs `supervisor alerts resend`.
    resend_unknown: bool = key(check.boolean, "Send again, with backoff and the same Idempotency-Key, an alert "
                               "whose delivery outcome is unknown (false: `supervisor alerts resend` does it).", True)
    username: str = key(check.string, "The name a Discord webhook posts alerts under.", "Price tracker")


def notification() -> NotificationSettings:
    return _read(NotificationSettings, "notification")


@dataclass(frozen=True)
class ForecastSettings:
    horizon_days: int = key(check.integer(1), "Days a forecast looks ahead.", 14)
    min_days: int = key(check.integer(1), "Days of prices a product needs before it is forecast.", 10)
    history_days: int = key(check.integer(1), "Days of prices a forecast is fitted to.", 180)
    level: float = key(check.number(0, 1), "The forecast interval's confidence level.", 0.95)
    max_range_days: int = key(check.integer(1), "A requested range may end at most this long after the last "
                              "observed day.", 90)


def forecasting() -> ForecastSettings:
    return _read(ForecastSettings, "forecasting")


@dataclass(frozen=True)
class CacheSettings:
    enabled: bool = key(check.boolean, "Cache fetched search pages in the database, shared by every "
                        "process (a hit costs the source no request).", True)
    ttl: float = key(check.duration(0), "How long a fetched page is served from the cache.", 3600.0)


def cache() -> CacheSettings:
    return _read(CacheSettings, "cache")
