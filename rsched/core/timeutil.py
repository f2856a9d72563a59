"""Durations, instants and their display. Redis holds integer milliseconds;
the edges show ISO 8601 UTC with milliseconds and a ``Z``."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from rsched.core.errors import BadInput

if TYPE_CHECKING:  # pragma: no cover
    from zoneinfo import ZoneInfo

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DUR_PART = re.compile(r"([0-9]+)(ms|s|m|h|d)")
_DUR_FULL = re.compile(r"(?:[0-9]+(?:ms|s|m|h|d))+")

DURATION_FORM = "a positive duration like 500ms, 30s, 30m, 2h, 1d or a sum like 1h30m"


def parse_duration(text: str, field: str = "duration", allow_zero: bool = False) -> int:
    """``"1h30m"`` -> 5400000 (milliseconds)."""
    s = str(text).strip()
    if not _DUR_FULL.fullmatch(s):
        raise BadInput(field, f"{text!r} is not {DURATION_FORM}")
    ms = sum(int(n) * _UNITS_MS[u] for n, u in _DUR_PART.findall(s))
    if ms <= 0 and not allow_zero:
        raise BadInput(field, f"{text!r} is not {DURATION_FORM}")
    if ms > 100 * 365 * 86_400_000:
        raise BadInput(field, f"{text!r} is longer than 100 years")
    return ms


def zone(name: str, field: str = "--tz") -> ZoneInfo:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError  # lazily: most commands never need a zone

    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise BadInput(
            field, f"{name!r} is not an IANA time zone name (like Europe/Berlin or UTC)"
        ) from None


TIME_FORM = (
    "an ISO 8601 time with an offset or Z, like 2026-12-01T02:00+08:00 or 2026-12-01T02:00:00Z"
)


def parse_time(text: str, field: str = "--at", tz: str | None = None) -> int:
    """ISO 8601 -> epoch milliseconds. A time without an offset needs ``tz``."""
    s = str(text).strip()
    try:
        dt = datetime.fromisoformat(s)
    except ValueError:
        raise BadInput(field, f"{text!r} is not {TIME_FORM}") from None
    if dt.tzinfo is None:
        if tz is None:
            raise BadInput(
                field, f"{text!r} has no offset; add one (+08:00, Z) or say the zone with --tz"
            )
        dt = dt.replace(tzinfo=zone(tz))
    return int(dt.timestamp() * 1000 + (0.5 if dt.timestamp() >= 0 else -0.5))


def iso(ms: int | None) -> str | None:
    """Epoch ms -> ``2026-11-30T05:00:00.000Z``."""
    if ms is None:
        return None
    dt = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=int(ms))
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def human_duration(ms: int) -> str:
    """5400000 -> ``1h 30m``; 1500 -> ``1.5s``; 250 -> ``250ms``."""
    ms = abs(int(ms))
    if ms < 1000:
        return f"{ms}ms"
    if ms < 10_000:
        return f"{ms / 1000:.1f}s"
    s = ms // 1000
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    units = ((d, "d"), (h, "h"), (m, "m"), (s, "s"))
    first = next(i for i, (v, _) in enumerate(units) if v)
    # the two largest adjacent units: 9h 0m 32s is "9h", not "9h 32s"
    return " ".join(f"{v}{u}" for v, u in units[first : first + 2] if v)


def relative(ms: int | None, now_ms: int) -> str:
    """``in 29m 58s`` / ``3s ago`` / ``now``."""
    if ms is None:
        return "-"
    delta = int(ms) - int(now_ms)
    if abs(delta) < 1000:
        return "now"
    return f"in {human_duration(delta)}" if delta > 0 else f"{human_duration(delta)} ago"


def show(ms: int | None, now_ms: int) -> str:
    """Table form: ISO time plus the relative one."""
    if ms is None:
        return "-"
    return f"{iso(ms)} ({relative(ms, now_ms)})"


def local_parts(ms: int, tz: str) -> tuple[str, str]:
    """(ISO 8601 local time with its offset, the offset ``+08:00``) of instant ms in tz."""
    from zoneinfo import ZoneInfo

    d = datetime.fromtimestamp(ms / 1000, ZoneInfo(tz or "UTC"))
    text = d.isoformat(timespec="milliseconds" if ms % 1000 else "seconds")
    off = d.strftime("%z")  # +0800, or +054116 for an old local mean time
    offset = f"{off[:3]}:{off[3:5]}" + (f":{off[5:]}" if len(off) > 5 else "")
    return text, offset


def local_time(ms: int | None, tz: str | None) -> str | None:
    """Instant ms in the zone's own clock, ``2026-03-08 03:00 -04:00`` (None stays None)."""
    from zoneinfo import ZoneInfo

    if ms is None:
        return None
    d = datetime.fromtimestamp(ms / 1000, ZoneInfo(tz or "UTC"))
    return (
        d.strftime("%Y-%m-%d %H:%M")
        + (f":{d.second:02d}" if d.second else "")
        + " "
        + local_parts(ms, tz or "UTC")[1]
    )


def duration_ms(value: Any, field: str) -> int:
    """A duration from the library or a flag: integer milliseconds (> 0), or text
    like ``30s`` / ``1h30m``."""
    if isinstance(value, bool):
        raise BadInput(field, f"{value!r} is not a duration")
    if isinstance(value, int | float):
        if value <= 0:
            raise BadInput(field, f"{value!r} must be a positive number of milliseconds")
        return int(value)
    return parse_duration(str(value), field)
