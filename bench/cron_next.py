"""The cost of a schedule's next fire time: supervisor.cron (cronsim) against croniter,
when croniter is installed (it is not a dependency: `pip install croniter` to compare).

No database. Prints microseconds per next fire time for a few expressions, in UTC and in
America/New_York, median of --rounds rounds of --n steps each; and what each library
answers around the 2026 US DST changes (a fixed time in the skipped and in the repeated
hour), the behaviour the choice of cronsim rests on (supervisor/cron.py).
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from supervisor import cron

EXPRS = ("*/5 * * * *", "30 9 * * 1-5", "0 0 1 * *")
ZONES = ("UTC", "America/New_York")


def ours(expr: str, zone: str, n: int) -> float:
    c = cron.parse(expr, zone)
    t, start = datetime(2026, 1, 1, tzinfo=UTC), time.perf_counter()
    for _ in range(n):
        t = c.next_after(t)
    return (time.perf_counter() - start) / n * 1e6


def theirs(expr: str, zone: str, n: int) -> float:
    from croniter import croniter

    it = croniter(expr, datetime(2026, 1, 1, tzinfo=UTC).astimezone(ZoneInfo(zone)))
    start = time.perf_counter()
    for _ in range(n):
        it.get_next(datetime)
    return (time.perf_counter() - start) / n * 1e6


def dst_answers() -> None:
    ny = ZoneInfo("America/New_York")
    cases = (("30 2 * * *", datetime(2026, 3, 7, 12, tzinfo=UTC)), ("30 1 * * *", datetime(2026, 10, 31, 12, tzinfo=UTC)))
    for expr, start in cases:
        c = cron.parse(expr, "America/New_York")
        print(f"  {expr}  supervisor.cron: {[c.local(t).isoformat() for t in c.upcoming(start, 2)]}")
        try:
            from croniter import croniter
        except ImportError:
            continue
        it = croniter(expr, start.astimezone(ny))
        print(f"  {expr}  croniter:        {[it.get_next(datetime).isoformat() for _ in range(2)]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="next fire times per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    try:
        import croniter  # noqa: F401
        have = True
    except ImportError:
        have = False
        print("croniter not installed: supervisor.cron alone")
    print(f"us per next fire time, median of {args.rounds} x {args.n}")
    for expr in EXPRS:
        for zone in ZONES:
            a = statistics.median(ours(expr, zone, args.n) for _ in range(args.rounds))
            line = f"  {expr:14} {zone:17} supervisor.cron {a:7.1f}"
            if have:
                b = statistics.median(theirs(expr, zone, args.n) for _ in range(args.rounds))
                line += f"   croniter {b:7.1f}"
            print(line)
    print("fixed times around the 2026 US DST changes (New York):")
    dst_answers()


if __name__ == "__main__":
    main()
