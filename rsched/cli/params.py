"""Option and argument types that check their value while click parses, so that
a bad value is refused (exit 2, one line naming the option) before a command
connects to Redis, whatever the command's body does first.

- :data:`ASCII_INT` / :class:`AsciiIntRange`: click's ``int`` accepts any
  Unicode digit (``int('١') == 1``); rsched takes ASCII digits only, as it does
  in durations.
- :func:`checked`: a callback that runs one of :mod:`rsched.core.validate`'s (or
  :mod:`rsched.core.timeutil`'s) checks on a value that was given.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import click

_INT = re.compile(r"[+-]?[0-9]+")


class AsciiInt(click.ParamType):
    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        text = str(value).strip()
        if not _INT.fullmatch(text):
            self.fail(f"{value!r} is not a whole number in ASCII digits (0-9)", param, ctx)
        return int(text)


class AsciiIntRange(AsciiInt):
    def __init__(self, lo: int | None = None, hi: int | None = None):
        self.lo, self.hi = lo, hi

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        n = super().convert(value, param, ctx)
        if (self.lo is not None and n < self.lo) or (self.hi is not None and n > self.hi):
            lo = "" if self.lo is None else f"{self.lo}<="
            hi = "" if self.hi is None else f"<={self.hi}"
            self.fail(f"{n} is not in the range {lo}x{hi}.", param, ctx)
        return n

    def __repr__(self) -> str:
        return f"AsciiIntRange({self.lo}, {self.hi})"


ASCII_INT = AsciiInt()


def checked(check: Callable[..., Any], field: str) -> Callable[[click.Context, Any, Any], Any]:
    """A click callback that runs ``check(value, field)`` on a given value."""

    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is None or ctx.resilient_parsing:
            return value
        if isinstance(value, tuple):
            for v in value:
                check(v, field)
        else:
            check(value, field)
        return value

    return callback


def _zone(value: str, field: str) -> None:
    from rsched.core.timeutil import zone

    zone(value, field)


def _name(value: str, field: str) -> None:
    from rsched.core import validate

    validate.name(value, field)


def _token(value: str, field: str) -> None:
    from rsched.core.errors import BadInput

    if not (value.isascii() and value.isdigit()):
        raise BadInput(
            field, f"{value!r} is not a fencing token (a whole number, as `rsched locks` shows)"
        )


def _not_blank(value: str, field: str) -> None:
    from rsched.core.errors import BadInput

    if not value.strip():
        raise BadInput(
            field, "is empty; give a duration like 10m or a cron expression like '*/5 * * * *'"
        )


zone_cb = checked(_zone, "--tz")
queue_cb = checked(_name, "--queue")
lock_cb = checked(_name, "--lock")
token_cb = checked(_token, "--token")
once_per_cb = checked(_not_blank, "--once-per")


def name_cb(field: str = "NAME") -> Callable[[click.Context, Any, Any], Any]:
    return checked(_name, field)
