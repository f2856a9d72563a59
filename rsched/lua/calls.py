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

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rsched.core.keys import ExpiredKeys, QueueKeys
from rsched.lua.loader import Scripts


class Ctx(Protocol):
    """What a call needs of :class:`rsched.context.Context` (the Lua layer sits
    below the context, so it names only these attributes)."""

    redis: Any
    scripts: Scripts


class Bound:
    """A :class:`Ctx` of one client of its own (a node of a cluster, a connection
    that is not the context's): the calls run there."""

    def __init__(self, client: Any):
        self.redis = client
        self.scripts = Scripts(client)


# === queue: add-5, cancel-5, purge-2, retry-4, requeue-stale-6 ================
#
# (the queue's calls go here)
#
#
#
#
#
#
# === end of queue =============================================================


# === consumer: claim-11, ack-4, fail-7, heartbeat-2, release-4 ================


@dataclass(frozen=True, slots=True)
class ClaimReply:
    """What ``claim-11`` answers: the server's clock, the queue's next due time and
    next lease expiry (-1: none), whether it is paused, the leases reaped, and the
    claimed tasks (7 fields each: member, payload, attempt, max_attempts, token,
    due, last_error)."""

    now_ms: int
    next_due_ms: int
    next_lease_ms: int
    paused: bool
    reaped_due: int
    reaped_dead: int
    claimed: list[Any]

    def tasks(self) -> Iterator[Sequence[Any]]:
        """The claimed tasks, 7 fields each."""
        c = self.claimed
        for i in range(0, len(c), 7):
            yield c[i : i + 7]

    def __len__(self) -> int:
        return len(self.claimed) // 7


def claim(
    ctx: Ctx,
    q: QueueKeys,
    *,
    max_tasks: int,
    lease_ms: int,
    consumer: str,
    registration_ttl_ms: int,
    reap_limit: int,
    history_maxlen: int,
    queue: str,
    default_max_attempts: int,
    check: bool = True,
    handles_json: str | None = None,
    park_limit: int | None = None,
    type_patterns: Sequence[str] = (),
) -> ClaimReply:
    """``claim-11``: register ``consumer``, reap expired leases, claim up to
    ``max_tasks`` due tasks of the types ``type_patterns`` (anchored Lua patterns;
    none: every type), parking at most ``park_limit`` due tasks of other types."""
    args: list[Any] = [
        max_tasks,
        lease_ms,
        consumer,
        registration_ttl_ms,
        reap_limit,
        history_maxlen,
        queue,
        default_max_attempts,
        1 if check else 0,
    ]
    if handles_json is not None or park_limit is not None or type_patterns:
        args += [handles_json or "", park_limit if park_limit is not None else 0, *type_patterns]
    keys = [
        q.sched,
        q.proc,
        q.dead,
        q.tasks,
        q.wake,
        q.seq,
        q.paused,
        q.consumers,
        q.history,
        q.lanes,
        q.handles,
    ]
    out = ctx.scripts("claim-11", keys, args)
    return ClaimReply(
        int(out[0]),
        int(out[1]),
        int(out[2]),
        bool(int(out[3])),
        int(out[4]),
        int(out[5]),
        out[6:],
    )


def ack(
    ctx: Ctx, q: QueueKeys, history_maxlen: int, runs: Sequence[tuple[str, str, str]]
) -> list[bool]:
    """``ack-4``: acknowledge ``runs`` (member, claim token, history record JSON or
    ""); one flag per run: False when its token no longer matches (refused)."""
    args: list[Any] = [history_maxlen]
    for member, token, record in runs:
        args += [member, token, record]
    res = ctx.scripts("ack-4", [q.proc, q.tasks, q.history, q.stats], args)
    return [bool(int(ok)) for ok in res]


