"""Checks of user input; each failure names the field and the accepted form."""

from __future__ import annotations

import json
import re
from typing import Any

from rsched.core.errors import BadInput

NAME_RULE = "1-128 characters from A-Z a-z 0-9 _ . -"
TYPE_RULE = "1-128 characters from A-Z a-z 0-9 _ . : -"
ID_RULE = "1-256 printable characters without whitespace"

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_TYPE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_DIGITS = re.compile(r"[0-9]{1,9}")

#: Largest payload accepted, in bytes of its compact JSON (documented in rsched(1)).
MAX_PAYLOAD_BYTES = 1_048_576
MAX_ATTEMPTS_LIMIT = 1000


def name(value: str, field: str) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise BadInput(field, f"{value!r} is not a valid name ({NAME_RULE})")
    return value


def queue(value: str, field: str = "--queue") -> str:
    return name(value, field)


def task_type(value: str, field: str = "TYPE") -> str:
    if not isinstance(value, str) or not _TYPE.fullmatch(value):
        raise BadInput(field, f"{value!r} is not a valid task type ({TYPE_RULE})")
    return value


def task_id(value: str, field: str = "ID") -> str:
    ok = (
        isinstance(value, str)
        and 1 <= len(value) <= 256
        and value.isprintable()
        and not any(c.isspace() for c in value)
    )
    if not ok:
        raise BadInput(field, f"{value!r} is not a valid task ID ({ID_RULE})")
    return value


def max_attempts(value: Any, field: str = "--max-attempts") -> int:
    """An int, or a string of ASCII digits (the flag's text; int() alone would also
    take "+3", "1_0" and other scripts' digits)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise BadInput(field, f"{value!r} is not a whole number from 1 to {MAX_ATTEMPTS_LIMIT}")
    if isinstance(value, str) and not _DIGITS.fullmatch(value.strip()):
        raise BadInput(field, f"{value!r} is not a whole number from 1 to {MAX_ATTEMPTS_LIMIT}")
    n = int(value)
    if not 1 <= n <= MAX_ATTEMPTS_LIMIT:
        raise BadInput(field, f"{value!r} is not a whole number from 1 to {MAX_ATTEMPTS_LIMIT}")
    return n


RATE_FORM = 'N/DUR: at most N claims (1-1000000) in any window of DUR, like "100/1s"'


def rate_limit(value: Any, field: str = "rate_limit") -> tuple[int, int, str]:
    """``"N/DUR"`` -> (N, window ms, the text as given)."""
    from rsched.core.timeutil import parse_duration

    if isinstance(value, tuple) and len(value) == 3:  # checked already
        return value
    if not isinstance(value, str) or value.count("/") != 1:
        raise BadInput(field, f"{value!r} is not {RATE_FORM}")
    n, dur = (p.strip() for p in value.split("/"))
    if not _DIGITS.fullmatch(n) or not 1 <= int(n) <= 1_000_000:
        raise BadInput(field, f"{value!r} is not {RATE_FORM}")
    try:
        window = parse_duration(dur, field)
    except BadInput:
        raise BadInput(field, f"{value!r} is not {RATE_FORM}") from None
    return int(n), window, value.strip()


TYPE_RATE_FORM = 'a table of task TYPE = "N/DUR", like {"mail.send" = "10/1s"}'


def type_rate_limits(
    value: Any, field: str = "type_rate_limits"
) -> tuple[tuple[str, int, int, str], ...]:
    """Per-type rate limits: a mapping TYPE -> "N/DUR" (a TOML table), or the
    flag's ``TYPE=N/DUR`` texts -> ((type, N, window ms, text), ...), by type."""
    if isinstance(value, tuple) and all(isinstance(v, tuple) and len(v) == 4 for v in value):
        return value  # checked already
    if isinstance(value, list | tuple):  # --type-rate-limit TYPE=N/DUR, repeated
        pairs: dict[str, Any] = {}
        for item in value:
            t, sep, rate = item.partition("=") if isinstance(item, str) else ("", "", "")
            if not sep:
                raise BadInput(field, f"{item!r} is not TYPE=N/DUR, like mail.send=10/1s")
            if t in pairs:
                raise BadInput(field, f"{t!r} is given twice")
            pairs[t] = rate
        value = pairs
    if not isinstance(value, dict):
        raise BadInput(field, f"{value!r} is not {TYPE_RATE_FORM}")
    out = []
    for t, rate in sorted(value.items()):
        task_type(t, field)
        n, w, text = rate_limit(rate, f"{field}.{t}")
        out.append((t, n, w, text))
    return tuple(out)


PRIORITY_RULE = "a whole number from -1000 to 1000"


def priority(value: Any, field: str = "--priority") -> int:
    """A task's priority: an int, or the flag's text (ASCII digits, an optional
    minus), from -1000 to 1000."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise BadInput(field, f"{value!r} is not {PRIORITY_RULE}")
    if isinstance(value, str):
        text = value.strip()
        if not _DIGITS.fullmatch(text.removeprefix("-")):
            raise BadInput(field, f"{value!r} is not {PRIORITY_RULE}")
        value = int(text)
    if not -1000 <= value <= 1000:
        raise BadInput(field, f"{value!r} is not {PRIORITY_RULE}")
    return value


def payload_text(text: str | bytes, field: str = "--payload") -> str:
    """Validate JSON text and return it in compact form."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise BadInput(field, "is not valid UTF-8 (the payload must be UTF-8 JSON)") from None
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise BadInput(field, f"is not valid JSON ({exc})") from None
    return payload_value(value, field)


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def payload_value(value: Any, field: str = "payload") -> str:
    """Serialize a Python value as the stored payload (compact JSON)."""
    try:
        text = _ENCODER.encode(value)
    except (TypeError, ValueError) as exc:
        raise BadInput(field, f"cannot be stored as JSON ({exc})") from None
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise BadInput(field, "is not valid UTF-8 (lone surrogate)") from None
    if size > MAX_PAYLOAD_BYTES:
        raise BadInput(field, f"is {size} bytes; the limit is {MAX_PAYLOAD_BYTES} bytes of JSON")
    return text
