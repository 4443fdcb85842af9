"""Attribute extraction through an OpenAI-compatible chat completions API.

Bounded for the whole fleet, on the key ``llm:<model>``:

- An extraction job that may ask the model carries the model's limits as its message
  options (``limits``: ``rate_per_minute`` with a burst of ``concurrency``, and
  ``concurrency_limit=concurrency``; extraction.py's producers add them). The claim
  applies them: a job the model cannot take yet waits in the database (status
  ``waiting``), holding no thread. A 429 raises ``RateLimited``: the key is blocked
  for its Retry-After on every host and the job goes back without spending a retry.
- Outside a job (``tracker reextract --now``, a direct call) no claim took a token,
  so ``extract`` takes one from the same bucket row (``supervisor.ratelimit``, the
  one table), sleeping in that caller's own thread up to the timeout.
- Either way each request holds one of ``concurrency`` fleet-wide slots (a
  PostgreSQL semaphore: advisory locks a killed process cannot leak, see
  queries/slots.py), so jobs and a ``--now`` run share one cap.

Any other failure, or no free slot or token within the timeout outside a job, falls
back to the rules, so a slow or broken model never stalls the pipeline.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import httpx

from supervisor import RateLimited, backoff, ratelimit

from . import extract_rules, http, pacing, settings
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


class LlmRateLimited(LlmUnavailable):
    """The model answered 429: slow down for ``retry_after`` seconds."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"HTTP 429, retry after {retry_after:.0f}s")
        self.retry_after = retry_after


def limit_key(cfg: LlmSettings) -> str:
    return f"llm:{cfg.model}"


def limits(cfg: LlmSettings) -> dict[str, Any]:
    """The message options of an extraction that may ask the model: its rate (burst: the
    concurrency) and its concurrency, on the model's key. A change of the settings
    applies to the jobs sent after it; a job already waiting keeps what it was sent with
    (the claim reads a key's limits from its first waiting job)."""
    return pacing.options(limit_key(cfg), per_minute=cfg.rate_per_minute, burst=cfg.concurrency,
                          concurrency=cfg.concurrency)


def job_options() -> dict[str, Any]:
    """The message options of an extraction job: the model's limits when one is configured,
    else none. Every producer of ``extract_listing`` adds them (a job sent without them is
    sent again with them by its first run, extraction.py)."""
    cfg = settings.llm()
    return {} if cfg is None else limits(cfg)


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
    if response.status_code == 429:
        raise LlmRateLimited(http.retry_after_seconds(response))
    if response.status_code != 200:
        raise LlmUnavailable(f"HTTP {response.status_code}")
    try:
        content = response.json()["choices"][0]["message"]["content"]
        return _clean(json.loads(content))
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise LlmUnavailable(f"unreadable answer: {type(exc).__name__}: {exc}") from None


def extract(cfg: LlmSettings, pool, title: str, description: str | None,
            condition: str | None, *, in_job: bool = False) -> extract_rules.Extraction:
    """``in_job``: called by a job that carries ``limits(cfg)`` (its token was taken at its
    claim; a 429 raises RateLimited). Else a token is taken here (see the module's text)."""
    rules = extract_rules.extract(title, description, condition)
    key = limit_key(cfg)
    if not in_job and cfg.rate_per_minute > 0:
        limit = ratelimit.Limit(per_minute=cfg.rate_per_minute, burst=cfg.concurrency)
        decision = ratelimit.acquire(pool.connection, key, limit, max_wait=cfg.timeout)
        if not decision.granted:
            return _fallback(rules, f"rate limit ({decision.reason}, {decision.wait_seconds:.0f}s)")
    try:
        with fleet_slot(pool, key, cfg.concurrency, cfg.timeout):
            attrs = complete(cfg, title, description)
    except LlmRateLimited as exc:
        if in_job:
            raise RateLimited(retry_after=exc.retry_after, message=f"model {cfg.model}: {exc}") from None
        with pool.connection() as conn:  # the jobs of this key hold off too
            ratelimit.block(conn, key, exc.retry_after)
        return _fallback(rules, str(exc))
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
