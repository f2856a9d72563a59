"""What ``run expired`` checks before it listens: the key pattern (a Redis glob,
matched locally as a regular expression), and that the server publishes
key-expiry events (``notify-keyspace-events``; ``--set-notify`` turns them on).
Also the key-name helpers the runner's parts share (key names are bytes)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import redis

from rsched.core.errors import BadInput, ConfigError, map_error

NOTIFY_FIX = "CONFIG SET notify-keyspace-events Ex"


def key_bytes(text: str) -> bytes:
    """A key name as Redis holds it (key names are bytes; ours round-trip via surrogateescape)."""
    return text.encode("utf-8", "surrogateescape")


def key_text(data: bytes | str) -> str:
    return data if isinstance(data, str) else data.decode("utf-8", "surrogateescape")


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A Redis glob (as in ``SCAN MATCH`` / ``PSUBSCRIBE``: ``*``, ``?``, ``[abc]``,
    ``[^a-z]``, ``\\`` escapes) as a compiled regular expression."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "\\" and i + 1 < n:
            i += 1
            out.append(re.escape(pattern[i]))
        elif c == "[":
            j = i + 1
            neg = j < n and pattern[j] == "^"
            if neg:
                j += 1
            items: list[str] = []
            while j < n and pattern[j] != "]":
                if pattern[j] == "\\" and j + 1 < n:
                    j += 1
                    items.append(re.escape(pattern[j]))
                elif pattern[j] == "-" and items and j + 1 < n and pattern[j + 1] != "]":
                    items.append("-")
                else:
                    items.append(re.escape(pattern[j]))
                j += 1
            if j >= n:  # no closing bracket: Redis matches up to the end, we take "[" literally
                out.append(re.escape(c))
            else:
                body = "".join(items)
                out.append(
                    f"[{'^' if neg else ''}{body}]" if body else ("[^\\s\\S]" if not neg else ".")
                )
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out), re.S)


def check_pattern(pattern: str, field: str = "--pattern") -> str:
    if not isinstance(pattern, str) or not pattern:
        raise BadInput(field, "is empty; give a glob of key names, like 'order:timeout:*'")
    if len(pattern) > 1024 or "\0" in pattern:
        raise BadInput(field, f"{pattern[:60]!r}… must be 1-1024 characters without NUL")
    try:
        glob_regex(pattern)
    except re.error as exc:
        raise BadInput(field, f"{pattern!r} is not a valid glob ({exc})") from None
    return pattern


def notify_flags_ok(value: str) -> bool:
    """Does ``notify-keyspace-events`` publish ``__keyevent@DB__:expired``?"""
    return "E" in value and ("x" in value or "A" in value)


def _with_expired_events(value: str) -> str:
    out = value
    if "E" not in out:
        out += "E"
    if "x" not in out and "A" not in out:
        out += "x"
    return out


def check_notify(
    client: redis.Redis, set_notify: bool = False, log: Callable[[str, str], None] | None = None
) -> str:
    """Refuse (:class:`ConfigError`) when the server does not publish expiry events;
    with ``set_notify`` turn them on (``CONFIG SET``: changes the server's config).

    Returns "ok", "set" or "unverified" (``CONFIG`` denied: a warning is logged)."""
    log = log or (lambda _level, _msg: None)
    try:
        got = client.config_get("notify-keyspace-events")
    except redis.ResponseError as exc:
        log(
            "warning",
            f"could not verify notify-keyspace-events (CONFIG GET refused: {one_line(exc)}); "
            f"if expiry events are off nothing will fire ({NOTIFY_FIX})",
        )
        return "unverified"
    except redis.RedisError as exc:
        raise map_error(exc) from exc
    value = ""
    for k, v in dict(got).items():
        if key_text(k or b"") == "notify-keyspace-events":
            value = key_text(v or b"")
    if notify_flags_ok(value):
        return "ok"
    shown = repr(value) if value else "'' (off)"
    if not set_notify:
        merged = _with_expired_events(value)
        raise ConfigError(
            f"notify-keyspace-events is {shown}: the server does not publish key-expiry "
            f"events, so nothing would fire. Fix: redis-cli {NOTIFY_FIX}"
            + (
                f" (keeping your flags: CONFIG SET notify-keyspace-events {merged})"
                if value
                else ""
            )
            + ", and the same in redis.conf to survive a restart; or pass --set-notify"
        )
    new = _with_expired_events(value)
    try:
        client.config_set("notify-keyspace-events", new)
    except redis.ResponseError as exc:
        raise ConfigError(
            f"--set-notify: CONFIG SET notify-keyspace-events {new} was refused "
            f"({one_line(exc)}); ask an administrator to run {NOTIFY_FIX}"
        ) from None
    except redis.RedisError as exc:
        raise map_error(exc) from exc
    log(
        "info",
        f"set notify-keyspace-events {new} (was {shown}) on the server: a runtime change, "
        "lost on restart unless redis.conf says the same (or CONFIG REWRITE)",
    )
    return "set"


def one_line(text: Any) -> str:
    s = str(text).strip()
    return " | ".join(line.strip() for line in s.splitlines() if line.strip())[:500]
