"""Flow control for any actor: the options, their checks, a job's limit key, RateLimited.

An actor (or one message, through ``send_with_options``) may declare

  rate_limit="30/m"            tokens refilled at 30 a minute (also /s, /h, /d), burst 1;
                               "20/s burst 5" lets 5 start at once after a quiet spell
  daily_quota=1000             at most 1,000 starts per UTC day
  concurrency_limit=4          at most 4 running at once (``concurrency_key`` alone: 1)
  fairness_weight=2            this key's share when keys take turns (default 1)
  rate_limit_key= / concurrency_key= / fairness_key=
                               the key the limits apply to: a template over the message
                               ("shop:{kwargs[source]}", "{args[0]}", "{queue}", "{actor}")
                               or, on the actor only, a callable ``key(message) -> str``
                               run by the producer; default: the actor's name

A job has one limit key: every limit it carries applies to it, and the key options it
gives must agree (a job limited by shop and made fair by tenant is two actors, one
sending the other). The producer writes the key and the limits into the row
(``flow_key``, ``flow``) and the row waits (``status = 'waiting'``) until a claim finds
its key allowed (broker/sql/flow.py): no thread and no lease are held meanwhile.

A bad option fails at the actor's definition (``JobOptions.before_declare_actor``) or at
send (a message's own options), with one ``LimitOptionError`` naming the actor and the
option. A key that cannot be made for one message (a template field it lacks, a
callable that raised) does not stop the send: that job alone fails at its claim, with
the reason as its error (``KEY_ERROR`` in its options, read by ``message._check``).
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import re
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import dramatiq

# The options, as actor options (JobOptions declares them) and message options.
RATE_LIMIT, DAILY_QUOTA, CONCURRENCY_LIMIT, FAIRNESS_WEIGHT = (
    "rate_limit", "daily_quota", "concurrency_limit", "fairness_weight")
KEY_OPTIONS = ("rate_limit_key", "concurrency_key", "fairness_key")
LIMIT_OPTIONS = (RATE_LIMIT, DAILY_QUOTA, CONCURRENCY_LIMIT, FAIRNESS_WEIGHT)
OPTIONS = frozenset(KEY_OPTIONS + LIMIT_OPTIONS)
# Where a key that could not be made travels to the claim, which fails the job with it.
KEY_ERROR = "limit_key_error"
# Template fields a key may name: the message's parts and names.
_ROOTS = ("args", "kwargs", "options", "actor", "queue")
_PER_SECOND = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(s|m|h|d)\s*(?:(?:,\s*)?burst\s+(\d+))?\s*$")
# Longest key kept (the bucket's and the row's): keys are names, not documents.
MAX_KEY_LENGTH = 200
_RATE_HELP = "write N/s, N/m, N/h or N/d, optionally with a burst: '30/m', '20/s burst 5'"


class LimitOptionError(ValueError):
    """A flow-control option that cannot be used; the text names the actor and the option."""

    def __init__(self, actor: str, option: str, value: Any, why: str) -> None:
        super().__init__(f"actor {actor!r}: {option}={value!r:.80}: {why}")
        self.actor = actor
        self.option = option
        self.why = why


class RateLimited(dramatiq.Retry):
    """Raised by an actor when upstream says slow down (HTTP 429, a quota message).

    The job's limit key is blocked for ``retry_after`` seconds on every process and
    host, the job goes back to wait for it without spending a retry, and no job of
    that key is claimed meanwhile. A job with no limit key is put back for
    ``retry_after`` seconds, its retries untouched. Under a broker other than
    PostgresBroker it is Dramatiq's ``Retry`` with that delay."""

    def __init__(self, retry_after: float = 1.0, message: str = "") -> None:
        if isinstance(retry_after, bool) or not isinstance(retry_after, int | float) \
                or not math.isfinite(retry_after) or retry_after < 0:
            raise ValueError(f"retry_after must be a number of seconds >= 0, not {retry_after!r}")
        super().__init__(message or f"rate limited upstream: retry after {retry_after:g}s",
                         delay=int(retry_after * 1000))
        self.retry_after = float(retry_after)

    @classmethod
    def from_response(cls, response: Any, default: float = 30.0) -> RateLimited:
        """From an HTTP response's ``Retry-After`` header (seconds or an HTTP date; any
        object with ``headers``), else ``default``: ``raise RateLimited.from_response(r)``."""
        return cls(retry_after_seconds(getattr(response, "headers", {}).get("Retry-After"), default),
                   f"HTTP {getattr(response, 'status_code', 429)}: rate limited upstream")


