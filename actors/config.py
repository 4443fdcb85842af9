"""The schema of the config's `pipeline:` section, validated when the config loads
(file, line and key on every error), with the runtime's checkers and duration grammar.

``sources`` and ``watches`` are mappings of name -> entry, checked with the same
checks as the CLI's (actors/catalog.py) and synced into the database by name at
every worker's start (so at `supervisor run` and on every reload)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from supervisor.config.reader import (
    Item,
    Reader,
    Schema,
    boolean,
    duration,
    integer,
    mapping,
    number,
    string,
)

from . import catalog

SCHEMA: Schema = {
    "http": {"user_agent": string, "timeout": duration(0, strict=True)},
    "scraping": {"max_inline_wait": duration(0), "min_match_strength": number(0, 1)},
    "breaker": {"threshold": integer(1), "cooldown": duration(0), "probe": duration(0)},
    "extraction": {
        "llm": {
            "base_url": string,
            "model": string,
            "api_key_env": string,
            "concurrency": integer(1),
            "rate_per_minute": number(0),
            "timeout": duration(0, strict=True),
        },
    },
    "scoring": {"deal_threshold": number(0, 1), "min_samples": integer(1), "window_days": integer(1)},
    "alerts": {"re_alerts_enabled": boolean, "re_alerts_cooldown": duration(0)},
    "notification": {"timeout": duration(0, strict=True), "resend_unknown": boolean, "username": string},
    "forecasting": {"horizon_days": integer(1), "min_days": integer(1), "history_days": integer(1),
                    "level": number(0, 1), "max_range_days": integer(1)},
    "cache": {"enabled": boolean, "ttl": duration(0)},
}


def _text(check: Callable[[str], Any]) -> Callable[[Item], Any]:
    return lambda item: check(string(item))


def _format(item: Item) -> str:
    value = string(item)
    if value not in catalog.FORMATS:
        raise ValueError(f"must be one of {', '.join(catalog.FORMATS)}, got {value!r}")
    return value


SOURCE: Schema = {
    "search_url": _text(catalog.check_search_url), "format": _format, "rate_per_minute": number(0.001),
    "burst": integer(1), "daily_quota": integer(0), "enabled": boolean,
}
WATCH: Schema = {
    "source": string, "query": string, "target_price": lambda item: catalog.price_cents(item.value),
    "deal_threshold": lambda item: catalog.check_threshold(number(0, 1)(item)),
    "webhook": _text(catalog.check_webhook), "every": duration(1), "enabled": boolean,
    "re_alerts": boolean,
}
NAMED: dict[str, tuple[Schema, tuple[str, ...]]] = {
    "sources": (SOURCE, ("search_url",)),
    "watches": (WATCH, ("source", "query")),
}


def _named(reader: Reader, item: Item, schema: Schema, required: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(item.value, dict):
        raise reader.error(item, "must be a mapping of name: {...}")
    out: dict[str, Any] = {}
    for name, child in item.value.items():
        try:
            catalog.check_name(name)
        except ValueError as exc:
            raise reader.error(child, str(exc)) from None
        entry = mapping(reader, child, schema)
        for key in required:
            if key not in entry:
                raise reader.error(child, "is required", key=f"{child.key}.{key}")
        if "target_price" in entry and "deal_threshold" in entry:
            raise reader.error(child, "target_price and deal_threshold exclude each other: give one")
        out[name] = entry
    return out


def parse_pipeline(reader: Reader, item: Item) -> dict[str, Any]:
    value = item.value if isinstance(item.value, dict) else None
    rest = item if value is None else Item({k: v for k, v in value.items() if k not in NAMED}, item.line, item.key)
    out = mapping(reader, rest, {**SCHEMA})
    for key, (schema, required) in NAMED.items():
        child = value.get(key) if value else None
        if child is not None and child.value is not None:
            out[key] = _named(reader, child, schema, required)
    return out
