"""Cron fields, per dialect: text -> value sets and a day rule; the wall-clock search.

This module knows nothing of time zones: it answers "which local wall times
match?" (walls are seconds since 1970-01-01 00:00 *local*, a naive clock).
:mod:`rsched.core.cronexpr` maps walls to instants and owns the DST policy.

Dialects (SPEC §4 "Cron dialects and preview"), each read the way its own
users read it:

``cron``   Vixie/cronie ``crontab(5)``: 5 fields ``min hour dom mon dow``;
           dow 0-7 (0 and 7 = SUN), names SUN-SAT and JAN-DEC; ``a-b/n``;
           ``a/n`` = a to the field's maximum in steps of n; ``a-a`` is the
           single value a. Day-of-month and day-of-week are ORed unless
           either field *starts with* ``*`` (then ANDed: cronie's DOM_STAR /
           DOW_STAR flags, so ``1 1 1-7 * */7`` is ANDed). Extensions kept
           from cronsim (Healthchecks): ``L`` and ``LW`` in day-of-month,
           ``nL`` and ``n#k`` in day-of-week.
``spring`` Spring's ``CronExpression``: 6 fields ``sec min hour dom mon dow``;
           dow 1-7 = MON-SUN (0 = SUN too), names replaced by those numbers
           before parsing (so ``SUN-FRI`` is ``7-5``, and a range starting at
           7 starts at Sunday 0); ``*`` in dow is 1-7, so ``*/2`` is MON,
           WED, FRI, SUN; ``?`` = ``*`` in the day fields; day-of-month and
           day-of-week are always ANDed (``0 0 0 13 * FRI`` is Friday the
           13th); ``L``, ``L-n``, ``LW``, ``nW`` in day-of-month, ``nL`` and
           ``n#k`` in day-of-week, also inside lists.
``quartz`` Quartz's ``CronExpression``: 6 or 7 fields (the 7th a year,
           1970-2099); dow 1-7 = SUN-SAT; exactly one of the day fields is
           ``?``; a reversed range wraps (``FRI-MON``, hours ``22-2``);
           ``L``, ``L-n``, ``LW``, ``L-nW``, ``nW`` in day-of-month, ``L``
           (= SAT), ``nL``, ``n#k`` in day-of-week, each standing alone.

Everything else is refused with :class:`FieldError`, naming the field and the
token: values out of range, reversed ranges where the dialect does not define
them, and random or hashed values (``R``, ``R(a-b)``, Jenkins ``H``, cronie's
``~``), which would give every runner a different tick.

``nW`` (nearest weekday) never leaves its month: a Saturday moves to Friday
(the 1st to Monday the 3rd); a Sunday moves to Monday, except on the last day
of the month, where Quartz moves it to Friday and Spring does not fire that
month (as Spring computes it). A month without day n does not fire.

Search cost: one month's matching days are computed once (≤ 31 checks) and
cached; the time of day is found by bisection in the hour, minute and second
lists, so a next/prev search costs a few bisections per month it passes.
"""

from __future__ import annotations

import calendar
from bisect import bisect_left, bisect_right
from datetime import date

DIALECTS = ("cron", "spring", "quartz")

_EPOCH_ORD = date(1970, 1, 1).toordinal()
_MONTHS = "JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split()
_SUN_FIRST = "SUN MON TUE WED THU FRI SAT".split()
_MON_FIRST = "MON TUE WED THU FRI SAT SUN".split()
QUARTZ_YEARS = (1970, 2099)


class FieldError(ValueError):
    """A token the dialect refuses: names the field and the token."""

    def __init__(self, field: str, token: str, reason: str):
        self.field, self.token, self.reason = field, token, reason
        super().__init__(f"{field} field {token!r}: {reason}")


class _F:
    """One field's name, bounds and names (value = index + base)."""

    def __init__(self, name: str, lo: int, hi: int, names: list[str] | None = None, base: int = 0):
        self.name, self.lo, self.hi = name, lo, hi
        self.names = {n: i + base for i, n in enumerate(names or [])}

    def err(self, token: str, reason: str) -> FieldError:
        return FieldError(self.name, token, reason)

    def num(self, s: str, whole: str) -> int:
        u = s.upper()
        if u in self.names:
            return self.names[u]
        if not _digits(s):
            what = "a number" + (" or a name" if self.names else "")
            raise self.err(whole, f"{s!r} is not {what} ({self.form()})")
        v = int(s)
        if not self.lo <= v <= self.hi:
            raise self.err(whole, f"{v} is out of range ({self.form()})")
        return v

    def form(self) -> str:
        f = f"{self.lo}-{self.hi}"
        if self.names:
            first = min(self.names, key=lambda n: self.names[n])
            last = max(self.names, key=lambda n: self.names[n])
            f += f" or {first}-{last}"
        return f


