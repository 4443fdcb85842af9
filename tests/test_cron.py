from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from supervisor import cron

NY = ZoneInfo("America/New_York")


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
        # What the library brings: last day, last weekday of the month, nth weekday, seconds.
        ("0 12 L * *", at(2026, 2, 1), at(2026, 2, 28, 12)),
        ("0 12 LW * *", at(2026, 5, 1), at(2026, 5, 29, 12)),  # the 31st is a Sunday
        ("0 9 * * 5L", at(2026, 1, 1), at(2026, 1, 30, 9)),  # the last Friday
        ("0 9 * * mon#2", at(2026, 1, 1), at(2026, 1, 12, 9)),
        ("*/10 * * * * *", at(2026, 1, 1, 10, 0, 5), at(2026, 1, 1, 10, 0, 10)),
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
        ("60 * * * *", "bad minute field"),
        ("* 24 * * *", "bad hour field"),
        ("* * 0 * *", "bad day-of-month field"),
        ("* * * 13 *", "bad month field"),
        ("* * * * 8", "bad day-of-week field"),
        ("*/0 * * * *", "bad minute"),
        ("5-1 * * * *", "bad minute"),
        ("a * * * *", "bad minute"),
        ("* * * foo *", "bad month"),
        ("1,,2 * * * *", "bad minute"),
        ("* * * * 1#6", "bad day-of-week"),
        ("@often", "unknown alias"),
        ("0 0 30 2 *", "bad day-of-month"),
    ],
)
def test_bad_expressions_say_what_is_wrong(expr, fragment):
    with pytest.raises(ValueError, match=fragment):
        cron.parse(expr)


@pytest.mark.parametrize("name", ["America/NewYork", "Mars/Olympus", "../etc/passwd", "", "EST5EDT/x"])
def test_unknown_zones_are_refused_in_one_line(name):
    with pytest.raises(ValueError, match="unknown time zone") as err:
        cron.parse("0 * * * *", name)
    assert "\n" not in str(err.value)


def test_utc_is_the_default_zone():
    assert cron.parse("30 9 * * *").next_after(at(2026, 3, 8)) == at(2026, 3, 8, 9, 30)
    assert cron.parse("30 9 * * *").timezone == "UTC"


# US DST in 2026: clocks go forward on Sunday March 8 at 02:00 EST, back on Sunday
# November 1 at 02:00 EDT. New York is UTC-5 in winter (EST), UTC-4 in summer (EDT).


def test_a_daily_fire_keeps_its_wall_clock_time_across_both_changes():
    c = cron.parse("30 9 * * *", "America/New_York")
    spring = c.upcoming(at(2026, 3, 6), 3)
    assert spring == [at(2026, 3, 6, 14, 30), at(2026, 3, 7, 14, 30), at(2026, 3, 8, 13, 30)]
    fall = c.upcoming(at(2026, 10, 30), 3)
    assert fall == [at(2026, 10, 30, 13, 30), at(2026, 10, 31, 13, 30), at(2026, 11, 1, 14, 30)]
    assert {(c.local(t).hour, c.local(t).minute) for t in spring + fall} == {(9, 30)}


def test_a_fire_in_the_skipped_hour_runs_once_right_after_the_gap():
    c = cron.parse("30 2 * * *", "America/New_York")
    fires = c.upcoming(at(2026, 3, 7, 12), 2)
    assert [c.local(t).isoformat() for t in fires] == ["2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00"]
    both = cron.parse("0,30 2 * * *", "America/New_York")  # two fire times in the gap: one fire
    assert [both.local(t).isoformat() for t in both.upcoming(at(2026, 3, 8, 5), 2)] == [
        "2026-03-08T03:00:00-04:00", "2026-03-09T02:00:00-04:00"]


def test_a_fire_in_the_repeated_hour_runs_once_the_first_time():
    c = cron.parse("30 1 * * *", "America/New_York")
    fires = c.upcoming(at(2026, 10, 31, 12), 2)
    assert [c.local(t).isoformat() for t in fires] == ["2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"]
    # From inside the second 01:xx (EST), the first 01:30 (EDT) has fired: the next is tomorrow's.
    assert c.next_after(at(2026, 11, 1, 6, 15)) == at(2026, 11, 2, 6, 30)
    assert c.last_at_or_before(at(2026, 11, 1, 6, 45)) == at(2026, 11, 1, 5, 30)


def test_an_interval_keeps_its_pace_in_real_time_across_both_changes():
    c = cron.parse("*/30 * * * *", "America/New_York")
    for start in (at(2026, 3, 8, 5), at(2026, 11, 1, 4)):
        fires = c.upcoming(start, 8)
        assert {b - a for a, b in zip(fires, fires[1:], strict=False)} == {timedelta(minutes=30)}


# The Saturdays before each zone's two changes of 2026 (Santiago's and Lord Howe's
# autumn is in April; Lord Howe moves by 30 minutes).
CHANGES = {"America/New_York": (at(2026, 3, 7), at(2026, 10, 31)), "Europe/London": (at(2026, 3, 28), at(2026, 10, 24)),
           "America/Santiago": (at(2026, 4, 4), at(2026, 9, 5)), "Australia/Lord_Howe": (at(2026, 4, 4), at(2026, 10, 3))}


@pytest.mark.parametrize("zone", list(CHANGES))
@pytest.mark.parametrize("expr", ["30 9 * * *", "30 2 * * *", "30 1 * * *", "0,30 1-3 * * *", "*/20 * * * *",
                                  "15 * * * *", "0 */2 * * *"])
def test_next_and_last_agree_across_dst_changes(zone, expr):
    """Forward and backward walks give one sequence of fire times through a year's both
    changes (what catch_up counts back over is what the scheduler fires going forward)."""
    c = cron.parse(expr, zone)
    for start in CHANGES[zone]:
        end = start + timedelta(days=2)
        fires = [c.next_after(start)]
        while fires[-1] < end:
            fires.append(c.next_after(fires[-1]))
        assert all(c.last_at_or_before(f) == f for f in fires)
        t = fires[0]
        while t < fires[-1]:
            assert c.next_after(t) == min(f for f in fires if f > t)
            assert c.last_at_or_before(t) == max(f for f in fires if f <= t)
            t += timedelta(minutes=41, seconds=7)


def test_a_half_hour_change_steps_over_no_fire():
    """Lord Howe Island moves its clocks by 30 minutes: at 02:00 (+11) on April 5, 2026
    it is 01:30 (+10:30) again. An every-2-hours schedule still fires at 02:00 (+10:30)."""
    c = cron.parse("0 */2 * * *", "Australia/Lord_Howe")
    fires = c.upcoming(at(2026, 4, 4, 12), 3)
    assert [c.local(t).isoformat() for t in fires] == [
        "2026-04-05T00:00:00+11:00", "2026-04-05T02:00:00+10:30", "2026-04-05T04:00:00+10:30"]
