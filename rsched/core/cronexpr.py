"""Cron expressions and their ticks, in a time zone, as epoch milliseconds.

Dialects (SPEC §4; the field rules are in :mod:`rsched.core.cronfields`): ``cron``
(Vixie/cronie, 5 fields), ``spring`` (Spring's ``CronExpression``, 6 fields,
seconds first) and ``quartz`` (6 or 7 fields, seconds first, 1 = SUN, ``?``
in one day field, an optional year). Without ``dialect`` 5 fields are
``cron`` and 6 are ``spring``; 7 fields need ``quartz`` said. Aliases
``@hourly @daily @midnight @weekly @monthly @yearly @annually`` are cron's
(or the same times in the dialect given). ``@reboot`` is refused, and so is
an expression that never fires (``0 0 31 2 *``, or a Quartz year list that is
all past).

Time zones and DST: cronie's rule, for every dialect. A schedule whose
second, minute or hour field starts with ``*`` is a *wildcard* schedule: its
ticks are the instants whose local reading matches, so it fires through both
passes of a repeated hour and has no tick in a skipped hour. Any other
schedule is one of fixed local times: a time in a gap fires once, at the
first instant after the gap (several collapse into that one); a time in a
repeated hour fires once, at its first occurrence.

How: the timeline is cut into segments of one UTC offset (at the zone's
transitions, and at UTC year starts so that a segment stays short). Inside a
segment the map wall = instant + offset is a translation, and the wall-clock
search of :class:`~rsched.core.cronfields.Fields` answers. A fixed-time schedule
also skips the walls a segment repeats from the one before it (the second
pass of an overlap) and maps the walls of a gap at a segment's end to that
end. Transitions are found by probing the offset every 6 hours of a year and
bisecting to the second, once per zone and year (about 1,500 offset look-ups,
~2 ms), then cached.

croniter is no longer used here (it misread ``a-a``, ``7/n`` in day-of-week,
Spring's AND of the day fields, and gave ``R`` a different tick on every
call); it stays declared in pyproject.toml because the design card lists it.
"""

from __future__ import annotations

import calendar
import functools
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from rsched.core.cronfields import (
    DIALECTS,
    FIELD_COUNT,
    FIELD_NAMES,
    QUARTZ_YEARS,
    FieldError,
    Fields,
    parse_fields,
)
from rsched.core.errors import BadInput
from rsched.core.timeutil import zone as parse_zone

CRON_FORM = (
    "a cron expression: 5 fields (min hour dom mon dow; dialect cron), 6 fields with "
    "seconds first (like '0 0 2 * * ?'; dialect spring, or quartz), 7 with a year "
    "(--dialect quartz), or @hourly, @daily, @weekly, @monthly, @yearly"
)

_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# the same times in the 6-field dialects (Spring's own macros; Quartz has none)
_ALIASES6 = {
    "spring": {k: "0 " + v for k, v in _ALIASES.items()},
    "quartz": {
        "@yearly": "0 0 0 1 1 ?",
        "@annually": "0 0 0 1 1 ?",
        "@monthly": "0 0 0 1 * ?",
        "@weekly": "0 0 0 ? * SUN",
        "@daily": "0 0 0 * * ?",
        "@midnight": "0 0 0 * * ?",
        "@hourly": "0 0 * * * ?",
    },
}

_YEAR_S = 31_556_952  # mean Gregorian year
_HORIZON_S = 401 * _YEAR_S  # day patterns repeat every 400 years
_PROBE_S = 6 * 3600


class _Zone:
    """Offsets and transitions of one zone, cached per UTC year."""

    def __init__(self, name: str):
        self.z = ZoneInfo(name)
        self._years: dict[int, list[int]] = {}

    def off(self, t: int) -> int:
        o = datetime.fromtimestamp(t, self.z).utcoffset()
        return int(o.total_seconds()) if o is not None else 0

    def _transitions(self, year: int) -> list[int]:
        got = self._years.get(year)
        if got is None:
            got = []
            a = calendar.timegm((year, 1, 1, 0, 0, 0))
            b = calendar.timegm((year + 1, 1, 1, 0, 0, 0))
            prev = self.off(a)
            p = a
            while p < b:
                q = min(p + _PROBE_S, b)
                o = self.off(q)
                if o != prev:
                    lo, hi = p, q  # off(lo) == prev, off(hi) != prev
                    while hi - lo > 1:
                        mid = (lo + hi) // 2
                        if self.off(mid) == prev:
                            lo = mid
                        else:
                            hi = mid
                    if hi < b:
                        got.append(hi)
                    prev = o
                p = q
            self._years[year] = got
        return got

    def segment(self, t: int) -> tuple[int, int]:
        """[start, end) around instant t with one offset (cut at UTC year starts too)."""
        year = datetime.fromtimestamp(t, UTC).year
        start = calendar.timegm((year, 1, 1, 0, 0, 0))
        end = calendar.timegm((year + 1, 1, 1, 0, 0, 0))
        for tr in self._transitions(year):
            if tr <= t:
                start = tr
            else:
                end = tr
                break
        return start, end


