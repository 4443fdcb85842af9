"""The runtime's flow-control options a tracker job carries (supervisor/flow.py).

A scrape carries its source's limits (key ``source:<id>``), an extraction that may ask
the model carries the model's (key ``llm:<model>``): the producer writes them into the
row, the claim applies them (the job waits in the database, status ``waiting``, holding
no thread) and takes from the bucket row of that key in ``rate_limiter_state``, the one
table ``supervisor.ratelimit`` also takes from. ``message_key`` tells a job whether it
was sent with them (a bare ``scrape_watch.send``, say, was not).
"""

from __future__ import annotations

from typing import Any

# The message option that names the key its limits apply to (supervisor.flow.KEY_OPTIONS).
KEY_OPTION = "rate_limit_key"


def per_minute_text(per_minute: float, burst: int) -> str:
    """``rate_limit``'s text for a rate per minute: "30/m burst 5" (no exponent, which
    the option's grammar does not read)."""
    return f"{f'{per_minute:.6f}'.rstrip('0').rstrip('.')}/m burst {burst}"


def options(key: str, *, per_minute: float | None, burst: int = 1, daily_quota: int | None = None,
            concurrency: int | None = None) -> dict[str, Any]:
    """The message options limiting a job to ``key``: a rate (None or <= 0: none), a
    daily quota (None: none), a concurrency limit (None: none). The key is a literal:
    its braces are escaped so the template renders it as given."""
    out: dict[str, Any] = {KEY_OPTION: key.replace("{", "{{").replace("}", "}}")}
    if per_minute is not None and per_minute > 0:
        out["rate_limit"] = per_minute_text(per_minute, burst)
    if daily_quota is not None:
        out["daily_quota"] = daily_quota
    if concurrency is not None:
        out["concurrency_limit"] = concurrency
    return out


def message_key(message: Any) -> str | None:
    """The literal key a message's limits apply to (None: it carries none of ours)."""
    if message is None:
        return None
    key = message.options.get(KEY_OPTION)
    return key.replace("{{", "{").replace("}}", "}") if isinstance(key, str) else None