def retry_after_seconds(value: str | None, default: float) -> float:
    """Seconds a ``Retry-After`` header asks for (a number or an HTTP date), else ``default``."""
    if not value:
        return default
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return default
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


@dataclass(frozen=True)
class Limits:
    """What a claim applies to a key (None: no such limit). ``as_json`` is the row's ``flow``."""

    rate_per_second: float | None = None
    burst: int = 1
    daily_quota: int | None = None
    concurrency: int | None = None
    weight: int = 1

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.rate_per_second is not None:
            out["r"], out["b"] = self.rate_per_second, self.burst
        if self.daily_quota is not None:
            out["q"] = self.daily_quota
        if self.concurrency is not None:
            out["c"] = self.concurrency
        if self.weight != 1:
            out["w"] = self.weight
        return out

    @functools.cached_property
    def json(self) -> str:
        """``as_json`` as the compact text a row's ``flow`` column is written from."""
        return json.dumps(self.as_json(), separators=(",", ":"))


Key = str | Callable[[Any], Any]


@dataclass(frozen=True)
class Plan:
    """An actor's (or a message's) flow control: its key (a template or a callable) and limits."""

    actor: str
    key_option: str | None  # which option named the key (None: the actor's name is the key)
    key: Key
    limits: Limits

    def key_for(self, message: Any) -> str:
        """The key of one message; raises ValueError (its reason) when it cannot be made."""
        if callable(self.key):
            try:
                value = self.key(message)
            except Exception as exc:
                raise ValueError(f"{self.key_option} callable raised {type(exc).__name__}: {exc}") from None
        else:
            try:
                value = string.Formatter().vformat(self.key, (), _fields(message))
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                raise ValueError(f"{self.key_option}={self.key!r} cannot be filled from this message:"
                                 f" {type(exc).__name__} {exc}") from None
        if not isinstance(value, str) or not value:
            raise ValueError(f"{self.key_option} gave {value!r:.60}, not a non-empty string")
        if len(value) > MAX_KEY_LENGTH:
            raise ValueError(f"{self.key_option} gave a key of {len(value)} characters (at most {MAX_KEY_LENGTH})")
        return value


def _fields(message: Any) -> dict[str, Any]:
    return {"args": list(message.args), "kwargs": message.kwargs, "options": message.options,
            "actor": message.actor_name, "queue": message.queue_name}


def parse_rate(actor: str, value: Any) -> tuple[float, int]:
    """Tokens per second and burst of a ``rate_limit`` value; LimitOptionError if it is none."""
    match = _RATE.match(value) if isinstance(value, str) else None
    if match is None:
        raise LimitOptionError(actor, RATE_LIMIT, value, f"not a rate: {_RATE_HELP}")
    count, unit, burst = float(match[1]), match[2], int(match[3] or 1)
    if count <= 0:
        raise LimitOptionError(actor, RATE_LIMIT, value, "the rate must be above 0")
    if burst < 1:
        raise LimitOptionError(actor, RATE_LIMIT, value, "the burst must be at least 1")
    return count / _PER_SECOND[unit], burst