def fail(
    ctx: Ctx,
    q: QueueKeys,
    *,
    history_maxlen: int,
    member: str,
    token: str,
    error: str,
    backoff_ms: int,
    history: str,
    result: str,
    dead_now: bool = False,
    default_max_attempts: int,
    client: Any = None,
) -> tuple[str, int] | None:
    """``fail-7``: retry the run after ``backoff_ms`` or dead-letter it. Returns
    ("retry", due) | ("dead", died_at) | ("stale", 0); None when ``client`` is a
    pipeline (read the reply from its ``execute()``: :func:`fail_reply`)."""
    keys = [q.sched, q.proc, q.dead, q.tasks, q.history, q.stats, q.wake]
    args: list[Any] = [
        history_maxlen,
        member,
        token,
        error,
        backoff_ms,
        history,
        result,
        "1" if dead_now else "0",
        default_max_attempts,
    ]
    out = ctx.scripts("fail-7", keys, args, client=client)
    return None if out is None else fail_reply(out)


def fail_reply(out: Any) -> tuple[str, int]:
    """A ``fail-7`` reply (as a pipeline returns it) as (what, ms)."""
    return str(out[0]), int(out[1])


def heartbeat(ctx: Ctx, q: QueueKeys, lease_ms: int, runs: Sequence[tuple[str, str]]) -> list[bool]:
    """``heartbeat-2``: extend the leases of ``runs`` (member, claim token) to
    ``lease_ms`` from the server's now; one flag per run: False when lost."""
    args: list[Any] = [lease_ms]
    for member, token in runs:
        args += [member, token]
    res = ctx.scripts("heartbeat-2", [q.proc, q.tasks], args)
    return [bool(int(ok)) for ok in res]


def release(ctx: Ctx, q: QueueKeys, runs: Sequence[tuple[str, str]]) -> int:
    """``release-4``: give ``runs`` (member, claim token) back to due; the number released."""
    args: list[Any] = []
    for member, token in runs:
        args += [member, token]
    return int(ctx.scripts("release-4", [q.sched, q.proc, q.tasks, q.wake], args))


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


def expired_arm(ctx: Ctx, key: bytes, ek: ExpiredKeys, ttl_ms: int, value: str | bytes) -> int:
    """``expired-arm-3``: SET trigger ``key`` to ``value`` with PX ``ttl_ms`` and
    record its expiry for the backup sweep. Returns the expiry (server ms)."""
    keys: list[Any] = [key, ek.armed, ek.values]
    out = ctx.scripts("expired-arm-3", keys, [ttl_ms, value])
    return int(out[0])


def expired_disarm(ctx: Ctx, key: bytes, ek: ExpiredKeys) -> bool:
    """``expired-disarm-3``: delete trigger ``key`` and its sweep entry. True when it was armed."""
    keys: list[Any] = [key, ek.armed, ek.values]
    out = ctx.scripts("expired-disarm-3", keys, [])
    return bool(int(out[1]))


def expired_due(
    ctx: Ctx, armed: str, *, grace_ms: int, offset: int, count: int, client: Any = None
) -> Any:
    """``expired-due-1``: a page of the armed set's entries overdue by ``grace_ms``:
    ``[now, next_expiry|-1, key, expiry, ...]`` (None when ``client`` is a pipeline)."""
    return ctx.scripts("expired-due-1", [armed], [grace_ms, offset, count], client=client)


def expired_fire(
    ctx: Ctx,
    key: bytes,
    ek: ExpiredKeys,
    *,
    mode: str,
    window_ms: int,
    grace_ms: int,
    owner: str,
    client: Any = None,
) -> Any:
    """``expired-fire-4``: claim one firing of trigger ``key`` (``mode``: "event" |
    "sweep"). Returns ``[status, now, expiry|-1, value|None]`` (None when ``client``
    is a pipeline); see the script's header for the statuses."""
    keys: list[Any] = [
        key,
        ek.armed,
        ek.values,
        ek.claim(key.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape"),
    ]
    return ctx.scripts("expired-fire-4", keys, [mode, window_ms, grace_ms, owner], client=client)


# === end of expired ===========================================================
