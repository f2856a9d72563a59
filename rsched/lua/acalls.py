"""The Lua call layer for asyncio (``redis.asyncio``): what :mod:`rsched.lua.calls`
is for the synchronous client, for the calls :mod:`rsched.aio` makes.

Same scripts, same KEYS/ARGV (built by the same helpers of ``calls``), same
error mapping; ``EVALSHA`` first and ``EVAL`` of the source when the server
answers ``NOSCRIPT`` (a pipeline of calls is sent again with ``EVAL``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from rsched.core.defaults import EVENTS_MAXLEN
from rsched.lua import loader
from rsched.lua.calls import _add_keys, _noscript, _raise_mapped, cancel_keys

if TYPE_CHECKING:  # pragma: no cover
    from rsched.core.keys import QueueKeys


class AsyncCtx(Protocol):
    """What a call needs of the async client: its ``redis.asyncio`` client."""

    redis: Any


async def script(c: AsyncCtx, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """Run operation ``name``: EVALSHA, then EVAL on NOSCRIPT; errors mapped."""
    if len(keys) != loader.nkeys(name):
        raise AssertionError(f"{name} takes {loader.nkeys(name)} keys, got {len(keys)}")
    r = c.redis
    try:
        try:
            return await r.execute_command("EVALSHA", loader.sha1(name), len(keys), *keys, *args)
        except Exception as exc:
            if not _noscript(exc):
                raise
        return await r.execute_command("EVAL", loader.source(name), len(keys), *keys, *args)
    except Exception as exc:
        _raise_mapped(exc)


#: One ``add-7`` call of a batch: (queue keys, mode, reply, tasks, checks).
AddCall = tuple["QueueKeys", str, str, Sequence[tuple[str, str, str, int]], str]


async def add_batch(
    c: AsyncCtx, adds: Sequence[AddCall], after: Sequence[tuple[Any, ...]] = ()
) -> list[Any]:
    """``add-7`` calls (each: ``tasks`` are (member, due "+N"|"N", payload JSON,
    max_attempts) groups, see :func:`rsched.lua.calls.add`) and the commands
    ``after`` them, in one pipeline (one round trip). Returns every reply in
    order, errors in place (not raised)."""

    def queue(pipe: Any, i: int, how: str) -> None:
        q, mode, reply, tasks, checks = adds[i]
        args: list[Any] = [mode, reply, checks]
        for t in tasks:
            args.extend(t)
        body = loader.source("add-7") if how == "EVAL" else loader.sha1("add-7")
        keys = _add_keys(q)
        pipe.execute_command(how, body, len(keys), *keys, *args)

    async def send(idx: Sequence[int], how: str, tail: Sequence[tuple[Any, ...]]) -> list[Any]:
        pipe = c.redis.pipeline(transaction=False)
        for i in idx:
            queue(pipe, i, how)
        for cmd in tail:
            pipe.execute_command(*cmd)
        try:
            return list(await pipe.execute(raise_on_error=False))
        except Exception as exc:
            _raise_mapped(exc)

    res = await send(range(len(adds)), "EVALSHA", after)
    again = [i for i in range(len(adds)) if isinstance(res[i], Exception) and _noscript(res[i])]
    if again:  # the script cache was flushed: those calls again, with the source
        for i, r in zip(again, await send(again, "EVAL", ()), strict=True):
            res[i] = r
    return res


async def cancel(c: AsyncCtx, q: QueueKeys, member: str, maxlen: int, queue: str, by: str) -> Any:
    """``cancel-9``: the state the task was in, or None if there was none."""
    return await script(
        c,
        "cancel-9",
        cancel_keys(q),
        [member, maxlen, queue, q.cancel_channel, by, EVENTS_MAXLEN],
    )
