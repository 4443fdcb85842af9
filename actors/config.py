"""The schema of the config's `pipeline:` section, validated when the config loads
(file, line and key on every error), with the runtime's checkers and duration grammar."""

from __future__ import annotations

from typing import Any

from supervisor.config.reader import Item, Reader, Schema, boolean, duration, integer, mapping, number, string

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


def parse_pipeline(reader: Reader, item: Item) -> dict[str, Any]:
    return mapping(reader, item, SCHEMA)
