from datetime import UTC, datetime, timedelta, timezone

import pytest

from supervisor import cron


def at(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize(
    "expr, after, expected",
    [
        ("* * * * *", at(2026, 1, 1, 10, 0, 30), at(2026, 1, 1, 10, 1)),
        ("*/15 * * * *", at(2026, 1, 1, 10, 7), at(2026, 1, 1, 10, 15)),
        ("*/15 * * * *", at(2026, 1, 1, 10, 45), at(2026, 1, 1, 11, 0)),
        ("5 4 * * *", at(2026, 1, 1, 4, 5), at(2026, 1, 2, 4, 5)),
        ("0 9-17/4 * * mon-fri", at(2026, 1, 2, 17, 0), at(2026, 1, 5, 9, 0)),  # Fri -> Mon
        ("0 0 29 2 *", at(2026, 3, 1), at(2028, 2, 29)),
        ("30 2 1,15 * *", at(2026, 1, 15, 3), at(2026, 2, 1, 2, 30)),
        ("0 0 * jan,jul *", at(2026, 2, 1), at(2026, 7, 1)),
        ("0 12 * * 7", at(2026, 1, 1), at(2026, 1, 4, 12, 0)),  # 7 is Sunday
        ("10/20 * * * *", at(2026, 1, 1, 0, 31), at(2026, 1, 1, 0, 50)),
        ("0 0 31 * *", at(2026, 1, 31, 0, 0), at(2026, 3, 31)),
        ("@hourly", at(2026, 1, 1, 10, 0), at(2026, 1, 1, 11, 0)),
        ("@daily", at(2026, 12, 31, 23, 59), at(2027, 1, 1)),
        ("@weekly", at(2026, 1, 1), at(2026, 1, 4)),
        ("@monthly", at(2026, 1, 1, 0, 0), at(2026, 2, 1)),
    ],
)
def test_next_after(expr, after, expected):
    assert cron.parse(expr).next_after(after) == expected


def test_dom_and_dow_both_restricted_match_either():
    # The 13th of the month or any Friday (Vixie cron semantics).
    c = cron.parse("0 0 13 * fri")
    assert c.next_after(at(2026, 1, 1)) == at(2026, 1, 2)  # Friday the 2nd
    assert c.next_after(at(2026, 1, 12)) == at(2026, 1, 13)  # Tuesday the 13th


def test_naive_and_other_zones_are_utc():
    c = cron.parse("0 * * * *")
    assert c.next_after(datetime(2026, 1, 1, 10, 30)) == at(2026, 1, 1, 11)
    plus2 = timezone(timedelta(hours=2))
    assert c.next_after(datetime(2026, 1, 1, 12, 30, tzinfo=plus2)) == at(2026, 1, 1, 11)
    assert c.next_after(at(2026, 1, 1)).tzinfo is UTC


def test_iterating_gives_strictly_increasing_matching_times():
    c = cron.parse("*/7 3,4 * * *")
    t = at(2026, 1, 1)
    seen = []
    for _ in range(40):
        t = c.next_after(t)
        assert c.matches(t)
        seen.append(t)
    assert seen == sorted(set(seen))


@pytest.mark.parametrize("expr", ["* * * * *", "*/15 * * * *", "5 4 * * *", "0 9-17/4 * * mon-fri", "0 0 29 2 *",
                                  "30 2 1,15 * *", "0 0 * jan,jul *", "0 0 13 * fri", "10/20 * * * *", "0 0 31 * *"])
def test_last_at_or_before_walks_back_over_what_next_after_walks_forward(expr):
    """Counting back from any instant lands on the fire next_after would have reached
    from there: every fire time at or before, none skipped."""
    c = cron.parse(expr)
    t = at(2026, 3, 1, 7, 33, 20)
    back = [c.last_at_or_before(t)]
    for _ in range(30):
        back.append(c.last_at_or_before(back[-1] - timedelta(minutes=1)))
    assert all(c.matches(x) for x in back) and back == sorted(set(back), reverse=True)
    forward = [back[-1]]
    while len(forward) < len(back):
        forward.append(c.next_after(forward[-1]))
    assert forward == back[::-1]
    assert c.next_after(back[0]) > t >= back[0]
    assert c.last_at_or_before(back[0]) == back[0]  # at a fire time: that one


@pytest.mark.parametrize(
    "expr, fragment",
    [
        ("", "empty"),
        ("* * * *", "expected 5 fields"),
        ("60 * * * *", "minute value 60 is outside 0-59"),
        ("* 24 * * *", "hour value 24"),
        ("* * 0 * *", "day-of-month value 0"),
        ("* * * 13 *", "month value 13"),
        ("* * * * 8", "day-of-week value 8"),
        ("*/0 * * * *", "step"),
        ("5-1 * * * *", "runs backwards"),
        ("a * * * *", "not a number"),
        ("* * * foo *", "not a number or a name"),
        ("1,,2 * * * *", "empty item"),
        ("@often", "unknown alias"),
        ("0 0 30 2 *", "never occurs"),
    ],
)
def test_bad_expressions_say_what_is_wrong(expr, fragment):
    with pytest.raises(ValueError, match=fragment):
        cron.parse(expr)
