"""Cron expressions and their ticks, in a time zone, as epoch milliseconds.

Accepted forms (SPEC "Cron expressions"):

- 5 fields, standard cron: ``minute hour day-of-month month day-of-week``;
- 6 fields, **seconds first** (Spring/Quartz order): ``0 0 2 * * ?``;
- ``?`` in the day fields means "any" (Quartz);
- ``@hourly @daily @midnight @weekly @monthly @yearly @annually``.

Refused with :class:`~rsched.errors.BadInput` naming the field: ``@reboot``,
anything croniter cannot parse, and expressions that never fire
(``0 0 31 2 *``).

Time zones and DST. Ticks are computed on the zone's *wall clock* (naive
local times, croniter), then mapped to instants by a monotonic map:

- a wall time in a DST **gap** (02:30 on a spring-forward day in New York)
  maps to the first valid instant after the gap (03:00 local), so the tick
  fires once, late; several gap ticks collapse into that one instant;
- a wall time in an **overlap** (01:30 on a fall-back day) maps to its first
  occurrence only, so the tick fires once.

Because the map is monotonic, "next tick after instant t" is the first wall
tick whose instant is > t, and "latest tick at or before t" the last wall
tick whose instant is <= t.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from croniter import CroniterBadCronError, CroniterBadDateError, CroniterError, croniter

from rsched.errors import BadInput
from rsched.timeutil import zone as parse_zone

CRON_FORM = (
    "a cron expression: 5 fields (min hour dom mon dow), 6 fields with seconds first "
    "(like '0 0 2 * * ?'), or @hourly, @daily, @weekly, @monthly, @yearly"
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

_EPOCH = datetime(1970, 1, 1)


def _to_ms(naive_utc: datetime) -> int:
    d = naive_utc - _EPOCH
    return (d.days * 86_400 + d.seconds) * 1000 + d.microseconds // 1000


def _from_ms(ms: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


@dataclass(frozen=True)
class Schedule:
    """A parsed cron expression in one time zone."""

    expr: str  # as the user wrote it
    tz: str
    _croniter_expr: str
    _seconds: bool

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.tz)

    # --- wall clock <-> instants ---------------------------------------------
    def _wall(self, ms: int) -> tuple[datetime, int]:
        """Instant -> (naive local wall time, fold)."""
        local = _from_ms(ms).astimezone(self.zone)
        return local.replace(tzinfo=None), local.fold

    def _instant(self, wall: datetime) -> int:
        """Naive local wall time -> epoch ms (gap: first instant after it; overlap: first)."""
        z = self.zone
        first = wall.replace(tzinfo=z, fold=0)
        ms = _to_ms(first.astimezone(UTC).replace(tzinfo=None))
        back = _from_ms(ms).astimezone(z).replace(tzinfo=None)
        if back == wall:
            return ms
        # In a gap: fold=0 uses the offset before the transition, fold=1 the one after;
        # the transition instant lies between the two readings.
        lo = _to_ms(wall.replace(tzinfo=z, fold=1).astimezone(UTC).replace(tzinfo=None))
        hi = ms
        if lo > hi:
            lo, hi = hi, lo
        off_hi = _from_ms(hi).astimezone(z).utcoffset()
        while hi - lo > 1:  # first ms whose offset is the post-transition one
            mid = (lo + hi) // 2
            if _from_ms(mid).astimezone(z).utcoffset() == off_hi:
                hi = mid
            else:
                lo = mid
        return hi

    def _overlap_end(self, ms: int) -> datetime | None:
        """If ``ms`` is the second occurrence of an ambiguous wall time, the wall
        time at which the ambiguity ends (ticks before it already fired)."""
        wall, fold = self._wall(ms)
        if fold == 0:
            return None
        z = self.zone
        off1 = wall.replace(tzinfo=z, fold=1).utcoffset()
        off0 = wall.replace(tzinfo=z, fold=0).utcoffset()
        if off0 is None or off1 is None or off0 == off1:
            return None
        # Transition instant T in (ms - (off0 - off1), ms]: offset changes from off0 to off1.
        lo = ms - int((off0 - off1).total_seconds() * 1000)
        hi = ms
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if _from_ms(mid).astimezone(z).utcoffset() == off1:
                hi = mid
            else:
                lo = mid
        return self._wall(hi)[0] + (off0 - off1)

    def _iter(self, start_wall: datetime, is_prev: bool = False) -> croniter:
        return croniter(
            self._croniter_expr,
            start_wall,
            second_at_beginning=self._seconds,
            is_prev=is_prev,
            max_years_between_matches=30,
        )

    # --- ticks ------------------------------------------------------------------
    def next_after(self, ms: int) -> int:
        """The first tick strictly after instant ``ms`` (epoch ms)."""
        end = self._overlap_end(ms)
        if end is not None:
            it = self._iter(end - timedelta(microseconds=1))
        else:
            wall, _ = self._wall(ms)
            it = self._iter(wall)
        for _ in range(100_000):
            t = self._instant(it.get_next(datetime))
            if t > ms:
                return t
        raise BadInput("--schedule", f"{self.expr!r}: no tick found after {ms}")  # pragma: no cover

    def prev_at_or_before(self, ms: int) -> int:
        """The latest tick at or before instant ``ms``."""
        end = self._overlap_end(ms)
        if end is not None:
            it = self._iter(end, is_prev=True)
        else:
            wall, _ = self._wall(ms)
            # croniter's get_prev is strictly before its start: nudge past ``wall``.
            it = self._iter(wall + timedelta(microseconds=1), is_prev=True)
        for _ in range(100_000):
            t = self._instant(it.get_prev(datetime))
            if t <= ms:
                return t
        raise BadInput(
            "--schedule", f"{self.expr!r}: no tick found before {ms}"
        )  # pragma: no cover

    def ticks_between(self, after_ms: int, until_ms: int, limit: int = 1000) -> list[int]:
        """Ticks t with ``after_ms < t <= until_ms``, the latest ``limit`` of them, ascending."""
        out: list[int] = []
        t = self.prev_at_or_before(until_ms)
        while t > after_ms and len(out) < limit:
            out.append(t)
            t = self.prev_at_or_before(t - 1)
        out.reverse()
        return out

    def interval_ms(self, around_ms: int) -> int:
        """Distance between the two ticks after ``around_ms`` (a hint for grace periods)."""
        a = self.next_after(around_ms)
        return self.next_after(a) - a


def parse(
    expr: str, tz: str = "UTC", field: str = "--schedule", tz_field: str = "--tz"
) -> Schedule:
    """Parse and check a cron expression; refuses never-firing ones."""
    if not isinstance(expr, str) or not expr.strip():
        raise BadInput(field, f"is empty; give {CRON_FORM}")
    text = " ".join(expr.split())
    parse_zone(tz, tz_field)
    low = text.lower()
    if low == "@reboot":
        raise BadInput(
            field,
            "@reboot is not a schedule rsched can keep (there is no 'boot' of a cluster); "
            f"give {CRON_FORM}",
        )
    if low.startswith("@"):
        if low not in _ALIASES:
            raise BadInput(field, f"{expr!r} is not a known alias; give {CRON_FORM}")
        cexpr, seconds = _ALIASES[low], False
    else:
        fields = text.split(" ")
        if len(fields) == 5:
            seconds = False
        elif len(fields) == 6:
            seconds = True
        else:
            raise BadInput(
                field,
                f"{expr!r} has {len(fields)} field{'s' if len(fields) != 1 else ''}; give {CRON_FORM}",
            )
        # '?' (Quartz "no specific value") only in the day fields.
        dom_i, dow_i = (3, 5) if seconds else (2, 4)
        for i, f in enumerate(fields):
            if "?" in f and (i not in (dom_i, dow_i) or f != "?"):
                raise BadInput(
                    field,
                    f"{expr!r}: '?' is accepted only as a whole day-of-month or day-of-week field",
                )
        fields = ["*" if f == "?" else f for f in fields]
        cexpr = " ".join(fields)
    try:
        if not croniter.is_valid(cexpr, second_at_beginning=seconds):
            raise BadInput(field, f"{expr!r} is not {CRON_FORM}")
    except TypeError:  # older croniter without second_at_beginning in is_valid
        pass
    sched = Schedule(expr=text, tz=tz, _croniter_expr=cexpr, _seconds=seconds)
    try:
        # Fires at all? Search forward from a fixed point (covers leap years) and from now.
        it = croniter(
            cexpr, datetime(2024, 1, 1), second_at_beginning=seconds, max_years_between_matches=30
        )
        it.get_next(datetime)
    except CroniterBadDateError:
        raise BadInput(
            field, f"{expr!r} never fires (no date matches it); give {CRON_FORM}"
        ) from None
    except (CroniterBadCronError, CroniterError, ValueError, KeyError) as exc:
        raise BadInput(field, f"{expr!r} is not {CRON_FORM} ({exc})") from None
    return sched


def parse_every(text: str, field: str = "--once-per") -> int | None:
    """A plain duration for ``--once-per`` (``10m``), in ms; None when it is not one."""
    from rsched.timeutil import parse_duration

    try:
        return parse_duration(text, field)
    except BadInput:
        return None
