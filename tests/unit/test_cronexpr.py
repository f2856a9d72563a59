"""Cron expressions: accepted forms, refused ones, time zones and DST."""

from __future__ import annotations

from datetime import datetime

import pytest

from rsched.core import cronexpr
from rsched.core.errors import BadInput
from rsched.core.timeutil import iso


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
    # Hourly is a wildcard schedule (the hour field is '*'): it fires in both passes
    # of the repeated 01:xx hour (cronie's rule, SPEC §4).
    got = ticks("0 * * * *", "America/New_York", "2026-11-01T03:30:00Z", 4)
    assert got == [
        "2026-11-01T04:00:00.000Z",  # 00:00 EDT
        "2026-11-01T05:00:00.000Z",  # 01:00 EDT
        "2026-11-01T06:00:00.000Z",  # 01:00 EST
        "2026-11-01T07:00:00.000Z",  # 02:00 EST
    ]
    # Starting inside the second pass of the overlap does not go back.
    s = cronexpr.parse("30 1 * * *", "America/New_York")
    assert iso(s.next_after(ms("2026-11-01T06:10:00Z"))) == "2026-11-02T06:30:00.000Z"


def test_prev_at_or_before() -> None:
    s = cronexpr.parse("*/20 * * * *", "America/New_York")
    # 06:30Z is 01:30 EST, the second pass: the wildcard schedule fired 01:20 EST.
    assert iso(s.prev_at_or_before(ms("2026-11-01T06:30:00Z"))) == "2026-11-01T06:20:00.000Z"
    f = cronexpr.parse("20 1 * * *", "America/New_York")  # a fixed time: first pass only
    assert iso(f.prev_at_or_before(ms("2026-11-01T06:30:00Z"))) == "2026-11-01T05:20:00.000Z"
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
    from rsched.core.timeutil import human_duration

    assert human_duration(9 * 3_600_000 + 32_000) == "9h"  # not "9h 32s"
    assert human_duration(5_400_000) == "1h 30m"
    assert human_duration(93_660_000) == "1d 2h"
    assert human_duration(61_000) == "1m 1s"
    assert human_duration(1_500) == "1.5s"


# --- dialects (SPEC §4) ------------------------------------------------------------------


def test_dialect_defaults_by_field_count() -> None:
    assert cronexpr.parse("0 9 * * *").dialect == "cron"
    assert cronexpr.parse("0 0 2 * * ?").dialect == "spring"
    assert cronexpr.parse("@daily").dialect == "cron"
    assert cronexpr.parse("0 0 12 ? * 2-6", dialect="quartz").dialect == "quartz"
    with pytest.raises(BadInput, match="--dialect quartz"):
        cronexpr.parse("0 0 12 ? * 2-6 2030")
    with pytest.raises(BadInput, match="dialect spring takes 6"):
        cronexpr.parse("0 9 * * *", dialect="spring")
    with pytest.raises(BadInput, match="dialect cron takes 5"):
        cronexpr.parse("0 0 9 * * *", dialect="cron")
    with pytest.raises(BadInput) as e:
        cronexpr.parse("0 9 * * *", dialect="vixie")
    assert e.value.field == "--dialect"


def test_issue_misreadings_are_fixed() -> None:
    # a-a is the single value a (croniter read it as the whole field)
    assert ticks("0 9-9 * * *", "UTC", "2026-01-01T00:00:00Z", 2) == [
        "2026-01-01T09:00:00.000Z",
        "2026-01-02T09:00:00.000Z",
    ]
    assert ticks("0 0 1 JAN-JAN *", "UTC", "2026-01-02T00:00:00Z", 1) == [
        "2027-01-01T00:00:00.000Z"
    ]
    assert ticks("10-10/5 * * * *", "UTC", "2026-01-01T00:00:00Z", 2) == [
        "2026-01-01T00:10:00.000Z",
        "2026-01-01T01:10:00.000Z",
    ]
    # 7/3 in day-of-week is Sunday only (7 to the field's maximum, 7)
    assert ticks("0 0 * * 7/3", "UTC", "2026-01-01T00:00:00Z", 2) == [
        "2026-01-04T00:00:00.000Z",
        "2026-01-11T00:00:00.000Z",
    ]
    # Spring ANDs the day fields: Friday the 13th
    assert ticks("0 0 0 13 * FRI", "UTC", "2018-07-31T00:00:00Z", 1) == ["2019-09-13T00:00:00.000Z"]
    # cron ORs them unless one starts with '*'
    assert ticks("0 0 13 * FRI", "UTC", "2018-07-31T00:00:00Z", 1) == ["2018-08-03T00:00:00.000Z"]
    assert ticks("1 1 1-7 * */7", "UTC", "2020-01-01T00:00:00Z", 1) == ["2020-01-05T01:01:00.000Z"]
    # Spring: 2-6 is TUE-SAT, so Saturday 2024-01-06 fires (Quartz: MON-FRI, below)
    assert ticks("0 0 12 ? * 2-6", "UTC", "2024-01-06T00:00:00Z", 1) == ["2024-01-06T12:00:00.000Z"]


def qticks(expr: str, start: str, n: int, dialect: str) -> list[str]:
    s = cronexpr.parse(expr, "UTC", dialect=dialect)
    t, out = ms(start), []
    for _ in range(n):
        t = s.next_after(t)
        out.append(iso(t))
    return out


def test_quartz_monday_to_friday() -> None:
    assert qticks("0 0 12 ? * 2-6", "2024-01-06T00:00:00Z", 2, "quartz") == [
        "2024-01-08T12:00:00.000Z",  # Monday
        "2024-01-09T12:00:00.000Z",
    ]


