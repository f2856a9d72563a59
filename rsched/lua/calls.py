"""One typed function per Lua script: the only place that builds KEYS/ARGV.

Each function takes the context (or a client/pipeline where a call is
pipelined), named keys from :mod:`rsched.core.keys` and typed arguments, and
returns the script's reply as Python values. The script's header
(``rsched/lua/NAME-K.lua``) documents every KEYS/ARGV entry; the function's
signature is that header in Python. Nothing outside ``rsched/lua`` calls
``Context.scripts`` (``tests/unit/test_layers.py`` checks it).

Sections, one per domain (each kept in the order of the script names):
queue, consumer, cron, locks, expired.
"""

from __future__ import annotations

from typing import Any, Protocol

from rsched.lua.loader import Scripts


class Ctx(Protocol):
    """What a call needs of :class:`rsched.context.Context` (the Lua layer sits
    below the context, so it names only these attributes)."""

    redis: Any
    scripts: Scripts


# === queue: add-5, cancel-5, purge-2, retry-4, requeue-stale-6 ================
#
# ``q`` is the :class:`~rsched.core.keys.QueueKeys` of one stored queue (a
# partition's, for a partitioned queue).

from collections.abc import Sequence  # noqa: E402 - the section's own imports
from typing import TYPE_CHECKING, NoReturn  # noqa: E402

from rsched.core.conn import is_cluster  # noqa: E402
from rsched.core.errors import map_error  # noqa: E402
from rsched.lua import loader  # noqa: E402

if TYPE_CHECKING:  # pragma: no cover
    from rsched.core.keys import QueueKeys


def _add_keys(q: QueueKeys) -> list[str]:
    return [q.sched, q.proc, q.dead, q.tasks, q.wake]


_KEYS_BYTES: dict[str, list[bytes]] = {}


def _add_keys_bytes(q: QueueKeys) -> list[bytes]:
    """:func:`_add_keys` encoded, kept per queue (the one-task add sends them on
    every call; bytes go out as they are)."""
    k = _KEYS_BYTES.get(q.sched)
    if k is None:
        if len(_KEYS_BYTES) >= 4096:
            _KEYS_BYTES.clear()
        k = _KEYS_BYTES[q.sched] = [x.encode() for x in _add_keys(q)]
    return k


def add(
    c: Ctx,
    q: QueueKeys,
    mode: str,
    reply: str,
    tasks: Sequence[tuple[str, str, str, int]],
    *,
    checks: str = "",
    client: Any = None,
) -> Any:
    """``add-5``: ``tasks`` are (member, due "+N"|"N", payload JSON, max_attempts)
    groups; ``checks`` "t" (types) and/or "p" (refuse a partitioned queue).
    ``client``: a pipeline to queue the call on (then nothing is returned)."""
    args: list[Any] = [mode, reply, checks]
    for t in tasks:
        args.extend(t)
    if client is None and len(tasks) == 1:
        return _call(c, "add-5", _add_keys_bytes(q), args)
    return c.scripts("add-5", _add_keys(q), args, client=client)


def _call(c: Ctx, name: str, keys: Sequence[str | bytes], args: list[Any]) -> Any:
    """What ``c.scripts(name, keys, args)`` does, in fewer steps (the one-task add
    is the hot path): ``EVALSHA``, then ``EVAL`` on ``NOSCRIPT``; ``EVAL`` at once
    for the one-shot client."""
    r = c.redis
    try:
        if not getattr(r, "prefers_eval", False):
            try:
                return r.execute_command("EVALSHA", loader.sha1(name), len(keys), *keys, *args)
            except Exception as exc:
                if not _noscript(exc):
                    raise
        return r.execute_command("EVAL", loader.source(name), len(keys), *keys, *args)
    except Exception as exc:
        _raise_mapped(exc)


def _raise_mapped(exc: Exception) -> NoReturn:
    """Raise ``exc`` as its rsched exception (itself when it has none)."""
    mapped = map_error(exc)
    if mapped is exc:
        raise exc
    raise mapped from exc


