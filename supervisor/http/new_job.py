"""``POST /api/v1/jobs``: a job from a JSON body, checked field by field.

The body names the actor by name (this process imports no actor), its queue,
args, kwargs and options. Each bad field is one 400 error naming the field and
what it takes; a good body becomes a Dramatiq message the broker writes as any
``actor.send_with_options`` would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dramatiq import Message

from .. import flow
from ..config.reader import NAME

FIELDS = ("actor", "queue", "args", "kwargs", "options")
# The options a caller may set, with the check each passes (name -> (type, what it takes)).
OPTIONS: dict[str, tuple[type, str]] = {
    "delay": (int, "milliseconds to wait before the job may start (an integer >= 0)"),
    "priority": (int, "an integer; higher runs first"),
    "dedupe_key": (str, "a non-empty string; a live job with the same key is returned instead"),
    "concurrency_key": (str, "a non-empty string; at most one job per key runs at a time"),
    "max_retries": (int, "an integer >= 0"),
    # flow control (supervisor/flow.py), checked as at send; an actor's own limits apply too,
    # added by the worker that claims the job (broker/consuming/late_keys.py)
    "rate_limit": (str, "a rate: '30/m', '20/s burst 5' (N/s, N/m, N/h or N/d)"),
    "rate_limit_key": (str, "a key template over the message, e.g. 'shop:{kwargs[shop]}'"),
    "daily_quota": (int, "an integer >= 1: starts per UTC day"),
    "concurrency_limit": (int, "an integer >= 1: running at once per key"),
    "fairness_key": (str, "a key template over the message: keys take turns"),
    "fairness_weight": (int, "an integer >= 1: the key's share of the turns"),
}


class InvalidJob(ValueError):
    """One bad field: the message says which and what it takes."""


@dataclass(frozen=True)
class NewJob:
    message: Message[Any]
    delay_ms: int


def _name(body: dict[str, Any], key: str, default: str | None = None) -> str:
    value = body.get(key, default)
    if not isinstance(value, str) or not NAME.match(value) or len(value) > 200:
        raise InvalidJob(f"{key}: must be a name of letters, digits, '_', '.', '-' (got {value!r})")
    return value


def parse(body: dict[str, Any]) -> NewJob:
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise InvalidJob(f"{unknown[0]}: unknown field (the fields are {', '.join(FIELDS)})")
    if "actor" not in body:
        raise InvalidJob("actor: required (the actor's name, as declared with @dramatiq.actor)")
    actor = _name(body, "actor")
    queue = _name(body, "queue", "default")
    args = body.get("args", [])
    if not isinstance(args, list):
        raise InvalidJob(f"args: must be a JSON array (got {type(args).__name__})")
    kwargs = body.get("kwargs", {})
    if not isinstance(kwargs, dict):
        raise InvalidJob(f"kwargs: must be a JSON object (got {type(kwargs).__name__})")
    options = body.get("options", {})
    if not isinstance(options, dict):
        raise InvalidJob(f"options: must be a JSON object (got {type(options).__name__})")
    checked: dict[str, Any] = {}
    for key, value in options.items():
        if key not in OPTIONS:
            raise InvalidJob(f"options.{key}: unknown option (the options are {', '.join(OPTIONS)})")
        kind, what = OPTIONS[key]
        ok = isinstance(value, kind) and not isinstance(value, bool)
        if ok and kind is int and key in ("delay", "max_retries"):
            ok = value >= 0
        if ok and kind is str:
            ok = bool(value.strip())
        if not ok:
            raise InvalidJob(f"options.{key}: must be {what} (got {value!r})")
        checked[key] = value
    try:
        flow.merged_plan(actor, {}, checked)
    except flow.LimitOptionError as exc:
        raise InvalidJob(f"options.{exc.option}: {exc}") from None
    delay = int(checked.pop("delay", 0))
    if "max_retries" in checked:  # the row's budget: attempts = retries + 1
        checked["max_attempts"] = checked.pop("max_retries") + 1
    message: Message[Any] = Message(queue_name=queue, actor_name=actor, args=tuple(args), kwargs=kwargs,
                                    options=checked)
    return NewJob(message, delay)
