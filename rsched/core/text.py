"""Text from Redis made safe for a terminal (task IDs, payloads, handler errors
and job output are data: never let them move the cursor, clear the screen or
reorder what is shown)."""

from __future__ import annotations


def _escapes() -> dict[int, str]:
    table = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))}
    table.update({0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"})
    # Line separators, and the bidirectional marks and overrides (they reorder what
    # the terminal shows).
    for c in (
        0x061C,
        0x200E,
        0x200F,
        0x2028,
        0x2029,
        *range(0x202A, 0x202F),
        *range(0x2066, 0x206A),
    ):
        table[c] = f"\\u{c:04x}"
    return table


_ESCAPES = _escapes()


def printable(text: str) -> str:
    """``text`` safe to print on a terminal: control characters written as escapes."""
    if text.isprintable():  # the common case; False for every character escaped below
        return text
    return text.translate(_ESCAPES)
