"""Cron expressions in a time zone, on cronsim (the parser is the library's, not ours).

The grammar is cronsim's: five fields (minute hour day-of-month month day-of-week), or
six with seconds first; ``*``, lists, ranges, steps, month and weekday names, ``L``
(last day of the month, or ``5L``: the month's last Friday), ``LW`` (its last weekday)
and ``#`` (``1#2``: the second Monday). We add only the ``@hourly``-style aliases.
As in Vixie and Debian cron, when both day fields are restricted a day matches if
*either* does.

Fire times are wall-clock times in the schedule's zone (an IANA name, through
zoneinfo), with Debian cron's rules at DST changes, which cronsim implements:

- a schedule at a fixed time (minute and hour fields not starting with ``*``): a fire
  time in the hour skipped at spring-forward fires once, right after the gap (02:30 ->
  03:00); a fire time in the hour repeated at fall-back fires once, the first time;
- any other schedule (``*/15 * * * *``, ``0 * * * *``) keeps its pace in real time
  across both changes (every 15 minutes stays every 15 minutes).

Every instant given or returned is aware; naive ones are taken as UTC. Results are in
UTC, the same on every host, which is what scheduler_locks and job_runs compare.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from . import defaults

ALIASES = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}

_SECOND = timedelta(seconds=1)


@functools.lru_cache(maxsize=256)
def zone(name: str | None) -> tzinfo:
    """The zone an IANA name stands for; ValueError (one line) for a name zoneinfo does not know.
    UTC is datetime's own, so cronsim applies no DST handling to it."""
    if name is None or name.upper() in ("UTC", "ETC/UTC", "Z"):
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ValueError(f"unknown time zone {name!r}: use an IANA name such as America/New_York, "
                         "Europe/Paris or UTC") from exc


@dataclass(frozen=True)
class CronExpr:
    expr: str  # as written (an alias stays an alias)
    fields: str  # what cronsim reads
    timezone: str  # the IANA name, as written
    tz: tzinfo

    def _iter(self, start: datetime, *, reverse: bool = False) -> CronSim:
        return CronSim(self.fields, start.astimezone(self.tz), reverse=reverse)

    def next_after(self, when: datetime) -> datetime:
        """The first fire time strictly after ``when`` (aware, UTC)."""
        when = _aware(when)
        it = self._iter(when)
        while True:
            # cronsim walks wall-clock time: from the repeated hour's second pass its first
            # answer can be the first pass's fire, earlier than ``when``; that one has fired.
            t = _next(it, self.expr).astimezone(UTC)
            if t > when:
                break
        if self.tz is UTC:
            return t
        # Where an offset changes by less than an hour (Australia/Lord_Howe: 30 min) the
        # forward walk can step over a fire that its reverse walk finds: take the earliest.
        back = self._iter(t, reverse=True)  # its first step is back 1 s: strictly before t
        while (earlier := _next(back, self.expr).astimezone(UTC)) > when:
            t = earlier
        return t

    def last_at_or_before(self, when: datetime) -> datetime:
        """The last fire time at or before ``when`` (aware, UTC): where a schedule's missed
        fires are counted back from (worker/scheduler.py). next_after is the definition
        of the fire times; cronsim's reverse walk finds a candidate, then a forward step
        takes any fire the reverse walk passed over around a DST change."""
        when = _aware(when)
        it = self._iter(when.replace(microsecond=0) + _SECOND, reverse=True)  # its first step is back 1 s
        t = _next(it, self.expr).astimezone(UTC)
        while t > when:
            t = _next(it, self.expr).astimezone(UTC)
        while (later := self.next_after(t)) <= when:
            t = later
        return t

    def upcoming(self, when: datetime, count: int) -> list[datetime]:
        """The next ``count`` fire times after ``when`` (UTC)."""
        out: list[datetime] = []
        for _ in range(count):
            when = self.next_after(when)
            out.append(when)
        return out

    def matches(self, when: datetime) -> bool:
        return self.last_at_or_before(when) == _aware(when)

    def local(self, when: datetime) -> datetime:
        """``when`` in the schedule's zone."""
        return _aware(when).astimezone(self.tz)

    def __str__(self) -> str:
        return self.expr


def _aware(when: datetime) -> datetime:
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when


def _next(it: CronSim, expr: str) -> datetime:
    try:
        return next(it)
    except StopIteration:
        raise ValueError(f"cron {expr!r} never fires (no fire time within 50 years)") from None


@functools.lru_cache(maxsize=256)
def parse(expr: str, timezone: str | None = None) -> CronExpr:
    """Parse a cron expression in ``timezone`` (an IANA name; None: UTC); raise a one-line
    ValueError naming what is wrong."""
    if not isinstance(expr, str) or not expr.strip():
        raise ValueError("cron expression is empty")
    text = expr.strip()
    fields = text
    if text.startswith("@"):
        if text.lower() not in ALIASES:
            raise ValueError(f"cron {expr!r}: unknown alias (use one of {', '.join(ALIASES)})")
        fields = ALIASES[text.lower()]
    count = len(fields.split())
    if count not in (5, 6):
        raise ValueError(f"cron {expr!r}: expected 5 fields (minute hour day-of-month month day-of-week), "
                         f"or 6 with seconds first, got {count}")
    tz = zone(timezone)
    try:
        CronSim(fields, datetime(2000, 1, 1, tzinfo=UTC))  # the grammar is checked as it is read
    except CronSimError as exc:
        raise ValueError(f"cron {expr!r}: {str(exc).lower() or 'not understood'} field") from exc
    return CronExpr(text, fields, timezone or defaults.SCHEDULE_TIMEZONE, tz)
