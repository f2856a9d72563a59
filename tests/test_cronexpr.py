"""Cron expressions: accepted forms, refused ones, time zones and DST."""

from __future__ import annotations

from datetime import datetime

import pytest

from rsched import cronexpr
from rsched.errors import BadInput
from rsched.timeutil import iso


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def ticks(expr: str, tz: str, start: str, n: int) -> list[str]:
    s = cronexpr.parse(expr, tz)
    t, out = ms(start), []
    for _ in range(n):
        t = s.next_after(t)
        out.append(iso(t))
    return out


def test_five_fields_and_aliases() -> None:
    assert ticks("*/15 * * * *", "UTC", "2026-01-01T00:00:00Z", 2) == [
        "2026-01-01T00:15:00.000Z",
        "2026-01-01T00:30:00.000Z",
    ]
    assert ticks("@hourly", "UTC", "2026-01-01T00:00:00Z", 1) == ["2026-01-01T01:00:00.000Z"]
    assert ticks("@daily", "UTC", "2026-01-01T00:00:00Z", 1) == ["2026-01-02T00:00:00.000Z"]
    assert ticks("@weekly", "UTC", "2026-01-01T00:00:00Z", 1) == [
        "2026-01-04T00:00:00.000Z"
    ]  # Sunday
    assert ticks("@monthly", "UTC", "2026-01-01T00:00:00Z", 1) == ["2026-02-01T00:00:00.000Z"]
    assert ticks("@yearly", "UTC", "2026-01-01T00:00:00Z", 1) == ["2027-01-01T00:00:00.000Z"]


def test_six_fields_are_seconds_first_with_question_mark() -> None:
    # Spring/Quartz order, as the seeds write it: second minute hour dom month dow
    assert ticks("0 0 2 * * ?", "UTC", "2026-01-01T00:00:00Z", 2) == [
        "2026-01-01T02:00:00.000Z",
        "2026-01-02T02:00:00.000Z",
    ]
    assert ticks("*/2 * * * * *", "UTC", "2026-01-01T00:00:00Z", 3) == [
        "2026-01-01T00:00:02.000Z",
        "2026-01-01T00:00:04.000Z",
        "2026-01-01T00:00:06.000Z",
    ]
    assert ticks("30 0 0 ? * MON", "UTC", "2026-01-01T00:00:00Z", 1) == ["2026-01-05T00:00:30.000Z"]


def test_time_zone() -> None:
    assert ticks("0 2 * * *", "Asia/Shanghai", "2026-01-01T00:00:00Z", 1) == [
        "2026-01-01T18:00:00.000Z"
    ]


@pytest.mark.parametrize("expr", ["0 0 31 2 *", "0 0 30 2 *", "0 0 0 31 4 ?", "0 0 31 11 *"])
def test_never_firing_refused(expr: str) -> None:
    with pytest.raises(BadInput) as e:
        cronexpr.parse(expr)
    assert e.value.field == "--schedule" and "never fires" in str(e.value)


@pytest.mark.parametrize(
    "expr",
    ["@reboot", "@sometimes", "1 2 3", "* * * * * * *", "61 * * * *", "0 ? * * *", "", "a b c d e"],
)
def test_bad_expressions_refused(expr: str) -> None:
    with pytest.raises(BadInput) as e:
        cronexpr.parse(expr)
    assert e.value.field == "--schedule"


def test_leap_day_is_fine() -> None:
    assert ticks("0 0 29 2 *", "UTC", "2026-01-01T00:00:00Z", 1) == ["2028-02-29T00:00:00.000Z"]


def test_bad_zone() -> None:
    with pytest.raises(BadInput) as e:
        cronexpr.parse("* * * * *", "Mars/Olympus")
    assert e.value.field == "--tz"


def test_dst_gap_fires_once_at_first_valid_instant() -> None:
    # 2026-03-08 02:00 EST -> 03:00 EDT in New York: 02:30 does not exist.
    assert ticks("30 2 * * *", "America/New_York", "2026-03-07T12:00:00Z", 3) == [
        "2026-03-08T07:00:00.000Z",  # 03:00 EDT, the first instant after the gap
        "2026-03-09T06:30:00.000Z",  # 02:30 EDT
        "2026-03-10T06:30:00.000Z",
    ]
    # Every 20 minutes through the gap: 02:00, 02:20, 02:40 collapse into one tick at 03:00.
    assert ticks("*/20 * * * *", "America/New_York", "2026-03-08T06:30:00Z", 4) == [
        "2026-03-08T06:40:00.000Z",
        "2026-03-08T07:00:00.000Z",
        "2026-03-08T07:20:00.000Z",
        "2026-03-08T07:40:00.000Z",
    ]


def test_dst_overlap_fires_once() -> None:
    # 2026-11-01 02:00 EDT -> 01:00 EST: 01:30 happens twice; it fires at the first one only.
    assert ticks("30 1 * * *", "America/New_York", "2026-10-31T12:00:00Z", 3) == [
        "2026-11-01T05:30:00.000Z",  # 01:30 EDT
        "2026-11-02T06:30:00.000Z",  # 01:30 EST next day
        "2026-11-03T06:30:00.000Z",
    ]
    # Hourly through the overlap: the repeated 01:xx hour is not fired again.
    got = ticks("0 * * * *", "America/New_York", "2026-11-01T03:30:00Z", 4)
    assert got == [
        "2026-11-01T04:00:00.000Z",
        "2026-11-01T05:00:00.000Z",
        "2026-11-01T07:00:00.000Z",
        "2026-11-01T08:00:00.000Z",
    ]
    # Starting inside the second pass of the overlap does not go back.
    s = cronexpr.parse("30 1 * * *", "America/New_York")
    assert iso(s.next_after(ms("2026-11-01T06:10:00Z"))) == "2026-11-02T06:30:00.000Z"


def test_prev_at_or_before() -> None:
    s = cronexpr.parse("*/20 * * * *", "America/New_York")
    assert iso(s.prev_at_or_before(ms("2026-11-01T06:30:00Z"))) == "2026-11-01T05:40:00.000Z"
    assert iso(s.prev_at_or_before(ms("2026-11-01T07:00:00Z"))) == "2026-11-01T07:00:00.000Z"
    assert iso(s.prev_at_or_before(ms("2026-03-08T07:00:00Z"))) == "2026-03-08T07:00:00.000Z"
    u = cronexpr.parse("* * * * *")
    assert iso(u.prev_at_or_before(ms("2026-01-01T00:00:59.999Z"))) == "2026-01-01T00:00:00.000Z"
    assert u.ticks_between(ms("2026-01-01T00:00:00Z"), ms("2026-01-01T00:03:00Z")) == [
        ms("2026-01-01T00:01:00Z"),
        ms("2026-01-01T00:02:00Z"),
        ms("2026-01-01T00:03:00Z"),
    ]


def test_human_duration_keeps_the_two_largest_adjacent_units() -> None:
    from rsched.timeutil import human_duration

    assert human_duration(9 * 3_600_000 + 32_000) == "9h"  # not "9h 32s"
    assert human_duration(5_400_000) == "1h 30m"
    assert human_duration(93_660_000) == "1d 2h"
    assert human_duration(61_000) == "1m 1s"
    assert human_duration(1_500) == "1.5s"
