"""Attribute extraction through an OpenAI-compatible chat completions API.

Bounded twice, both for the whole fleet: a PostgreSQL semaphore (``concurrency``
requests in flight across every process and host: advisory locks a killed
process cannot leak, see queries/slots.py) and the shared rate limiter
(``rate_per_minute``, key ``llm:<model>``). Any failure, or no free slot within
the timeout, falls back to the rules, so a slow or broken model never stalls
the pipeline.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import httpx

from supervisor import backoff, ratelimit

from . import extract_rules, http
from .queries import slots as slots_sql
from .settings import LlmSettings

log = logging.getLogger(__name__)

PROMPT = """You extract structured attributes from marketplace listing titles for computer parts.
Answer with one JSON object and nothing else, using only these keys (omit unknown ones):
component (ram|ssd|hdd|gpu|cpu|other), brand (lowercase), capacity_gb (number, total),
modules (integer), module_gb (number), memory_type (ddr3|ddr4|ddr5), speed_mts (integer),
form_factor (dimm|sodimm|rdimm|m.2|2.5in|3.5in), interface (nvme|sata|sas), rpm (integer),
gpu_model (e.g. rtx3080ti), cpu_model (e.g. i7-12700k), condition (new|open box|used|refurbished|for parts),
quantity (integer number of identical items sold together)."""

_KEYS = {"component": str, "brand": str, "capacity_gb": float, "modules": int, "module_gb": float,
         "memory_type": str, "speed_mts": int, "form_factor": str, "interface": str, "rpm": int,
         "gpu_model": str, "cpu_model": str, "condition": str, "quantity": int}



class LlmUnavailable(Exception):
    pass


@contextlib.contextmanager
def fleet_slot(pool, key: str, slots: int, wait: float) -> Iterator[None]:
    """Hold one of ``slots`` fleet-wide slots for ``key`` while the block runs;
    LlmUnavailable when none frees up within ``wait`` seconds. The slot's
    transaction (and its connection) stays open until the block ends."""
    deadline = time.monotonic() + wait
    with pool.connection() as conn:
        for delay in backoff.delays(first=0.02, cap=0.25):
            with conn.transaction():
                if any(conn.execute(slots_sql.TRY_SLOT, {"key": key, "slot": n}).fetchone()[0]
                       for n in range(slots)):
                    yield  # the block's exception, if any, rolls back: the slot is free either way
                    return
            if time.monotonic() + delay > deadline:
                raise LlmUnavailable(f"all {slots} fleet-wide slots busy for {wait:.0f}s")
            time.sleep(delay)


def _clean(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise LlmUnavailable(f"model answered a {type(data).__name__}, not an object")
    out: dict[str, Any] = {}
    for key, kind in _KEYS.items():
        value = data.get(key)
        if value in (None, "", "unknown"):
            continue
        try:
            out[key] = kind(value).strip().lower() if kind is str else kind(value)
        except (TypeError, ValueError):
            continue
    return out


def complete(cfg: LlmSettings, title: str, description: str | None) -> dict[str, Any]:
    body = {
        "model": cfg.model,
        "temperature": 0,
        "response_format": {"type": "json_object"},
        "messages": [
            {"role": "system", "content": PROMPT},
            {"role": "user", "content": title + (f"\n\n{description[:1000]}" if description else "")},
        ],
    }
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    try:
        with http.client(timeout=cfg.timeout) as client:
            response = client.post(f"{cfg.base_url}/chat/completions", json=body, headers=headers)
    except httpx.TransportError as exc:
        raise LlmUnavailable(f"{type(exc).__name__}: {exc}") from None
    if response.status_code != 200:
        raise LlmUnavailable(f"HTTP {response.status_code}")
    try:
        content = response.json()["choices"][0]["message"]["content"]
        return _clean(json.loads(content))
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise LlmUnavailable(f"unreadable answer: {type(exc).__name__}: {exc}") from None


def extract(cfg: LlmSettings, pool, title: str, description: str | None,
            condition: str | None) -> extract_rules.Extraction:
    rules = extract_rules.extract(title, description, condition)
    limit = ratelimit.Limit(per_minute=cfg.rate_per_minute, burst=cfg.concurrency)
    decision = ratelimit.acquire(pool.connection, f"llm:{cfg.model}", limit, max_wait=cfg.timeout)
    if not decision.granted:
        return _fallback(rules, f"rate limit ({decision.reason}, {decision.wait_seconds:.0f}s)")
    try:
        with fleet_slot(pool, f"llm:{cfg.model}", cfg.concurrency, cfg.timeout):
            attrs = complete(cfg, title, description)
    except LlmUnavailable as exc:
        return _fallback(rules, str(exc))
    # The model's reading wins; the rules fill in what it left out.
    merged = {**rules.attributes, **attrs}
    quantity = int(merged.get("quantity") or 1)
    return extract_rules.Extraction(merged, extract_rules.product_key(merged, title), max(1, quantity),
                                    f"llm:{cfg.model}")


def _fallback(rules: extract_rules.Extraction, why: str) -> extract_rules.Extraction:
    log.warning("LLM extraction unavailable (%s); using the rules", why)
    return extract_rules.Extraction(rules.attributes, rules.product_key, rules.quantity,
                                    "rules (llm unavailable)", [*rules.notes, why])