@functools.lru_cache(maxsize=64)
def _zone(name: str) -> _Zone:
    return _Zone(name)


@dataclass(frozen=True)
class Schedule:
    """A parsed cron expression in one time zone and dialect."""

    expr: str  # as the user wrote it (whitespace normalised)
    tz: str
    dialect: str = "cron"
    wildcard: bool = False  # second, minute or hour starts with '*' (the DST rule)
    _fields: Fields | None = field(default=None, compare=False, repr=False)
    _first_s: int | None = field(default=None, compare=False, repr=False)
    _last_s: int | None = field(default=None, compare=False, repr=False)

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.tz)

    def _none(self, what: str, ms: int) -> BadInput:
        return BadInput("--schedule", f"{self.expr!r} has no tick {what} {ms} ms")

    # --- ticks (internally whole seconds) ---------------------------------------
    def _next_s(self, t: int) -> int | None:
        """The first tick at or after second t."""
        F = self._fields
        assert F is not None
        z = _zone(self.tz)
        stop = t + _HORIZON_S if self._last_s is None else min(t + _HORIZON_S, self._last_s)
        if self._first_s is not None:
            t = max(t, self._first_s)
        while t < stop:
            start, end = z.segment(t)
            o, o_prev, o_next = z.off(t), z.off(start - 1), z.off(end)
            lo = t + o
            if not self.wildcard and o_prev > o:
                lo = max(lo, start + o_prev)  # walls the overlap repeats fired already
            w = F.next_wall(lo, end + o)
            if w is not None:
                return w - o
            if not self.wildcard and o_next > o and F.next_wall(end + o, end + o_next) is not None:
                return end  # a fixed time in the gap fires at its end
            t = end
        return None

    def _prev_s(self, t: int) -> int | None:
        """The last tick at or before second t."""
        F = self._fields
        assert F is not None
        z = _zone(self.tz)
        stop = t - _HORIZON_S if self._first_s is None else max(t - _HORIZON_S, self._first_s)
        if self._last_s is not None:
            t = min(t, self._last_s)
        while t >= stop:
            start, _end = z.segment(t)
            o, o_prev = z.off(t), z.off(start - 1)
            lo = start + o
            if not self.wildcard and o_prev > o:
                lo = start + o_prev
            if t + o >= lo:
                w = F.prev_wall(t + o, lo)
                if w is not None:
                    return w - o
            if (
                not self.wildcard
                and o > o_prev
                and F.prev_wall(start + o - 1, start + o_prev) is not None
            ):
                return start
            t = start - 1
        return None

    def next_after(self, ms: int) -> int:
        """The first tick strictly after instant ``ms`` (epoch ms)."""
        t = self._next_s(ms // 1000 + 1)
        if t is None:
            raise self._none("after", ms)
        return t * 1000

    def prev_at_or_before(self, ms: int) -> int:
        """The latest tick at or before instant ``ms``."""
        t = self._prev_s(ms // 1000)
        if t is None:
            raise self._none("at or before", ms)
        return t * 1000

    def ticks_between(self, after_ms: int, until_ms: int, limit: int = 1000) -> list[int]:
        """Ticks t with ``after_ms < t <= until_ms``, the latest ``limit`` of them, ascending."""
        out: list[int] = []
        t = self._prev_s(until_ms // 1000)
        while t is not None and t * 1000 > after_ms and len(out) < limit:
            out.append(t * 1000)
            t = self._prev_s(t - 1)
        out.reverse()
        return out

    def interval_ms(self, around_ms: int) -> int:
        """Distance between the two ticks after ``around_ms`` (a hint for grace periods)."""
        a = self._next_s(around_ms // 1000 + 1)
        b = self._next_s(a + 1) if a is not None else None
        if a is None or b is None:
            return 86_400_000
        return (b - a) * 1000


def dialect_of(expr: str, dialect: str | None) -> str:
    """The dialect an expression is read in: the one given, else by its field count."""
    if dialect:
        return dialect
    return "spring" if len(expr.split()) == 6 else "cron"


def parse(
    expr: str,
    tz: str = "UTC",
    field: str = "--schedule",
    tz_field: str = "--tz",
    dialect: str | None = None,
    dialect_field: str = "--dialect",
) -> Schedule:
    """Parse and check a cron expression; refuses never-firing ones."""
    if dialect is not None and dialect not in DIALECTS:
        raise BadInput(dialect_field, f"{dialect!r} is not one of {', '.join(DIALECTS)}")
    if not isinstance(expr, str) or not expr.strip():
        raise BadInput(field, f"is empty; give {CRON_FORM}")
    parse_zone(tz, tz_field)
    return _parse(" ".join(expr.split()), tz, field, dialect or None)


@functools.lru_cache(maxsize=512)
def _parse(text: str, tz: str, field: str, dialect: str | None) -> Schedule:
    low = text.lower()
    if low == "@reboot":
        raise BadInput(
            field,
            "@reboot is not a schedule rsched can keep (there is no 'boot' of a cluster); "
            f"give {CRON_FORM}",
        )
    if low.startswith("@"):
        if low not in _ALIASES:
            raise BadInput(field, f"{text!r} is not a known alias; give {CRON_FORM}")
        d = dialect or "cron"
        body = _ALIASES[low] if d == "cron" else _ALIASES6[d][low]
    else:
        body = text
    fields = body.split(" ")
    n = len(fields)
    if dialect is None:
        if n == 7:
            raise BadInput(
                field,
                f"{text!r} has 7 fields: a year field is Quartz's; say --dialect quartz "
                "(6 fields are read as spring, 5 as cron)",
            )
        d = "spring" if n == 6 else "cron"
    else:
        d = dialect
    if n not in FIELD_COUNT[d]:
        counts = " or ".join(str(c) for c in FIELD_COUNT[d])
        hint = {
            5: "5 fields are cron's",
            6: "6 fields are spring's or quartz's",
            7: "7 fields are quartz's",
        }.get(n, "")
        raise BadInput(
            field,
            f"{text!r} has {n} field{'s' if n != 1 else ''}; dialect {d} takes {counts} "
            f"({FIELD_NAMES[d]}){'; ' + hint if hint else ''}",
        )
    try:
        F = parse_fields(fields, d)
    except FieldError as e:
        raise BadInput(field, f"{text!r}: {e} (dialect {d})") from None
    lead = fields[:2] if d == "cron" else fields[:3]
    wild = any(f.startswith("*") for f in lead)
    first = last = None
    if F.years is not None and (F.years[0], F.years[-1]) != QUARTZ_YEARS:
        first = calendar.timegm((F.years[0], 1, 1, 0, 0, 0)) - 2 * 86400
        last = calendar.timegm((F.years[-1] + 1, 1, 1, 0, 0, 0)) + 2 * 86400
    elif F.years is not None:
        last = calendar.timegm((QUARTZ_YEARS[1] + 1, 1, 1, 0, 0, 0)) + 2 * 86400
    sched = Schedule(
        expr=text, tz=tz, dialect=d, wildcard=wild, _fields=F, _first_s=first, _last_s=last
    )
    # Fires at all? Day patterns repeat every 400 years: search one cycle of walls.
    if F.years is not None:
        ok = sched._next_s(int(time.time())) is not None
        if not ok:
            raise BadInput(field, f"{text!r} never fires again (its years are past)")
    elif F.next_wall(calendar.timegm((2000, 1, 1, 0, 0, 0)), 401 * _YEAR_S + 946_684_800) is None:
        raise BadInput(field, f"{text!r} never fires (no date matches it); give {CRON_FORM}")
    return sched


def parse_every(text: str, field: str = "--once-per") -> int | None:
    """A plain duration for ``--once-per`` (``10m``), in ms; None when it is not one."""
    from rsched.core.timeutil import parse_duration

    try:
        return parse_duration(text, field)
    except BadInput:
        return None
