"""The checkers config keys are read with, and the located value they check.

A checker turns an ``Item`` (a YAML value with its line and dotted key) into the
setting's value, or raises ValueError saying what is wrong; the reader adds the file,
the line and the key. Each is a ``Check``: besides checking, it says what it accepts
(the docs' "kind" column), how a default reads, and how a command-line word becomes
the value YAML would have given, so `supervisor worker`'s flags are checked by the
very same function as the file's keys.

No YAML here: a worker started from its command line checks its flags with these
and never loads the YAML reader.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..units import format_duration, parse_duration, parse_size

NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

T = TypeVar("T")


@dataclass
class Item:
    """A YAML value with where it came from."""

    value: Any  # scalar, dict[str, Item] or list[Item]
    line: int
    key: str


class BadItem(ValueError):
    """A bad element inside a list: the error points at the element's own line."""

    def __init__(self, item: Item, message: str) -> None:
        super().__init__(message)
        self.item = item


def kind(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int | float):
        return f"a number ({value})"
    return f"{type(value).__name__} {value!r}"


def show(value: Any) -> str:
    """A default as the docs write it."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple | list):
        return "[" + ", ".join(map(show, value)) + "]" if value else "[]"
    if isinstance(value, dict):
        return "{}" if not value else str(value)
    return str(value)


_INT = re.compile(r"[-+]?\d+")
_FLOAT = re.compile(r"[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?")


def word(text: str) -> Any:
    """A command-line word as a plain YAML scalar would read: 8 is a number, true a boolean."""
    t = text.strip()
    if _INT.fullmatch(t):
        return int(t)
    if _FLOAT.fullmatch(t):
        return float(t)
    if t.lower() in ("true", "false"):
        return t.lower() == "true"
    return text


@dataclass(frozen=True)
class Check(Generic[T]):
    """A checker, with what the docs and the command line need to speak of it."""

    what: str  # what it accepts, for the docs: "duration > 0s"
    fn: Callable[[Item], T]
    shows: Callable[[Any], str] = show  # a default of this kind, as the docs write it
    text: Callable[[str], Any] = word  # a command-line word -> the value as YAML gives it

    def __call__(self, item: Item) -> T:
        return self.fn(item)


# --- the generic checkers ---------------------------------------------------------------


def _string(item: Item) -> str:
    if not isinstance(item.value, str) or not item.value.strip():
        raise ValueError(f"expected a non-empty string, got {kind(item.value)}")
    return item.value


string = Check("string", _string, text=str)


def _boolean(item: Item) -> bool:
    if not isinstance(item.value, bool):
        raise ValueError(f"expected true or false, got {kind(item.value)}")
    return item.value


boolean = Check("true or false", _boolean)


def integer(minimum: int) -> Check[int]:
    def check(item: Item) -> int:
        v = item.value
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"expected a whole number, got {kind(v)}")
        if v < minimum:
            raise ValueError(f"must be at least {minimum}, got {v}")
        return v

    return Check(f"integer >= {minimum}", check)


def number(minimum: float | None = None, maximum: float | None = None) -> Check[float]:
    def check(item: Item) -> float:
        v = item.value
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ValueError(f"expected a number, got {kind(v)}")
        if minimum is not None and v < minimum:
            raise ValueError(f"must be at least {minimum:g}, got {v}")
        if maximum is not None and v > maximum:
            raise ValueError(f"must be at most {maximum:g}, got {v}")
        return float(v)

    if minimum is not None and maximum is not None:
        return Check(f"number {minimum:g}-{maximum:g}", check)
    return Check("number" + (f" >= {minimum:g}" if minimum is not None else "")
                 + (f" <= {maximum:g}" if maximum is not None else ""), check)


def _show_duration(value: Any) -> str:
    return format_duration(value) if isinstance(value, int | float) and not isinstance(value, bool) else show(value)


def duration(minimum: float = 0.0, *, strict: bool = False) -> Check[float]:
    """Seconds in the duration grammar (supervisor/units.py): 30, 2.5, 30s, 5m, 1h, 500ms."""

    def check(item: Item) -> float:
        seconds = parse_duration(item.value)
        if not math.isfinite(seconds):
            raise ValueError(f"must be a finite duration, got {item.value!r}")
        if seconds < minimum or strict and seconds <= minimum:
            bound = f"more than {minimum:g}s" if strict else f"at least {minimum:g}s"
            raise ValueError(f"must be {bound}, got {item.value!r}")
        return seconds

    return Check(f"duration {'>' if strict else '>='} {format_duration(minimum) if minimum else '0s'}", check,
                 shows=_show_duration, text=str)


def _percent(item: Item) -> float:
    v = item.value
    if isinstance(v, str) and v.strip().endswith("%"):
        v = v.strip()[:-1]
        try:
            v = float(v)
        except ValueError:
            raise ValueError(f"expected a percentage like 85 or 85%, got {item.value!r}") from None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"expected a percentage like 85, got {kind(v)}")
    if not 0 < v <= 100:
        raise ValueError(f"must be between 0 and 100 (exclusive of 0), got {v}")
    return float(v)


def _show_percent(value: Any) -> str:
    return f"{value:g}%" if isinstance(value, int | float) else show(value)


percent = Check("percent (0-100]", _percent, shows=_show_percent)


def _percent_or_off(item: Item) -> float | None:
    # YAML reads an unquoted `off` as false.
    return None if item.value in ("off", False) else _percent(item)


percent_or_off = Check("percent (0-100], or off", _percent_or_off, shows=_show_percent)


def size(minimum: int) -> Check[int]:
    """Bytes in the size grammar (supervisor/units.py): 536870912, 512MB, 1.5GiB."""

    def check(item: Item) -> int:
        v = parse_size(item.value)
        if v < minimum:
            raise ValueError(f"{item.value!r} is under {minimum >> 20}MB; write a size like 512MB")
        return v

    return Check(f"size >= {minimum >> 20}MB", check, text=str)


def names(pattern: re.Pattern[str], what: str) -> Check[tuple[str, ...]]:
    """A list of names (a single name is a one-element list; on the command line: a,b,c)."""

    def check(item: Item) -> tuple[str, ...]:
        v = item.value
        items = [item] if isinstance(v, str) else v
        if not isinstance(items, list):
            raise ValueError(f"expected a list of {what}s, got {kind(v)}")
        if not items:
            raise ValueError(f"must list at least one {what}")
        out: list[str] = []
        for child in items:
            if not isinstance(child.value, str) or not pattern.match(child.value):
                raise BadItem(child, f"{kind(child.value)} is not a valid {what}")
            if child.value in out:
                raise BadItem(child, f"{child.value!r} is listed twice")
            out.append(child.value)
        return tuple(out)

    def text(words: str) -> list[Item]:
        return [Item(w.strip(), 0, what) for w in words.split(",") if w.strip()]

    return Check(f"list of {what}s", check, text=text)


def unlocated(value: Any) -> Any:
    """The located tree back to plain Python values."""
    if isinstance(value, dict):
        return {k: unlocated(c.value) for k, c in value.items()}
    if isinstance(value, list):
        return [unlocated(c.value) for c in value]
    return value


def _sequence(item: Item) -> tuple[Any, ...]:
    if not isinstance(item.value, list):
        raise ValueError(f"expected a list, got {kind(item.value)}")
    return tuple(unlocated(item.value))


def _mapping(item: Item) -> dict[str, Any]:
    if not isinstance(item.value, dict):
        raise ValueError(f"expected a mapping, got {kind(item.value)}")
    return dict(unlocated(item.value))


sequence = Check("list", _sequence)
mapping = Check("mapping", _mapping)


# --- the runtime's own ------------------------------------------------------------------


def _level(item: Item) -> str:
    v = _string(item).upper()
    if v not in LOG_LEVELS:
        raise ValueError(f"expected one of {', '.join(LOG_LEVELS)}, got {item.value!r}")
    return v


log_level = Check(" | ".join(LOG_LEVELS), _level, text=str)


def _node_name(item: Item) -> str:
    value = _string(item)
    if not NAME.match(value) or len(value) > 63:
        raise ValueError(f"expected a name of letters, digits, '.', '_' or '-' (at most 63), got {item.value!r}")
    return value


node_name = Check("name (at most 63)", _node_name, text=str)


def _priority(item: Item) -> int:
    value = item.value
    if isinstance(value, bool) or not isinstance(value, int) or not -1_000_000 <= value <= 1_000_000:
        raise ValueError(f"expected an integer priority (higher runs first), got {value!r}")
    return value


priority = Check("integer, -1000000 to 1000000", _priority)


def _cron(item: Item) -> str:
    from ..cron import parse  # the cron grammar: only where a schedule is read

    text = _string(item)
    try:
        parse(text)
    except ValueError as exc:
        raise ValueError(f"bad cron expression {text!r}: {exc}") from exc
    return text


cron = Check("cron expression", _cron, text=str)


def _timezone(item: Item) -> str:
    from ..cron import zone  # zoneinfo's names: only where a schedule's zone is read

    text = _string(item)
    zone(text)  # a ValueError saying what to write instead
    return text


timezone = Check("IANA time zone name", _timezone, text=str)


def _listen(item: Item) -> tuple[str, int]:
    host, sep, port = _string(item).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected host:port like 127.0.0.1:9191, got {item.value!r}")
    return host.strip("[]"), int(port)


listen = Check("host:port", _listen, text=str)


def _secret(item: Item) -> str | None:
    # An empty value (``${SUPERVISOR_HTTP_TOKEN:-}`` with the variable unset) means none.
    if not isinstance(item.value, str):
        raise ValueError(f"expected a string, got {kind(item.value)}")
    return item.value or None


secret = Check("string (empty: none)", _secret, text=str)


def one_of(choices: tuple[str, ...], what: str) -> Check[str]:
    def check(item: Item) -> str:
        value = _string(item)
        if value not in choices:
            raise ValueError(f"unknown {what} {value!r} ({what}s: {', '.join(choices)})")
        return value

    return Check(" | ".join(choices), check, text=str)

