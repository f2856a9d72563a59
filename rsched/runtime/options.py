"""Option values every loop parses the same way, from a flag's text, a config
entry or a Python value: a whole number in a range (durations are
:func:`rsched.core.timeutil.duration_ms`, which the queue layer shares). Each
refusal is a :class:`~rsched.core.errors.BadInput` naming the field it came from."""

from __future__ import annotations

from typing import Any

from rsched.core.errors import BadInput


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