def _digits(s: str) -> bool:
    """ASCII digits only (str.isdigit() accepts '¹' and other Unicode digits)."""
    return s.isascii() and s.isdigit()


def _step(f: _F, s: str, whole: str, limit: int | None = None) -> int:
    if not _digits(s) or int(s) == 0:
        raise f.err(whole, f"the step after '/' must be a whole number >= 1, not {s!r}")
    n = int(s)
    if limit is not None and n > limit:
        raise f.err(whole, f"the step {n} is larger than the field allows ({limit})")
    return n


def _refuse_random(f: _F, tok: str) -> None:
    u = tok.upper()
    if u == "R" or u.startswith("R(") or u == "H" or u.startswith(("H(", "H/")) or "~" in u:
        raise f.err(
            tok,
            "random and hashed values (R, R(a-b), Jenkins H, cronie ~) are refused: every "
            "runner would compute a different tick, so one fire per tick could not hold; "
            "write fixed values",
        )


# --- the day rule --------------------------------------------------------------------


class DayRule:
    """Which days of a month match: day-of-month items, day-of-week items, and how
    the two combine (``and``, ``or``, ``dom`` only, ``dow`` only)."""

    def __init__(self) -> None:
        self.mode = "and"
        self.dom: set[int] = set()
        self.dom_last_offsets: set[int] = set()  # L (0), L-n (n)
        self.dom_lw_offsets: set[int] = set()  # LW (0), quartz L-nW (n)
        self.dom_nearest: set[int] = set()  # nW
        self.w_sunday_last = "skip"  # nW on a Sunday that ends the month: skip | friday
        self.dow: set[int] = set()  # weekday() numbers, 0 = Monday
        self.dow_nth: set[tuple[int, int]] = set()  # (weekday, k): the k-th in the month
        self.dow_last: set[int] = set()  # the last such weekday in the month

    def _nearest(self, n: int, first_wd: int, dim: int) -> int | None:
        if n > dim or n < 1:
            return None
        wd = (first_wd + n - 1) % 7
        if wd < 5:
            return n
        if wd == 5:  # Saturday
            return 3 if n == 1 else n - 1
        if n < dim:  # Sunday
            return n + 1
        return n - 2 if self.w_sunday_last == "friday" else None

    def dom_days(self, first_wd: int, dim: int) -> set[int]:
        out = {d for d in self.dom if d <= dim}
        out.update(dim - n for n in self.dom_last_offsets if dim - n >= 1)
        for n in self.dom_lw_offsets:
            d = dim - n
            if d < 1:
                continue
            if n == 0:  # LW: the last weekday of the month
                wd = (first_wd + d - 1) % 7
                out.add(d - 1 if wd == 5 else d - 2 if wd == 6 else d)
            else:  # quartz L-nW: the weekday nearest n days before the last
                r = self._nearest(d, first_wd, dim)
                if r is not None:
                    out.add(r)
        for n in self.dom_nearest:
            r = self._nearest(n, first_wd, dim)
            if r is not None:
                out.add(r)
        return out

    def dow_days(self, first_wd: int, dim: int) -> set[int]:
        out = set()
        for d in range(1, dim + 1):
            wd = (first_wd + d - 1) % 7
            if (
                wd in self.dow
                or (wd, (d + 6) // 7) in self.dow_nth
                or (wd in self.dow_last and d + 7 > dim)
            ):
                out.add(d)
        return out

    def days(self, year: int, month: int) -> tuple[int, ...]:
        first_wd, dim = calendar.monthrange(year, month)
        if self.mode == "dom":
            s = self.dom_days(first_wd, dim)
        elif self.mode == "dow":
            s = self.dow_days(first_wd, dim)
        elif self.mode == "or":
            s = self.dom_days(first_wd, dim) | self.dow_days(first_wd, dim)
        else:
            s = self.dom_days(first_wd, dim) & self.dow_days(first_wd, dim)
        return tuple(sorted(s))


# --- matching and search -------------------------------------------------------------


class Fields:
    """A parsed expression: sorted second/minute/hour lists, months, years, a day rule."""

    def __init__(
        self,
        seconds: set[int],
        minutes: set[int],
        hours: set[int],
        months: set[int],
        rule: DayRule,
        years: set[int] | None = None,
    ):
        self.S = tuple(sorted(seconds))
        self.M = tuple(sorted(minutes))
        self.H = tuple(sorted(hours))
        self.months = frozenset(months)
        self.rule = rule
        self.years = tuple(sorted(years)) if years is not None else None
        self._days: dict[tuple[int, int], tuple[int, ...]] = {}

    def month_days(self, y: int, m: int) -> tuple[int, ...]:
        k = (y, m)
        v = self._days.get(k)
        if v is None:
            if len(self._days) > 4096:
                self._days.clear()
            v = self._days[k] = self.rule.days(y, m)
        return v

    def _year_ok(self, y: int) -> bool:
        return self.years is None or y in self.years

    def _next_year(self, y: int) -> int | None:
        if self.years is None:
            return y + 1
        i = bisect_right(self.years, y)
        return self.years[i] if i < len(self.years) else None

    def _prev_year(self, y: int) -> int | None:
        if self.years is None:
            return y - 1
        i = bisect_left(self.years, y) - 1
        return self.years[i] if i >= 0 else None

    def _next_tod(self, sod: int) -> int | None:
        H, M, S = self.H, self.M, self.S
        h, rem = divmod(sod, 3600)
        mi, s = divmod(rem, 60)
        i = bisect_left(H, h)
        while i < len(H):
            hh = H[i]
            if hh != h:
                return hh * 3600 + M[0] * 60 + S[0]
            j = bisect_left(M, mi)
            while j < len(M):
                mm = M[j]
                if mm != mi:
                    return hh * 3600 + mm * 60 + S[0]
                k = bisect_left(S, s)
                if k < len(S):
                    return hh * 3600 + mm * 60 + S[k]
                j += 1
            i += 1
        return None

    def _prev_tod(self, sod: int) -> int | None:
        H, M, S = self.H, self.M, self.S
        h, rem = divmod(sod, 3600)
        mi, s = divmod(rem, 60)
        i = bisect_right(H, h) - 1
        while i >= 0:
            hh = H[i]
            if hh != h:
                return hh * 3600 + M[-1] * 60 + S[-1]
            j = bisect_right(M, mi) - 1
            while j >= 0:
                mm = M[j]
                if mm != mi:
                    return hh * 3600 + mm * 60 + S[-1]
                k = bisect_right(S, s) - 1
                if k >= 0:
                    return hh * 3600 + mm * 60 + S[k]
                j -= 1
            i -= 1
        return None

    def next_wall(self, lo: int, hi: int) -> int | None:
        """The first matching wall ``w`` with ``lo <= w < hi``, or None."""
        day, sod = divmod(lo, 86400)
        while day * 86400 < hi:
            d = date.fromordinal(_EPOCH_ORD + day)
            y, m = d.year, d.month
            if not self._year_ok(y) or m not in self.months:
                if self._year_ok(y):
                    nm = next((x for x in range(m + 1, 13) if x in self.months), None)
                    ny: int | None = y
                else:
                    nm = None
                    ny = None
                if nm is None:
                    ny = self._next_year(y)
                    if ny is None or ny > 9998:
                        return None
                    nm = min(self.months)
                day, sod = date(ny, nm, 1).toordinal() - _EPOCH_ORD, 0  # type: ignore[arg-type]
                continue
            mdays = self.month_days(y, m)
            i = bisect_left(mdays, d.day)
            while i < len(mdays):
                dd = mdays[i]
                t = self._next_tod(sod if dd == d.day else 0)
                if t is not None:
                    w = (day + dd - d.day) * 86400 + t
                    return w if w < hi else None
                i += 1
            if y > 9998:
                return None
            nxt = date(y + 1, 1, 1) if m == 12 else date(y, m + 1, 1)
            day, sod = nxt.toordinal() - _EPOCH_ORD, 0
        return None

    def prev_wall(self, hi: int, lo: int) -> int | None:
        """The last matching wall ``w`` with ``lo <= w <= hi``, or None."""
        day, sod = divmod(hi, 86400)
        while (day + 1) * 86400 > lo:
            d = date.fromordinal(_EPOCH_ORD + day)
            y, m = d.year, d.month
            if not self._year_ok(y) or m not in self.months:
                pm: int | None = None
                py: int | None = y
                if self._year_ok(y):
                    pm = next((x for x in range(m - 1, 0, -1) if x in self.months), None)
                if pm is None:
                    py = self._prev_year(y)
                    if py is None or py < 2:
                        return None
                    pm = max(self.months)
                assert py is not None
                last = calendar.monthrange(py, pm)[1]
                day, sod = date(py, pm, last).toordinal() - _EPOCH_ORD, 86399
                continue
            mdays = self.month_days(y, m)
            i = bisect_right(mdays, d.day) - 1
            while i >= 0:
                dd = mdays[i]
                t = self._prev_tod(sod if dd == d.day else 86399)
                if t is not None:
                    w = (day + dd - d.day) * 86400 + t
                    return w if w >= lo else None
                i -= 1
            if y < 2:
                return None
            day, sod = date(y, m, 1).toordinal() - _EPOCH_ORD - 1, 86399
        return None


# --- per-dialect parsing -------------------------------------------------------------


def _items(f: _F, text: str) -> list[str]:
    items = text.split(",")
    for it in items:
        if not it:
            raise f.err(text, "has an empty list item (two commas, or one at an end)")
        _refuse_random(f, it)
    return items


def _cron_values(f: _F, tok: str) -> set[int]:
    base, slash, step_s = tok.partition("/")
    step = _step(f, step_s, tok) if slash else 1
    if "/" in step_s:
        raise f.err(tok, "has more than one '/'")
    if base == "*":
        a, b = f.lo, f.hi
    elif "-" in base:
        sa, _, sb = base.partition("-")
        a, b = f.num(sa, tok), f.num(sb, tok)
        if b < a:
            raise f.err(tok, f"is a reversed range ({a} > {b}); write it low-high")
    else:
        a = f.num(base, tok)
        b = f.hi if slash else a
    return set(range(a, b + 1, step))


def _cron(fields: list[str]) -> tuple[Fields, DayRule]:
    fm = _F("minute", 0, 59)
    fh = _F("hour", 0, 23)
    fd = _F("day-of-month", 1, 31)
    fmo = _F("month", 1, 12, _MONTHS, 1)
    fw = _F("day-of-week", 0, 7, _SUN_FIRST, 0)
    minute, hour, dom, mon, dow = fields
    rule = DayRule()
    rule.mode = "and" if dom.startswith("*") or dow.startswith("*") else "or"
    for f, v in ((fm, minute), (fh, hour), (fd, dom), (fmo, mon), (fw, dow)):
        if "?" in v:
            raise f.err(
                v, "'?' is not cron's (5 fields); write '*', or use 6 fields (spring, quartz)"
            )
    mins = set().union(*(_cron_values(fm, t) for t in _items(fm, minute)))
    hours = set().union(*(_cron_values(fh, t) for t in _items(fh, hour)))
    months = set().union(*(_cron_values(fmo, t) for t in _items(fmo, mon)))
    for t in _items(fd, dom):
        u = t.upper()
        if u == "L":
            rule.dom_last_offsets.add(0)
        elif u == "LW":
            rule.dom_lw_offsets.add(0)
        elif "L" in u or "W" in u:
            raise fd.err(
                t,
                "cron takes L and LW in day-of-month; L-n and nW are spring's and quartz's "
                "(6 fields)",
            )
        else:
            rule.dom |= _cron_values(fd, t)
    for t in _items(fw, dow):
        u = t.upper()
        if u.endswith("L") and len(u) > 1 and "/" not in u and "-" not in u:
            rule.dow_last.add((fw.num(t[:-1], t) - 1) % 7)
        elif "#" in u:
            a, _, k = t.partition("#")
            if not _digits(k) or not 1 <= int(k) <= 5:
                raise fw.err(t, "the number after '#' must be 1-5 (the k-th weekday of the month)")
            rule.dow_nth.add(((fw.num(a, t) - 1) % 7, int(k)))
        else:
            rule.dow |= {(v - 1) % 7 for v in _cron_values(fw, t)}
    return Fields({0}, mins, hours, months, rule), rule


def _replace_names(text: str, names: list[str]) -> str:
    text = text.upper()
    for i, n in enumerate(names):
        text = text.replace(n, str(i + 1))
    return text


def _spring_values(f: _F, tok: str, dow: bool = False) -> set[int]:
    base, slash, step_s = tok.partition("/")
    step = _step(f, step_s, tok) if slash else 1
    if base == "*":
        a, b = f.lo, f.hi
        if dow:
            a = 1  # Spring's day-of-week range is 1-7
    elif "-" in base:
        sa, _, sb = base.partition("-")
        a, b = f.num(sa, tok), f.num(sb, tok)
        if dow and a == 7:
            a = 0  # a range starting at Sunday starts at 0
        if b < a:
            raise f.err(tok, f"is a reversed range ({a} > {b}); write it low-high")
    else:
        a = f.num(base, tok)
        b = f.hi if slash else a
    return set(range(a, b + 1, step))


def _spring(fields: list[str]) -> tuple[Fields, DayRule]:
    fs = _F("second", 0, 59)
    fm = _F("minute", 0, 59)
    fh = _F("hour", 0, 23)
    fd = _F("day-of-month", 1, 31)
    fmo = _F("month", 1, 12)
    fw = _F("day-of-week", 0, 7)
    sec, minute, hour, dom, mon, dow = fields
    for f, v in ((fs, sec), (fm, minute), (fh, hour), (fmo, mon)):
        if "?" in v:
            raise f.err(v, "'?' is accepted only as a whole day-of-month or day-of-week field")
    for f, v in ((fd, dom), (fw, dow)):
        if "?" in v and v != "?":
            raise f.err(v, "'?' is accepted only as a whole day-of-month or day-of-week field")
    for f, v in ((fmo, mon), (fw, dow)):
        _items(f, v)  # refuse R/H before names are replaced
    rule = DayRule()
    rule.mode = "and"
    secs = set().union(*(_spring_values(fs, t) for t in _items(fs, sec)))
    mins = set().union(*(_spring_values(fm, t) for t in _items(fm, minute)))
    hours = set().union(*(_spring_values(fh, t) for t in _items(fh, hour)))
    mon_n = _replace_names(mon, _MONTHS)
    months = set().union(*(_spring_values(fmo, t) for t in _items(fmo, mon_n)))
    dom_u = "*" if dom == "?" else dom.upper()
    for t in _items(fd, dom_u):
        if "L" in t:
            if t == "L":
                rule.dom_last_offsets.add(0)
            elif t == "LW":
                rule.dom_lw_offsets.add(0)
            elif t.startswith("L-") and _digits(t[2:]) and int(t[2:]) >= 1:
                rule.dom_last_offsets.add(int(t[2:]))
            else:
                raise fd.err(t, "takes L, L-n (n >= 1), LW or nW")
        elif "W" in t:
            n = t[:-1]
            if not t.endswith("W") or not _digits(n):
                raise fd.err(t, "takes nW (the weekday nearest day n), like 15W")
            rule.dom_nearest.add(fd.num(n, t))
        else:
            rule.dom |= _spring_values(fd, t)
    dow_u = "*" if dow == "?" else _replace_names(dow, _MON_FIRST)
    for t in _items(fw, dow_u):
        if "L" in t:
            if not t.endswith("L") or len(t) == 1:
                raise fw.err(t, "takes dL (the last weekday d of the month), like 5L or FRIL")
            rule.dow_last.add((fw.num(t[:-1], t) - 1) % 7)
        elif "#" in t:
            a, _, k = t.partition("#")
            if not _digits(k) or not 1 <= int(k) <= 5:
                raise fw.err(t, "the number after '#' must be 1-5 (the k-th weekday of the month)")
            rule.dow_nth.add(((fw.num(a, t) - 1) % 7, int(k)))
        else:
            vals = _spring_values(fw, t, dow=True)
            rule.dow |= {(v - 1) % 7 for v in vals}  # 0 and 7 = Sunday, 1 = Monday
    return Fields(secs, mins, hours, months, rule), rule


_QUARTZ_STEP_MAX = {"second": 59, "minute": 59, "hour": 23, "day-of-month": 31, "month": 12}


def _quartz_values(f: _F, tok: str) -> set[int]:
    base, slash, step_s = tok.partition("/")
    limit = 7 if f.name == "day-of-week" else _QUARTZ_STEP_MAX.get(f.name)
    step = _step(f, step_s, tok, limit) if slash else 1
    if base in ("*", "") and (base or slash):
        a, b = f.lo, f.hi
    elif "-" in base:
        sa, _, sb = base.partition("-")
        a, b = f.num(sa, tok), f.num(sb, tok)
        if b < a:
            if f.name == "year":
                raise f.err(tok, f"is a reversed range of years ({a} > {b})")
            span = f.hi - f.lo + 1  # a reversed range wraps around (Quartz)
            return {f.lo + (v - f.lo) % span for v in range(a, b + span + 1, step)}
    else:
        a = f.num(base, tok)
        b = f.hi if slash else a
    return set(range(a, b + 1, step))


def _quartz(fields: list[str]) -> tuple[Fields, DayRule]:
    fs = _F("second", 0, 59)
    fm = _F("minute", 0, 59)
    fh = _F("hour", 0, 23)
    fd = _F("day-of-month", 1, 31)
    fmo = _F("month", 1, 12, _MONTHS, 1)
    fw = _F("day-of-week", 1, 7, _SUN_FIRST, 1)
    fy = _F("year", *QUARTZ_YEARS)
    sec, minute, hour, dom, mon, dow = fields[:6]
    year = fields[6] if len(fields) == 7 else "*"
    for f, v in ((fs, sec), (fm, minute), (fh, hour), (fmo, mon), (fy, year)):
        if "?" in v:
            raise f.err(v, "'?' is accepted only as a whole day-of-month or day-of-week field")
    for f, v in ((fd, dom), (fw, dow)):
        if "?" in v and v != "?":
            raise f.err(v, "'?' is accepted only as a whole day-of-month or day-of-week field")
    if (dom == "?") == (dow == "?"):
        bad, f = (dom, fd) if dom != "?" else (dow, fw)
        raise f.err(
            bad,
            "quartz needs '?' in exactly one of day-of-month and day-of-week "
            "(like '0 0 12 ? * MON-FRI' or '0 0 12 1 * ?')",
        )
    rule = DayRule()
    rule.w_sunday_last = "friday"
    secs = set().union(*(_quartz_values(fs, t) for t in _items(fs, sec)))
    mins = set().union(*(_quartz_values(fm, t) for t in _items(fm, minute)))
    hours = set().union(*(_quartz_values(fh, t) for t in _items(fh, hour)))
    months = set().union(*(_quartz_values(fmo, t) for t in _items(fmo, mon)))
    years = set().union(*(_quartz_values(fy, t) for t in _items(fy, year)))
    if dom != "?":
        rule.mode = "dom"
        items = _items(fd, dom.upper())
        for t in items:
            if ("L" in t or "W" in t) and len(items) > 1:
                raise fd.err(dom, "L and W stand alone in quartz (not in a list)")
            if t == "L":
                rule.dom_last_offsets.add(0)
            elif t == "LW":
                rule.dom_lw_offsets.add(0)
            elif t.startswith("L-"):
                n, w = (t[2:-1], True) if t.endswith("W") else (t[2:], False)
                if not _digits(n) or not 0 <= int(n) <= 30:
                    raise fd.err(t, "takes L-n with n 0-30 (n days before the last), or L-nW")
                (rule.dom_lw_offsets if w else rule.dom_last_offsets).add(int(n))
            elif "L" in t:
                raise fd.err(t, "takes L, L-n, LW, L-nW or nW")
            elif "W" in t:
                n = t[:-1]
                if not t.endswith("W") or not _digits(n):
                    raise fd.err(t, "takes nW (the weekday nearest day n), like 15W")
                rule.dom_nearest.add(fd.num(n, t))
            else:
                rule.dom |= _quartz_values(fd, t)
    else:
        rule.mode = "dow"
        items = _items(fw, dow.upper())
        for t in items:
            if ("L" in t or "#" in t) and len(items) > 1:
                raise fw.err(dow, "L and # stand alone in quartz (not in a list)")
            if t == "L":
                rule.dow.add(5)  # L alone is 7 = SAT
            elif t.endswith("L"):
                rule.dow_last.add((fw.num(t[:-1], t) + 5) % 7)
            elif "#" in t:
                a, _, k = t.partition("#")
                if not _digits(k) or not 1 <= int(k) <= 5:
                    raise fw.err(t, "the number after '#' must be 1-5 (the k-th weekday)")
                rule.dow_nth.add(((fw.num(a, t) + 5) % 7, int(k)))
            else:
                rule.dow |= {(v + 5) % 7 for v in _quartz_values(fw, t)}  # 1 = SUN
    return Fields(secs, mins, hours, months, rule, years), rule


FIELD_COUNT = {"cron": (5,), "spring": (6,), "quartz": (6, 7)}
FIELD_NAMES = {
    "cron": "minute hour day-of-month month day-of-week",
    "spring": "second minute hour day-of-month month day-of-week",
    "quartz": "second minute hour day-of-month month day-of-week [year]",
}


def parse_fields(fields: list[str], dialect: str) -> Fields:
    """Fields for ``dialect``; the count was checked by the caller. Raises FieldError."""
    if dialect == "cron":
        return _cron(fields)[0]
    if dialect == "spring":
        return _spring(fields)[0]
    return _quartz(fields)[0]
