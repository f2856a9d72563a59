"""The library calls of the backup sweep: :func:`arm` a trigger key (its TTL
and its sweep entry in one Lua call) and :func:`disarm` it (see
:mod:`rsched.expired.runner` for what the sweep does with them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rsched.core.errors import BadInput
from rsched.core.keys import ExpiredKeys
from rsched.expired.notify import key_bytes
from rsched.lua import calls

if TYPE_CHECKING:  # pragma: no cover
    from rsched.context import Context


def _ttl_ms(value: Any, field: str = "ttl_ms") -> int:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise BadInput(field, f"{value!r} is not a positive number of milliseconds")
    if isinstance(value, str):
        from rsched.core.timeutil import parse_duration

        return parse_duration(value, field)
    if value <= 0:
        raise BadInput(field, f"{value!r} is not a positive number of milliseconds")
    return int(value)


def _check_key(key: str | bytes, field: str = "key") -> bytes:
    raw = key if isinstance(key, bytes) else key_bytes(str(key))
    if not raw:
        raise BadInput(field, "is empty")
    return raw


def _keys_for(rs: Context, raw: bytes) -> ExpiredKeys:
    from rsched.core.conn import is_cluster

    return ExpiredKeys.for_key(rs.namespace, raw, is_cluster(rs.redis))


def arm(rs: Context, key: str | bytes, ttl_ms: int | str, value: str | bytes = "1") -> int:
    """Set trigger ``key`` to ``value`` with a TTL *and* record it for the backup
    sweep, in one Lua call (the entry's time is the key's own expiry). Returns
    the expiry, in ms since the epoch by the server's clock.

    >>> arm(rs, "order:timeout:1001", 30 * 60_000, value='{"order": 1001}')

    Arming a key again replaces its expiry. ``value`` reaches the handler on
    stdin. Cancel with :func:`disarm`, not ``DEL``. On Redis Cluster the sweep
    entry goes to the armed set of the key's own slot (on the key's node).
    """
    raw = _check_key(key)
    ttl = _ttl_ms(ttl_ms)
    ek = _keys_for(rs, raw)
    return calls.expired_arm(rs, raw, ek, ttl, value)


def disarm(rs: Context, key: str | bytes) -> bool:
    """Cancel a trigger: delete the key and its sweep entry together. True when it was armed."""
    raw = _check_key(key)
    ek = _keys_for(rs, raw)
    return calls.expired_disarm(rs, raw, ek)