def add_one(
    c: Ctx,
    q: QueueKeys,
    mode: str,
    task: tuple[str, str, str, int],
    *,
    checks: str = "",
    before: Sequence[tuple[Any, ...]] = (),
    after: Sequence[tuple[Any, ...]] = (),
) -> list[Any]:
    """``add-5`` with reply "one", and the commands ``before`` and ``after`` it, in
    one pipeline (one round trip; on Redis Cluster one per node, in parallel).

    Returns every reply in order, errors in place (as exceptions, not raised),
    the script's as its list. On Redis Cluster the commands are sent one after
    the other (see below). ``EVALSHA``, and when the server answers
    ``NOSCRIPT`` the pipeline again with ``EVAL`` (the commands around it must
    be safe to repeat); the one-shot client sends ``EVAL`` at once."""
    keys = _add_keys(q)
    args = [mode, "one", checks, *task]
    if is_cluster(c.redis):
        # One command after the other, each through the client that rides out a
        # failover (rsched.core.conn): a cluster pipeline is not retried, and
        # would go on sending to a dead primary.
        out: list[Any] = []
        for cmd in [*before, None, *after]:
            try:
                if cmd is None:
                    out.append(_call(c, "add-5", keys, args))
                else:
                    out.append(c.redis.execute_command(*cmd))
            except Exception as exc:  # noqa: BLE001 - returned in place, as a pipeline does
                out.append(exc)
        return out
    eval_first = getattr(c.redis, "prefers_eval", False)
    while True:
        pipe = c.redis.pipeline(transaction=False)
        for cmd in before:
            pipe.execute_command(*cmd)
        if eval_first:
            pipe.execute_command("EVAL", loader.source("add-5"), 5, *keys, *args)
        else:
            pipe.execute_command("EVALSHA", loader.sha1("add-5"), 5, *keys, *args)
        for cmd in after:
            pipe.execute_command(*cmd)
        try:
            res = pipe.execute(raise_on_error=False)
        except Exception as exc:
            if not eval_first and _noscript(exc):  # a cluster pipeline raises it
                eval_first = True
                continue
            _raise_mapped(exc)
        script = res[len(before)]
        if not eval_first and isinstance(script, Exception) and _noscript(script):
            eval_first = True
            continue
        return res


def _noscript(exc: BaseException) -> bool:
    return type(exc).__name__ == "NoScriptError" or str(exc).startswith("NOSCRIPT")


def cancel(c: Ctx, q: QueueKeys, member: str, maxlen: int, queue: str, by: str) -> Any:
    """``cancel-5``: the state the task was in, or None if there was none."""
    return c.scripts(
        "cancel-5",
        [q.sched, q.proc, q.dead, q.tasks, q.history],
        [member, maxlen, queue, q.cancel_channel, by],
    )


def purge(c: Ctx, q: QueueKeys, older_ms: int | None, limit: int) -> tuple[int, bool]:
    """``purge-2``: (tasks deleted, whether more are left)."""
    deleted, more = c.scripts(
        "purge-2", [q.dead, q.tasks], [-1 if older_ms is None else older_ms, limit]
    )
    return int(deleted), bool(int(more))


def retry(c: Ctx, q: QueueKeys, members: Sequence[str]) -> int:
    """``retry-4``: how many of ``members`` were dead and are due now."""
    return int(c.scripts("retry-4", [q.dead, q.sched, q.tasks, q.wake], list(members)))


def requeue_stale(
    c: Ctx, q: QueueKeys, limit: int, dry_run: bool, maxlen: int, queue: str, default_max: int
) -> tuple[int, int, bool]:
    """``requeue-stale-6``: (requeued, dead-lettered, whether more are left)."""
    rq, rd, more = c.scripts(
        "requeue-stale-6",
        [q.sched, q.proc, q.dead, q.tasks, q.history, q.wake],
        [limit, "1" if dry_run else "0", maxlen, queue, default_max],
    )
    return int(rq), int(rd), bool(int(more))


# === end of queue =============================================================


# === consumer: claim-11, ack-4, fail-7, heartbeat-2, release-4 ================
#
# (the consumer's calls go here)
#
#
#
#
#
#
# === end of consumer ==========================================================


# === cron: cron-tick-8, cron-start-5, cron-finish-5, cron-heartbeat-1,
#     cron-pause-2, cron-shard-7 ===============================================
#
# (the cron runner's calls go here)
#
#
#
#
#
#
# === end of cron ==============================================================


# === locks: lock-acquire-2, lock-renew-1, lock-release-3, lock-unlock-2,
#     exec-acquire-3 ===========================================================
#
# (the locks' calls go here)
#
#
#
#
#
#
# === end of locks =============================================================


# === expired: expired-arm-3, expired-disarm-3, expired-due-1, expired-fire-4 ===
#
# (the expired runner's calls go here)
#
#
#
#
#
#
# === end of expired ===========================================================
