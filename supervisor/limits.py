"""The limit keys seen and steered: what each key's gate holds now, and an operator's
override of its limits at runtime (issue 22, "Seen and steered").

``seen`` reads every key in use (jobs waiting on it, running under it, or a bucket), as
the claim sees it, one bounded statement (``broker/sql/limits.py``). ``set_override``
and ``clear_override`` write the key's override on its bucket (``rate_limiter_state``,
migration 037); the claim reads it through the join it makes per key already and
applies it at the next claim, on every process and host; the queues whose jobs wait on
the key are woken at once (a loosened gate need not wait for the time it announced).

Used by the Limits page, ``GET/PUT/DELETE /api/v1/limits``, ``/metrics`` and
``supervisor limits``; each caller writes its own audit row (the HTTP guard, the CLI).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from . import db, flow, ratelimit
from .broker.sql import limits as sql

# Keys a read shows (and one more, to tell there are more: ``next_after`` pages on).
MAX_KEYS = 500
# A key's waiting rows counted exactly up to this many; past it "at least".
WAITING_UPTO = 1_000
# The values an override may name, as the API, the form and the CLI spell them, and the
# letters of a job's ``flow`` (supervisor/flow.py ``Limits.as_json``) they replace.
FIELDS = {"rate": "r", "burst": "b", "daily_quota": "q", "concurrency": "c"}
_NAMES = {letter: name for name, letter in FIELDS.items()}
# A value that lifts the limit (a JSON null does too).
NONE_WORDS = frozenset({"none", "null", "unlimited"})


class LimitValueError(ValueError):
    """One bad value of an override, in one line that names it."""


@dataclass(frozen=True)
class Seen:
    """A read of the keys: one dict each (``broker/sql/limits.LIMITS``' columns), in key
    order; ``next_after``: the last key shown when more follow (pass it as ``after``)."""

    keys: list[dict[str, Any]]
    next_after: str | None


def check_key(key: Any) -> str:
    if not isinstance(key, str) or not key.strip():
        raise LimitValueError("key: give the limit key (a non-empty string)")
    if len(key) > flow.MAX_KEY_LENGTH:
        raise LimitValueError(f"key: {len(key)} characters (at most {flow.MAX_KEY_LENGTH})")
    return key


def _whole(name: str, value: Any, least: int) -> int | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in NONE_WORDS):
        if name == "burst":
            raise LimitValueError("burst: give a whole number >= 1 (a burst cannot be lifted)")
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        lift = "" if name == "burst" else " or none"
        raise LimitValueError(f"{name}: expected a whole number >= {least}{lift}, got {value!r:.60}")
    return value


def parse(values: Mapping[str, Any]) -> dict[str, Any]:
    """The override (``flow``'s letters: r per second, b, q, c; None lifts a limit) that
    ``values`` name: rate ("10/s", "30/m burst 5", none), burst, daily_quota, concurrency
    (whole numbers, or none). Empty strings are not given. LimitValueError if one is bad."""
    unknown = sorted(set(values) - set(FIELDS))
    if unknown:
        raise LimitValueError(f"unknown field(s) {', '.join(unknown)} (known: {', '.join(FIELDS)})")
    given = {k: v for k, v in values.items() if not (isinstance(v, str) and not v.strip())}
    if not given:
        raise LimitValueError(f"give at least one of {', '.join(FIELDS)} (to drop the override, clear it)")
    out: dict[str, Any] = {}
    if "rate" in given:
        rate = given["rate"]
        if rate is None or (isinstance(rate, str) and rate.strip().lower() in NONE_WORDS):
            out["r"] = None
        else:
            try:
                per_second, burst = flow.parse_rate("-", rate)
            except flow.LimitOptionError as exc:
                raise LimitValueError(f"rate {rate!r:.60}: {exc.why}") from None
            out["r"] = per_second
            if "burst" in str(rate):
                if "burst" in given:
                    raise LimitValueError("burst: given twice (in rate and on its own)")
                out["b"] = burst
    if "burst" in given:
        out["b"] = _whole("burst", given["burst"], 1)
    if "daily_quota" in given:
        out["q"] = _whole("daily_quota", given["daily_quota"], 0)
    if "concurrency" in given:
        out["c"] = _whole("concurrency", given["concurrency"], 1)
    return out


def rate_text(per_second: float | None) -> str:
    """A rate as an actor's option writes it: 20/s, 30/m, 2/h, 5/d ("-": none)."""
    if per_second is None:
        return "-"
    for unit, seconds in (("s", 1), ("m", 60), ("h", 3600)):
        if per_second * seconds >= 1 - 1e-9:
            return f"{per_second * seconds:.3g}/{unit}"
    return f"{per_second * 86400:.3g}/d"


def override_text(override: Mapping[str, Any] | None) -> str:
    """An override (``describe``'s) in a line: rate 2/s, concurrency none."""
    return ", ".join(f"{name.replace('_', ' ')} {'none' if value is None else rate_text(value) if name == 'rate' else f'{value:g}'}"
                     for name, value in (override or {}).items())


def describe(override: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """An override as the API shows it: its fields by name (None: that limit lifted)."""
    if override is None:
        return None
    return {_NAMES.get(k, k): v for k, v in override.items()}


def set_override(conn: psycopg.Connection, key: str, override: Mapping[str, Any],
                 by: str | None) -> dict[str, Any]:
    """Store ``override`` (``parse``'s) for ``key``, replacing any before it; the queues
    whose jobs wait on the key are woken. Returns the key's override as stored."""
    with conn.transaction():
        row = db.dicts(conn, ratelimit.SET_OVERRIDE, {"key": check_key(key), "override": Jsonb(dict(override)),
                                                      "by": by})[0]
        conn.execute(sql.WAKE_WAITING, {"key": key})
    return {**row, "override": describe(row["override"]), "previous": describe(row["previous"])}


def clear_override(conn: psycopg.Connection, key: str, by: str | None) -> dict[str, Any] | None:
    """Drop ``key``'s override (its jobs' own limits apply again); the override it had,
    or None when it had none."""
    with conn.transaction():
        row = conn.execute(ratelimit.CLEAR_OVERRIDE, {"key": check_key(key), "by": by}).fetchone()
        if row is not None:
            conn.execute(sql.WAKE_WAITING, {"key": key})
    return None if row is None else describe(row[1])


def seen(conn: psycopg.Connection, *, after: str = "", max_keys: int = MAX_KEYS,
         upto: int = WAITING_UPTO) -> Seen:
    """Every limit key in use after ``after`` (key order), up to ``max_keys``, as the claim
    sees it now."""
    with conn.transaction():
        # The recursive scans' estimates pass jit_above_cost: compiling took 25 s for a
        # read of 3 keys that runs in 20 ms (the HTTP child's sessions have JIT off already).
        conn.execute("SET LOCAL jit = off")
        rows = db.dicts(conn, sql.LIMITS, {"after": after, "max_keys": max_keys, "upto": upto,
                                           "n": sql.GATE_ROWS})
    more = len(rows) > max_keys
    rows = rows[:max_keys]
    for r in rows:
        r["override"] = describe(r["override"])
    return Seen(rows, rows[-1]["key"] if more else None)


def as_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """One key for JSON (the API, the CLI): times as ISO text."""
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in row.items()}