def _positive_int(actor: str, option: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LimitOptionError(actor, option, value, "expected a whole number >= 1")
    return value


def _check_template(actor: str, option: str, template: str, fn: Callable[..., Any] | None) -> None:
    """A key template names only the message's parts, by index or key (no attributes), and,
    when the actor's function is known, only its parameters."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise LimitOptionError(actor, option, template, f"not a template: {exc}") from None
    params = _parameters(fn)
    for _, field, _, _ in parsed:
        if field is None:
            continue
        root, _, rest = field.partition("[")
        if root not in _ROOTS or "." in field or (rest and not rest.endswith("]")):
            raise LimitOptionError(actor, option, template,
                                   f"field {{{field}}}: name args[i], kwargs[name], options[name], actor or queue")
        item = rest[:-1].split("]")[0] if rest else None
        if params is None or item is None:
            continue
        names, positional, var_args, var_kwargs = params
        if root == "kwargs" and item not in names and not var_kwargs:
            raise LimitOptionError(actor, option, template,
                                   f"field {{{field}}}: the actor has no parameter {item!r}")
        if root == "args" and item.isdigit() and int(item) >= positional and not var_args:
            raise LimitOptionError(actor, option, template,
                                   f"field {{{field}}}: the actor takes {positional} positional arguments")


def _parameters(fn: Callable[..., Any] | None) -> tuple[set[str], int, bool, bool] | None:
    if fn is None:
        return None
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    kinds = inspect.Parameter
    names = {p.name for p in params if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)}
    positional = sum(p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD) for p in params)
    return (names, positional, any(p.kind == kinds.VAR_POSITIONAL for p in params),
            any(p.kind == kinds.VAR_KEYWORD for p in params))


def plan(actor: str, options: Mapping[str, Any], fn: Callable[..., Any] | None = None, *,
         from_message: frozenset[str] = frozenset()) -> Plan | None:
    """The flow control ``options`` declare (None: none), checked; LimitOptionError if one
    is bad. ``from_message``: the options a message gave itself (no callable key there:
    a message's options are stored as JSON)."""
    if not any(options.get(name) is not None for name in OPTIONS):
        return None
    keys = {name: options[name] for name in KEY_OPTIONS if options.get(name) is not None}
    for name, value in keys.items():
        if callable(value):
            if name in from_message:
                raise LimitOptionError(actor, name, value, "a callable key is an actor option only"
                                       " (a message's options are stored as JSON)")
        elif not isinstance(value, str) or not value:
            raise LimitOptionError(actor, name, value, "expected a key template (a non-empty string) or a callable")
        else:
            _check_template(actor, name, value, fn)
    if len(set(map(_identity, keys.values()))) > 1:
        first, second = list(keys)[:2]
        raise LimitOptionError(actor, second, keys[second],
                               f"differs from {first}={keys[first]!r}: a job's limits apply to one key")
    rate, burst = (None, 1)
    if options.get(RATE_LIMIT) is not None:
        rate, burst = parse_rate(actor, options[RATE_LIMIT])
    quota = options.get(DAILY_QUOTA)
    concurrency = options.get(CONCURRENCY_LIMIT)
    weight = options.get(FAIRNESS_WEIGHT)
    limits = Limits(
        rate_per_second=rate, burst=burst,
        daily_quota=None if quota is None else _positive_int(actor, DAILY_QUOTA, quota),
        # concurrency_key alone keeps its meaning: at most one running
        concurrency=(_positive_int(actor, CONCURRENCY_LIMIT, concurrency) if concurrency is not None
                     else 1 if "concurrency_key" in keys else None),
        weight=1 if weight is None else _positive_int(actor, FAIRNESS_WEIGHT, weight),
    )
    key_option = next(iter(keys), None)
    return Plan(actor, key_option, keys[key_option] if key_option else actor, limits)


def _identity(key: Any) -> Any:
    return key if isinstance(key, str) else id(key)


def merged_plan(actor_name: str, actor_options: Mapping[str, Any], message_options: Mapping[str, Any],
                fn: Callable[..., Any] | None = None) -> Plan | None:
    """A message's flow control: its own options over its actor's."""
    merged = {name: actor_options.get(name) for name in OPTIONS}
    own = {name: message_options[name] for name in OPTIONS if message_options.get(name) is not None}
    if own and any(name in KEY_OPTIONS for name in own):
        for name in KEY_OPTIONS:  # a message's own key replaces its actor's, whichever option names it
            merged[name] = None
    merged.update(own)
    return plan(actor_name, merged, fn, from_message=frozenset(own))
