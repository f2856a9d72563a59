"""Option values every loop parses the same way, from a flag's text, a config
entry or a Python value: a duration in ms (``30s``, ``1500``), a whole number
in a range. Each refusal is a :class:`~rsched.core.errors.BadInput` naming the
field it came from."""

from __future__ import annotations

from typing import Any

from rsched.core.errors import BadInput
from rsched.core.timeutil import parse_duration


def ms(value: Any, field: str) -> int:
    if isinstance(value, bool):
        raise BadInput(field, f"{value!r} is not a duration")
    if isinstance(value, int | float):
        if value <= 0:
            raise BadInput(field, f"{value!r} must be a positive number of milliseconds")
        return int(value)
    return parse_duration(str(value), field)


def positive_int(value: Any, field: str, limit: int = 10_000) -> int:
    if isinstance(value, bool) or (
        isinstance(value, str) and not (value.strip().isascii() and value.strip().isdigit())
    ):
        raise BadInput(field, f"{value!r} is not a whole number from 1 to {limit}")
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise BadInput(field, f"{value!r} is not a whole number from 1 to {limit}") from None
    if isinstance(value, float) and value != n or not 1 <= n <= limit:
        raise BadInput(field, f"{value!r} is not a whole number from 1 to {limit}")
    return n
