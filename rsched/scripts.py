"""Load the Lua core and call it; map Lua error replies to rsched exceptions.

Each file in ``rsched/lua`` is one operation, named ``NAME-K.lua`` where K is
the number of KEYS it takes. A line ``--@include _file.lua`` is replaced by
that file's text at load time (shared fragments start with ``_``).

Scripts report domain errors with ``redis.error_reply("RSCHED_<KIND> msg")``;
:func:`call` turns those into the matching exception, and a ``WRONGTYPE``
reply into :class:`~rsched.errors.WrongKeyType`.
"""

from __future__ import annotations

import os
import re
import sys
from functools import cache
from typing import TYPE_CHECKING, Any

from rsched import errors

if TYPE_CHECKING:  # pragma: no cover
    import redis

_INCLUDE = re.compile(r"^--@include (\S+)\s*$", re.M)

_ERROR_KINDS: dict[str, type[errors.RschedError]] = {
    "RSCHED_CONFLICT": errors.Conflict,
    "RSCHED_STALE": errors.StaleToken,
    "RSCHED_NOTFOUND": errors.NotFound,
    "RSCHED_BADINPUT": errors.RschedError,  # replaced below with BadInput(field, msg)
    "RSCHED_LOCKED": errors.LockHeld,
}

#: Error replies that mean the password (or user) was refused (as redis-py classifies them).
_AUTH_REPLIES = (
    "NOAUTH",
    "WRONGPASS",
    "ERR AUTH",
    "ERR Client sent AUTH",
    "ERR invalid password",
    "ERR invalid username-password",
)


_LUA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lua")


def _read(name: str) -> str:
    # A plain file read: importlib.resources (zipfile, tempfile, ...) costs a one-shot
    # command ~10 ms of imports; it is the fallback for a zipped install.
    try:
        with open(os.path.join(_LUA_DIR, name), encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        from importlib import resources

        return (resources.files("rsched") / "lua" / name).read_text(encoding="utf-8")


@cache
def source(name: str) -> str:
    """Lua source of operation ``name`` (e.g. ``"add-5"``) with includes expanded."""
    text = _read(name + ".lua")
    return _INCLUDE.sub(lambda m: _read(m.group(1)), text)


def nkeys(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


def _map_reply(msg: str, exc: Exception) -> Exception:
    if "WRONGTYPE" in msg:
        import re

        # our scripts' own check says which key: "WRONGTYPE key K holds a T, not a U"
        m = re.search(r"WRONGTYPE key (.+) holds an? (\w+), not an? (\w+)", msg)
        which = f"key {m.group(1)!r} holds a {m.group(2)}, not a {m.group(3)}: " if m else ""
        return errors.WrongKeyType(
            f"{which}a key in rsched's namespace holds another type of data "
            "(the namespace collides with something else; choose another --namespace)"
        )
    if msg.startswith(("CLUSTERDOWN", "MASTERDOWN")):  # an outage to wait out (exit 69)
        return errors.RedisUnavailable(f"Redis Cluster cannot serve the keys now: {msg}")
    if "DB index is out of range" in msg:  # SELECT, or HELLO's AUTH+SELECT at connect
        return errors.ConfigError(
            "--redis-url: the database number is out of range for this server "
            "(it has as many as its `databases` setting: 16 by default, 0 to 15)"
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


def map_error(exc: Exception) -> Exception:
    """Translate a redis-py (or :mod:`rsched.resp`) exception into an rsched
    exception, or return it unchanged. Never imports redis-py itself."""
    if isinstance(exc, errors.RschedError):
        return exc
    from rsched.resp import RespConnectionError, RespError

    if isinstance(exc, RespConnectionError):
        return errors.RedisUnavailable(f"Redis unreachable: {exc}")
    if isinstance(exc, RespError):
        msg = str(exc)
        if msg.startswith("OOM "):
            return errors.RedisFull()
        if msg.startswith(_AUTH_REPLIES):
            return errors.RedisUnavailable(f"Redis refused authentication: {msg}")
        return _map_reply(msg, exc)
    rp = sys.modules.get("redis")
    if rp is None:  # not imported: exc cannot be one of its exceptions
        return exc
    if isinstance(exc, rp.AuthenticationError | rp.exceptions.AuthorizationError):
        return errors.RedisUnavailable(f"Redis refused authentication: {exc}")
    if isinstance(exc, rp.ConnectionError | rp.TimeoutError):
        return errors.RedisUnavailable(f"Redis unreachable: {exc}")
    if isinstance(exc, rp.exceptions.OutOfMemoryError):  # "OOM command not allowed ..."
        return errors.RedisFull()
    if isinstance(exc, rp.exceptions.NoPermissionError):  # redis-py strips "NOPERM "
        return errors.ConfigError(f"the Redis user lacks a permission rsched needs: {exc}")
    if isinstance(exc, rp.ResponseError):
        return _map_reply(str(exc), exc)
    return exc


@cache
def sha1(name: str) -> str:
    import hashlib

    return hashlib.sha1(source(name).encode("utf-8")).hexdigest()


def _is_noscript(exc: Exception) -> bool:
    rp = sys.modules.get("redis")
    if rp is not None and isinstance(exc, rp.exceptions.NoScriptError):
        return True
    return str(exc).startswith("NOSCRIPT")


def _is_pipeline(client: Any) -> bool:
    from rsched.resp import LitePipeline

    if isinstance(client, LitePipeline):
        return True
    rp = sys.modules.get("redis")
    if rp is None:
        return False
    if isinstance(client, rp.client.Pipeline):
        return True
    rc = sys.modules.get("redis.cluster")
    return rc is not None and isinstance(client, rc.ClusterPipeline)


class Scripts:
    """The Lua operations of one connection, called by name.

    A call is ``EVALSHA`` and, when the server answers ``NOSCRIPT`` (a restart,
    ``SCRIPT FLUSH``, a failover), ``EVAL`` of the source: that cannot fail
    with ``NOSCRIPT``, however often the script cache is flushed (redis-py's
    Script object loads the script and retries EVALSHA, which a flush in
    between defeats). In a pipeline, and with the one-shot client of
    :mod:`rsched.resp`, the call is ``EVAL`` straight away.
    """

    def __init__(self, client: redis.Redis | Any):
        self._client = client

    def __call__(self, name: str, keys: list[str], args: list[Any], client: Any = None) -> Any:
        """Run operation ``name``; ``client`` may be a pipeline (then nothing is returned)."""
        if len(keys) != nkeys(name):
            raise AssertionError(f"{name} takes {nkeys(name)} keys, got {len(keys)}")
        c = client or self._client
        try:
            if _is_pipeline(c) or getattr(c, "prefers_eval", False):
                res = c.execute_command("EVAL", source(name), len(keys), *keys, *args)
                return None if _is_pipeline(c) else res
            try:
                return c.execute_command("EVALSHA", sha1(name), len(keys), *keys, *args)
            except Exception as exc:
                if not _is_noscript(exc):
                    raise
            return c.execute_command("EVAL", source(name), len(keys), *keys, *args)
        except Exception as exc:
            mapped = map_error(exc)
            if mapped is exc:
                raise
            raise mapped from exc
