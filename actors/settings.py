"""The bundled actors' settings, read from the config's ``pipeline:`` section.

Every value has a default, so the actors run without any configuration. Read at
call time (not import time) so a reload that changes ``pipeline:`` takes effect
in the processes it restarts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

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


def duration(default: float) -> Any:
    """A dataclass field holding seconds, given in the config's duration grammar."""
    return field(default=default, metadata={"duration": True})


T = TypeVar("T")
_TYPES: dict[str, Any] = {"float": float, "int": int, "bool": bool, "str": str}


def _read(cls: type[T], *path: str, keys: Mapping[str, str] | None = None, **fixed: Any) -> T:
    """Build ``cls`` from the section at ``path``: each field from its key (``keys``
    renames), else the field's own default, so every default is written once."""
    s = section(*path)
    values: dict[str, Any] = dict(fixed)
    for f in fields(cls):  # type: ignore[arg-type]
        key = (keys or {}).get(f.name, f.name)
        if f.name in fixed or s.get(key) is None:
            continue
        raw = s[key]
        if f.metadata.get("duration"):
            values[f.name] = seconds(raw, ".".join((*path, key)))
        else:
            values[f.name] = _TYPES.get(str(f.type).split(" ")[0], lambda v: v)(raw)
    return cls(**values)


@dataclass(frozen=True)
class HttpSettings:
    user_agent: str = DEFAULT_USER_AGENT
    timeout: float = duration(15.0)


def http() -> HttpSettings:
    return _read(HttpSettings, "http")


@dataclass(frozen=True)
class ScrapingSettings:
    max_inline_wait: float = duration(5.0)  # sleep through rate-limit waits up to this; defer longer ones
    min_match_strength: float = 0.0


def scraping() -> ScrapingSettings:
    return _read(ScrapingSettings, "scraping")


def breaker() -> BreakerSettings:
    return _read(BreakerSettings, "breaker", keys={"cooldown_seconds": "cooldown", "probe_seconds": "probe"})


@dataclass(frozen=True)
class LlmSettings:
    base_url: str
    model: str
    api_key: str | None
    concurrency: int = 2
    rate_per_minute: float = 60.0
    timeout: float = duration(30.0)


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
    deal_threshold: float = 0.15  # a deal is this fraction under the baseline median
    min_samples: int = 5  # a baseline with fewer listings is too cold to judge by
    window_days: int = 30


def scoring() -> ScoringSettings:
    return _read(ScoringSettings, "scoring")


@dataclass(frozen=True)
class AlertSettings:
    re_alerts_enabled: bool = False
    re_alerts_cooldown: float = duration(24 * 3600.0)


def alerts() -> AlertSettings:
    return _read(AlertSettings, "alerts")


@dataclass(frozen=True)
class NotificationSettings:
    timeout: float = duration(10.0)
    # After a worker died mid-request or a response timed out, the webhook may or
    # may not have the message. True (default, decision 6 of the refactor plan: a
    # rare duplicate after a timeout beats a lost alert): retry with backoff, every
    # attempt in the ledger, each carrying the same Idempotency-Key. False (strict):
    # never resend; the alert stays unnotified with an 'unknown' attempt until an
    # operator runs `supervisor alerts resend`.
    resend_unknown: bool = True
    username: str = "Price tracker"


def notification() -> NotificationSettings:
    return _read(NotificationSettings, "notification")


@dataclass(frozen=True)
class ForecastSettings:
    horizon_days: int = 14
    min_days: int = 10
    history_days: int = 180
    level: float = 0.95
    max_range_days: int = 90  # a requested range may end at most this long after the last observed day


def forecasting() -> ForecastSettings:
    return _read(ForecastSettings, "forecasting")


@dataclass(frozen=True)
class CacheSettings:
    enabled: bool = True
    ttl: float = duration(3600.0)  # a fetched search page is served from the cache this long


def cache() -> CacheSettings:
    return _read(CacheSettings, "cache")
