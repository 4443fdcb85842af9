"""Five-field cron expressions (minute hour day-of-month month day-of-week).

Supports ``*``, lists (``1,15``), ranges (``1-5``), steps (``*/15``, ``10-40/10``,
``5/20``), month and weekday names (``jan``, ``mon-fri``), 7 as Sunday, and the
aliases ``@hourly @daily @midnight @weekly @monthly @yearly @annually``.

As in Vixie cron, when both day-of-month and day-of-week are restricted a day
matches if *either* matches. Times are UTC; naive datetimes are taken as UTC.
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

ALIASES = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}

_MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_abbr) if name}
_DAYS = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: dict[str, int]


_FIELDS = (
    _Field("minute", 0, 59, {}),
    _Field("hour", 0, 23, {}),
    _Field("day-of-month", 1, 31, {}),
    _Field("month", 1, 12, _MONTHS),
    _Field("day-of-week", 0, 7, _DAYS),
)

# Far enough for any satisfiable expression (Feb 29 on a Monday recurs within 28 years).
_SEARCH_YEARS = 30


def _value(field: _Field, text: str, expr: str) -> int:
    token = text.strip().lower()
    if token in field.names:
        return field.names[token]
    if not token.isdigit():
        raise ValueError(f"cron {expr!r}: {field.name} value {text!r} is not a number"
                         + (f" or a name ({', '.join(field.names)})" if field.names else ""))
    value = int(token)
    if not field.low <= value <= field.high:
        raise ValueError(f"cron {expr!r}: {field.name} value {value} is outside {field.low}-{field.high}")
    return value


def _parse_field(field: _Field, text: str, expr: str) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise ValueError(f"cron {expr!r}: empty item in {field.name} field {text!r}")
        base, _, step_text = part.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) == 0:
                raise ValueError(f"cron {expr!r}: {field.name} step {step_text!r} must be a positive number")
            step = int(step_text)
        if base == "*":
            low, high = field.low, field.high
        elif "-" in base:
            a, _, b = base.partition("-")
            low, high = _value(field, a, expr), _value(field, b, expr)
            if low > high:
                raise ValueError(f"cron {expr!r}: {field.name} range {base!r} runs backwards")
        else:
            low = _value(field, base, expr)
            # "5/15" means from 5 to the end in steps of 15, as in Vixie cron.
            high = field.high if step_text else low
        values.update(range(low, high + 1, step))
    if field.name == "day-of-week" and 7 in values:
        values.discard(7)
        values.add(0)
    return frozenset(values)


@dataclass(frozen=True)
class CronExpr:
    expr: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool  # day-of-month was "*"
    any_weekday: bool  # day-of-week was "*"

    def _day_matches(self, t: datetime) -> bool:
        dom = t.day in self.days
        dow = (t.weekday() + 1) % 7 in self.weekdays
        if self.any_day and self.any_weekday:
            return True
        if self.any_day:
            return dow
        if self.any_weekday:
            return dom
        return dom or dow

    def matches(self, when: datetime) -> bool:
        t = _utc(when)
        return (t.minute in self.minutes and t.hour in self.hours and t.month in self.months
                and self._day_matches(t))

    def next_after(self, when: datetime) -> datetime:
        """The first fire time strictly after ``when`` (aware, UTC, whole minute)."""
        t = _utc(when).replace(second=0, microsecond=0) + timedelta(minutes=1)
        limit = t.year + _SEARCH_YEARS
        while t.year <= limit:
            if t.month not in self.months:
                year, month = (t.year + 1, 1) if t.month == 12 else (t.year, t.month + 1)
                t = t.replace(year=year, month=month, day=1, hour=0, minute=0)
                continue
            if not self._day_matches(t):
                t = (t + timedelta(days=1)).replace(hour=0, minute=0)
                continue
            if t.hour not in self.hours:
                t = (t + timedelta(hours=1)).replace(minute=0)
                continue
            later = [m for m in self.minutes if m >= t.minute]
            if not later:
                t = (t + timedelta(hours=1)).replace(minute=0)
                continue
            return t.replace(minute=min(later))
        raise ValueError(f"cron {self.expr!r} never fires")

    def last_at_or_before(self, when: datetime) -> datetime:
        """The last fire time at or before ``when`` (aware, UTC, whole minute): where a
        schedule's missed fires are counted back from (worker/scheduler.py)."""
        t = _utc(when).replace(second=0, microsecond=0)
        limit = t.year - _SEARCH_YEARS
        while t.year >= limit:
            if t.month not in self.months:
                t = t.replace(day=1, hour=0, minute=0) - timedelta(minutes=1)  # the previous month's last minute
                continue
            if not self._day_matches(t):
                t = t.replace(hour=0, minute=0) - timedelta(minutes=1)
                continue
            if t.hour not in self.hours:
                t = t.replace(minute=0) - timedelta(minutes=1)
                continue
            earlier = [m for m in self.minutes if m <= t.minute]
            if not earlier:
                t = t.replace(minute=0) - timedelta(minutes=1)
                continue
            return t.replace(minute=max(earlier))
        raise ValueError(f"cron {self.expr!r} never fired in the {_SEARCH_YEARS} years before {when}")

    def __str__(self) -> str:
        return self.expr


def _utc(when: datetime) -> datetime:
    if when.tzinfo is None:
        return when.replace(tzinfo=UTC)
    return when.astimezone(UTC)


def _satisfiable(days: frozenset[int], months: frozenset[int]) -> bool:
    longest = {m: 29 if m == 2 else calendar.monthrange(2001, m)[1] for m in range(1, 13)}
    return any(d <= longest[m] for m in months for d in days)


def parse(expr: str) -> CronExpr:
    """Parse a cron expression; raise ValueError naming the bad field."""
    if not isinstance(expr, str) or not expr.strip():
        raise ValueError("cron expression is empty")
    text = expr.strip()
    if text.startswith("@"):
        if text.lower() not in ALIASES:
            raise ValueError(f"cron {expr!r}: unknown alias (use one of {', '.join(ALIASES)})")
        text = ALIASES[text.lower()]
    parts = text.split()
    if len(parts) != 5:
        raise ValueError(
            f"cron {expr!r}: expected 5 fields (minute hour day-of-month month day-of-week), got {len(parts)}"
        )
    sets = [_parse_field(f, p, expr) for f, p in zip(_FIELDS, parts, strict=True)]
    any_day, any_weekday = parts[2] == "*", parts[4] == "*"
    if any_weekday and not any_day and not _satisfiable(sets[2], sets[3]):
        raise ValueError(f"cron {expr!r}: day-of-month never occurs in the given months")
    return CronExpr(expr.strip(), sets[0], sets[1], sets[2], sets[3], sets[4], any_day, any_weekday)
