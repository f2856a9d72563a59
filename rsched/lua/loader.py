"""Load the Lua core and call it; map Lua error replies to rsched exceptions.

Each file in ``rsched/lua`` is one operation, named ``NAME-K.lua`` where K is
the number of KEYS it takes. A line ``--@include _file.lua`` is replaced by
that file's text at load time (shared fragments start with ``_``).

Scripts report domain errors with ``redis.error_reply("RSCHED_<KIND> msg")``;
:func:`call` turns those into the matching exception, and a ``WRONGTYPE``
reply into :class:`~rsched.core.errors.WrongKeyType`.
"""

from __future__ import annotations

import os
import re
import sys
from functools import cache
from typing import TYPE_CHECKING, Any

from rsched.core.errors import map_error

if TYPE_CHECKING:  # pragma: no cover
    import redis

_INCLUDE = re.compile(r"^--@include (\S+)\s*$", re.M)

_LUA_DIR = os.path.dirname(os.path.abspath(__file__))


def _read(name: str) -> str:
    # A plain file read: importlib.resources (zipfile, tempfile, ...) costs a one-shot
    # command ~10 ms of imports; it is the fallback for a zipped install.
    try:
        with open(os.path.join(_LUA_DIR, name), encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        from importlib import resources

        return (resources.files("rsched.lua") / name).read_text(encoding="utf-8")


@cache
def source(name: str) -> str:
    """Lua source of operation ``name`` (e.g. ``"add-7"``) with includes expanded."""
    text = _read(name + ".lua")
    return _INCLUDE.sub(lambda m: _read(m.group(1)), text)


def nkeys(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


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
    from rsched.core.resp import LitePipeline

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
    :mod:`rsched.core.resp`, the call is ``EVAL`` straight away.
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