@pytest.mark.parametrize(
    "expr,dialect,field,token",
    [
        ("61 * * * *", None, "minute", "61"),
        ("* 24 * * *", None, "hour", "24"),
        ("0 0 5-1 * *", None, "day-of-month", "5-1"),
        ("0 0 L-2 * *", None, "day-of-month", "L-2"),
        ("0 0 15W * *", None, "day-of-month", "15W"),
        ("0 0 * * 8", None, "day-of-week", "8"),
        ("0 0 * FOO *", None, "month", "FOO"),
        ("R * * * *", None, "minute", "R"),
        ("0 R(10-20) * * *", None, "hour", "R(10-20)"),
        ("H * * * *", None, "minute", "H"),
        ("H/15 * * * *", None, "minute", "H/15"),
        ("0 H(0-5) * * *", None, "hour", "H(0-5)"),
        ("0 0 1~5 * *", None, "day-of-month", "1~5"),
        ("0 0 0 * * L", None, "day-of-week", "L"),
        ("0 0 0 L-0 * *", None, "day-of-month", "L-0"),
        ("0 0 12 * * MON", "quartz", "day-of-month", "*"),
        ("0 0 12 ? * 0", "quartz", "day-of-week", "0"),
        ("0 0 12 1,L * ?", "quartz", "day-of-month", "1,L"),
        ("0 0 12 * * ? 2031-2030", "quartz", "year", "2031-2030"),
    ],
)
def test_refusal_names_field_and_token(
    expr: str, dialect: str | None, field: str, token: str
) -> None:
    with pytest.raises(BadInput) as e:
        cronexpr.parse(expr, dialect=dialect)
    msg = str(e.value)
    assert e.value.field == "--schedule"
    assert f"{field} field {token!r}" in msg, msg


def test_random_values_say_why() -> None:
    with pytest.raises(BadInput, match="every runner would compute a different tick"):
        cronexpr.parse("0 R * * *")


def test_quartz_years_and_wrap() -> None:
    assert qticks("0 0 22-2 * * ?", "2024-01-01T03:00:00Z", 3, "quartz") == [
        "2024-01-01T22:00:00.000Z",
        "2024-01-01T23:00:00.000Z",
        "2024-01-02T00:00:00.000Z",
    ]
    s = cronexpr.parse("0 0 0 1 1 ? 2030,2032", dialect="quartz")
    t = s.next_after(ms("2024-01-01T00:00:00Z"))
    assert iso(t) == "2030-01-01T00:00:00.000Z"
    assert iso(s.next_after(t)) == "2032-01-01T00:00:00.000Z"
    with pytest.raises(BadInput, match="no tick after"):
        s.next_after(ms("2032-01-01T00:00:00Z"))
    with pytest.raises(BadInput, match="never fires again"):
        cronexpr.parse("0 0 0 1 1 ? 2005", dialect="quartz")


def test_wildcard_flag_follows_second_minute_hour() -> None:
    assert cronexpr.parse("*/5 * * * *").wildcard
    assert cronexpr.parse("0 * * * *").wildcard
    assert not cronexpr.parse("0 1 * * *").wildcard
    assert cronexpr.parse("*/10 0 2 * * *").wildcard  # seconds first
    assert not cronexpr.parse("0 0 2 * * ?").wildcard
    assert cronexpr.parse("0/30 * * * * ?").wildcard  # the minute field


@pytest.mark.parametrize(
    "tz,expr,start,want",
    [
        # Lord Howe: 30-minute DST. 2026-10-04 02:00 +10:30 -> 02:30 +11:00. A fixed time
        # in the gap fires at 02:30; a wildcard schedule skips 02:00 and 02:20.
        (
            "Australia/Lord_Howe",
            "15 2 * * *",
            "2026-10-03T14:00:00Z",
            ["2026-10-03T15:30:00.000Z", "2026-10-04T15:15:00.000Z"],
        ),
        (
            "Australia/Lord_Howe",
            "*/20 * * * *",
            "2026-10-03T15:10:00Z",
            ["2026-10-03T15:40:00.000Z", "2026-10-03T16:00:00.000Z", "2026-10-03T16:20:00.000Z"],
        ),
        # 2026-04-05 02:00 +11:00 -> 01:30 +10:30: 01:45 twice for a wildcard schedule
        (
            "Australia/Lord_Howe",
            "45 * * * *",
            "2026-04-04T14:00:00Z",
            ["2026-04-04T14:45:00.000Z", "2026-04-04T15:15:00.000Z", "2026-04-04T16:15:00.000Z"],
        ),
        (
            "Australia/Lord_Howe",
            "45 1 * * *",
            "2026-04-04T14:00:00Z",
            ["2026-04-04T14:45:00.000Z", "2026-04-05T15:15:00.000Z"],
        ),
        # Chatham: +12:45 -> +13:45 at 02:45 local on 2026-09-27
        (
            "Pacific/Chatham",
            "0 3 * * *",
            "2026-09-26T12:00:00Z",
            ["2026-09-26T14:00:00.000Z", "2026-09-27T13:15:00.000Z"],
        ),  # 03:45 +13:45, then 03:00
        # Kathmandu has no DST now: an odd offset only
        ("Asia/Kathmandu", "0 9 * * *", "2026-01-01T00:00:00Z", ["2026-01-01T03:15:00.000Z"]),
    ],
)
def test_dst_in_odd_zones(tz: str, expr: str, start: str, want: list[str]) -> None:
    assert ticks(expr, tz, start, len(want)) == want
