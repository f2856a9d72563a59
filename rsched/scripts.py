"""Load the Lua core and call it; map Lua error replies to rsched exceptions.

Each file in ``rsched/lua`` is one operation, named ``NAME-K.lua`` where K is
the number of KEYS it takes. A line ``--@include _file.lua`` is replaced by
that file's text at load time (shared fragments start with ``_``).

Scripts report domain errors with ``redis.error_reply("RSCHED_<KIND> msg")``;
:func:`call` turns those into the matching exception, and a ``WRONGTYPE``
reply into :class:`~rsched.errors.WrongKeyType`.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Any

import redis

from rsched import errors

_INCLUDE = re.compile(r"^--@include (\S+)\s*$", re.M)

_ERROR_KINDS: dict[str, type[errors.RschedError]] = {
    "RSCHED_CONFLICT": errors.Conflict,
    "RSCHED_STALE": errors.StaleToken,
    "RSCHED_NOTFOUND": errors.NotFound,
    "RSCHED_BADINPUT": errors.RschedError,  # replaced below with BadInput(field, msg)
    "RSCHED_LOCKED": errors.LockHeld,
}


def _read(name: str) -> str:
    return (resources.files("rsched") / "lua" / name).read_text(encoding="utf-8")


@cache
def source(name: str) -> str:
    """Lua source of operation ``name`` (e.g. ``"add-5"``) with includes expanded."""
    text = _read(name + ".lua")
    return _INCLUDE.sub(lambda m: _read(m.group(1)), text)


def nkeys(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


def map_error(exc: Exception) -> Exception:
    """Translate a redis-py exception into an rsched exception (or return it unchanged)."""
    if isinstance(exc, errors.RschedError):
        return exc
    if isinstance(exc, redis.AuthenticationError | redis.exceptions.AuthorizationError):
        return errors.RedisUnavailable(f"Redis refused authentication: {exc}")
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        return errors.RedisUnavailable(f"Redis unreachable: {exc}")
    if isinstance(exc, redis.ResponseError):
        msg = str(exc)
        if "WRONGTYPE" in msg:
            return errors.WrongKeyType(
                "a key in rsched's namespace holds another type of data "
                "(the namespace collides with something else; choose another --namespace)"
            )
        if msg.startswith("NOPERM") or "NOPERM" in msg[:40]:
            return errors.ConfigError(f"the Redis user lacks a permission rsched needs: {msg}")
        for prefix, cls in _ERROR_KINDS.items():
            if msg.startswith(prefix):
                text = msg[len(prefix) :].strip()
                if prefix == "RSCHED_BADINPUT":
                    field, _, rest = text.partition(" ")
                    return errors.BadInput(field, rest)
                return cls(text)
    return exc


class Scripts:
    """The Lua operations of one connection, called by name."""

    def __init__(self, client: redis.Redis):
        self._client = client
        self._scripts: dict[str, Any] = {}

    def _get(self, name: str) -> Any:
        s = self._scripts.get(name)
        if s is None:
            s = self._client.register_script(source(name))
            self._scripts[name] = s
        return s

    def __call__(self, name: str, keys: list[str], args: list[Any], client: Any = None) -> Any:
        """Run operation ``name``; ``client`` may be a pipeline (then nothing is returned)."""
        if len(keys) != nkeys(name):
            raise AssertionError(f"{name} takes {nkeys(name)} keys, got {len(keys)}")
        script = self._get(name)
        try:
            return script(keys=keys, args=args, client=client or self._client)
        except redis.RedisError as exc:
            raise map_error(exc) from exc
