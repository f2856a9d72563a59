"""One typed function per Lua script: the only place that builds KEYS/ARGV.

Each function takes the context (or a client/pipeline where a call is
pipelined), named keys from :mod:`rsched.core.keys` and typed arguments, and
returns the script's reply as Python values. The script's header
(``rsched/lua/NAME-K.lua``) documents every KEYS/ARGV entry; the function's
signature is that header in Python. Nothing outside ``rsched/lua`` calls
``Context.scripts`` (``tests/unit/test_layers.py`` checks it).

Sections, one per domain (each kept in the order of the script names):
queue, consumer, cron, locks, expired, logs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from rsched.core.defaults import EVENTS_MAXLEN
from rsched.core.keys import ExpiredKeys, QueueKeys
from rsched.lua.loader import Scripts

if TYPE_CHECKING:  # pragma: no cover
    from rsched.core.keys import CronKeys, LockKeys
    from rsched.core.replication import WaitPolicy


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


def script_and_wait(
    ctx: Ctx, name: str, keys: list[str], args: list[Any], pol: WaitPolicy
) -> tuple[Any, int]:
    """Run Lua operation ``name`` and ``WAIT`` on one connection (a pipeline).

    Returns (the script's reply, replicas that acknowledged it)."""
    from rsched.core.conn import is_cluster
    from rsched.core.errors import map_error

    if is_cluster(ctx.redis):  # one connection to the keys' primary: script, then WAIT
        node = ctx.redis.get_redis_connection(ctx.redis.get_node_from_key(keys[0]))
        pipe = node.pipeline(transaction=False)
    else:
        pipe = ctx.redis.pipeline(transaction=False)
    ctx.scripts(name, keys, args, client=pipe)
    pipe.execute_command("WAIT", pol.replicas, pol.timeout_ms)
    try:
        res, acked = pipe.execute(raise_on_error=False)
    except Exception as exc:
        mapped = map_error(exc)
        if mapped is exc:
            raise
        raise mapped from exc
    for r in (res, acked):
        if isinstance(r, Exception):
            mapped = map_error(r)
            raise mapped from (r if mapped is not r else None)
    return res, int(acked)


# === queue: add-7, add-after-9, cancel-9, purge-2, retry-5, requeue-stale-9, cancel-batch-9
# ==============================================================================
#
# ``q`` is the :class:`~rsched.core.keys.QueueKeys` of one stored queue (a
# partition's, for a partitioned queue).

from typing import TYPE_CHECKING, NoReturn  # noqa: E402

from rsched.core.conn import is_cluster  # noqa: E402
from rsched.core.errors import map_error  # noqa: E402
from rsched.lua import loader  # noqa: E402

if TYPE_CHECKING:  # pragma: no cover
    from rsched.core.keys import QueueKeys


def _add_keys(q: QueueKeys) -> list[str]:
    return [q.sched, q.proc, q.dead, q.tasks, q.wake, q.prio, q.ready]


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
    tasks: Sequence[tuple[Any, ...]],
    *,
    checks: str = "",
    client: Any = None,
) -> Any:
    """``add-7``: ``tasks`` are (member, due "+N"|"N", payload JSON, max_attempts)
    groups, or with ``checks`` "P" (member, due, payload, max_attempts, priority);
    ``checks`` "t" (types) and/or "p" (refuse a partitioned queue).
    ``client``: a pipeline to queue the call on (then nothing is returned)."""
    args: list[Any] = [mode, reply, checks]
    for t in tasks:
        args.extend(t)
    if client is None and len(tasks) == 1:
        return _call(c, "add-7", _add_keys_bytes(q), args)
    return c.scripts("add-7", _add_keys(q), args, client=client)


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
    task: tuple[Any, ...],
    *,
    checks: str = "",
    before: Sequence[tuple[Any, ...]] = (),
    after: Sequence[tuple[Any, ...]] = (),
) -> list[Any]:
    """``add-7`` with reply "one", and the commands ``before`` and ``after`` it, in
    one pipeline (one round trip; on Redis Cluster one per node, in parallel).

    Returns every reply in order, errors in place (as exceptions, not raised),
    the script's as its list. On Redis Cluster the commands are sent one after
    the other (see below). ``EVALSHA``, and when the server answers
    ``NOSCRIPT`` the pipeline again with ``EVAL`` (the commands around it must
    be safe to repeat); the one-shot client sends ``EVAL`` at once. A plain
    redis-py client gets no pipeline object: the commands are packed here and
    sent on one connection of its pool (:func:`_direct`, what the pipeline does
    in fewer steps; redis-py's own metrics hooks do not see the call)."""
    pool = _direct_pool(c.redis)  # a plain redis-py client (not a cluster's)
    if pool is not None:
        # The request packed here (redis-py's packer and pipeline cost more than
        # the round trip), EVALSHA's start kept per queue.
        head = _HEADS.get((q.prefix, mode, checks))
        if head is None:
            head = _head(q, mode, checks)
        packed = [*map(_packed, before), head, _task_fields(*task), *map(_packed, after)]
        try:
            res = _direct(pool, b"".join(packed), len(before) + 1 + len(after))
        except Exception as exc:
            _raise_mapped(exc)
        reply = res[len(before)]
        if not (isinstance(reply, Exception) and _noscript(reply)):
            return res
        # NOSCRIPT: the commands again with EVAL, through a pipeline (below)
    args = [mode, "one", checks, *task]
    if is_cluster(c.redis):
        # One command after the other, each through the client that rides out a
        # failover (rsched.core.conn): a cluster pipeline is not retried, and
        # would go on sending to a dead primary.
        keys = _add_keys(q)
        out: list[Any] = []
        for cmd in [*before, None, *after]:
            try:
                if cmd is None:
                    out.append(_call(c, "add-7", keys, args))
                else:
                    out.append(c.redis.execute_command(*cmd))
            except Exception as exc:  # noqa: BLE001 - returned in place, as a pipeline does
                out.append(exc)
        return out
    eval_first = pool is not None or getattr(c.redis, "prefers_eval", False)
    bkeys = _add_keys_bytes(q)
    while True:
        if eval_first:
            script = ("EVAL", loader.source("add-7"), 7, *bkeys, *args)
        else:
            script = ("EVALSHA", loader.sha1("add-7"), 7, *bkeys, *args)
        try:
            pipe = c.redis.pipeline(transaction=False)
            for cmd in (*before, script, *after):
                pipe.execute_command(*cmd)
            res = pipe.execute(raise_on_error=False)
        except Exception as exc:
            if not eval_first and _noscript(exc):  # a cluster pipeline raises it
                eval_first = True
                continue
            _raise_mapped(exc)
        reply = res[len(before)]
        if not eval_first and isinstance(reply, Exception) and _noscript(reply):
            eval_first = True
            continue
        return res


#: (queue key prefix, mode, checks) -> the packed start of add-7's EVALSHA, up to
#: its task
_HEADS: dict[tuple[str, str, str], bytes] = {}


def _head(q: QueueKeys, mode: str, checks: str) -> bytes:
    if len(_HEADS) >= 4096:
        _HEADS.clear()
    sha = loader.sha1("add-7")
    # 17 entries: EVALSHA sha 7, the 7 keys, mode "one" checks, the task's 4 (18:
    # checks "P", the task's 5, with its priority)
    n = 18 if "P" in checks else 17
    head = b"*%d\r\n" % n + _fields(("EVALSHA", sha, 7, *_add_keys_bytes(q), mode, "one", checks))
    _HEADS[(q.prefix, mode, checks)] = head
    return head


def _task_fields(member: str, due: str, payload: str, max_attempts: int, *pri: int) -> bytes:
    """:func:`_fields` of one task (member, due, payload JSON, max attempts[,
    priority])."""
    m, d, p, x = member.encode(), due.encode(), payload.encode(), b"%d" % max_attempts
    if pri:
        return _task_fields(member, due, payload, max_attempts) + _fields(pri)
    return b"$%d\r\n%b\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n" % (
        len(m),
        m,
        len(d),
        d,
        len(p),
        p,
        len(x),
        x,
    )


#: command -> :func:`_resp` of it, for the few commands sent around add-7
_PACKED: dict[tuple[Any, ...], bytes] = {}


def _packed(cmd: tuple[Any, ...]) -> bytes:
    b = _PACKED.get(cmd)
    if b is None:
        if len(_PACKED) >= 4096:
            _PACKED.clear()
        b = _PACKED[cmd] = _resp(cmd)
    return b


def _resp(args: Sequence[Any]) -> bytes:
    """One command in RESP, as redis-py packs it for a utf-8 "strict" client (str
    utf-8, int in decimal, bytes as they are; see :func:`_direct_pool`)."""
    return b"*%d\r\n%b" % (len(args), _fields(args))


def _fields(args: Sequence[Any]) -> bytes:
    """:func:`_resp` without the count of entries in front."""
    out = []
    for a in args:
        if type(a) is str:
            a = a.encode()
        elif type(a) is int:
            a = b"%d" % a
        elif not isinstance(a, bytes):
            raise TypeError(f"cannot send {a!r}")
        out.append(b"$%d\r\n%b\r\n" % (len(a), a))
    return b"".join(out)


def _direct_pool(r: Any) -> Any:
    """The connection pool of a plain redis-py client, for :func:`_direct` (None:
    use a pipeline: another client, a single-connection client, another
    encoding than utf-8 "strict"). Decided once per client."""
    d = getattr(r, "__dict__", None)
    if d is None:
        return None
    pool = d.get("_rsched_direct_pool", False)
    if pool is False:
        import sys

        rp = sys.modules.get("redis")
        pool = getattr(r, "connection_pool", None)
        kw = getattr(pool, "connection_kwargs", None) or {}
        if not (
            rp is not None
            and isinstance(r, rp.Redis)
            and getattr(r, "connection", None) is None
            and not getattr(r, "_single_connection_client", False)
            and hasattr(pool, "get_connection")
            and hasattr(pool, "release")
            and str(kw.get("encoding", "utf-8")).lower().replace("_", "-") in ("utf-8", "utf8")
            and kw.get("encoding_errors", "strict") == "strict"
        ):
            pool = None
        d["_rsched_direct_pool"] = pool
    return pool


def _direct(pool: Any, packed: bytes, n: int) -> list[Any]:
    """What ``pipeline(transaction=False)`` with ``execute(raise_on_error=False)``
    does for ``n`` commands already packed, without building a pipeline (the
    one-task add is the hot path): one connection from the pool, one write,
    every reply read (an error reply in place), a connection error retried as
    the connection's ``retry`` says after disconnecting (the pipeline's rule),
    the connection released to the pool whatever happens (one with unread
    replies was closed by redis-py's ``read_response``)."""
    from rsched.core.conn import pool_connection

    conn = pool_connection(pool)
    try:
        retry = getattr(conn, "retry", None)
        if retry is None:
            return _send_read(conn, packed, n)
        return retry.call_with_retry(
            lambda: _send_read(conn, packed, n), lambda _e: conn.disconnect()
        )
    finally:
        pool.release(conn)


def _send_read(conn: Any, packed: bytes, n: int) -> list[Any]:
    from redis.exceptions import ResponseError

    conn.send_packed_command([packed])
    out: list[Any] = []
    for _ in range(n):
        try:
            out.append(conn.read_response())
        except ResponseError as exc:
            out.append(exc)
    return out


def _noscript(exc: BaseException) -> bool:
    return type(exc).__name__ == "NoScriptError" or str(exc).startswith("NOSCRIPT")


def cancel(c: Ctx, q: QueueKeys, member: str, maxlen: int, queue: str, by: str) -> Any:
    """``cancel-9``: the state the task was in, or None if there was none. The
    tasks waiting for it (``add --after``) go dead."""
    return c.scripts(
        "cancel-9", cancel_keys(q), [member, maxlen, queue, q.cancel_channel, by, EVENTS_MAXLEN]
    )


def cancel_keys(q: QueueKeys) -> list[str]:
    """The KEYS of ``cancel-9`` and ``cancel-batch-9``."""
    return [q.sched, q.proc, q.dead, q.tasks, q.history, q.ready, q.waiting, q.children, q.events]


def add_after(
    c: Ctx,
    q: QueueKeys,
    mode: str,
    member: str,
    due: str,
    payload: str,
    max_attempts: int,
    priority: int,
    parents: Sequence[str],
) -> list[Any]:
    """``add-after-9``: add one task that waits for ``parents`` (members); the reply
    as the script documents it (``missing``/``partitioned`` write nothing)."""
    keys = [q.sched, q.proc, q.dead, q.tasks, q.wake, q.prio, q.ready, q.waiting, q.children]
    args = [mode, member, due, payload, max_attempts, priority, *parents]
    return list(c.scripts("add-after-9", keys, args))


def purge(c: Ctx, q: QueueKeys, older_ms: int | None, limit: int) -> tuple[int, bool]:
    """``purge-2``: (tasks deleted, whether more are left)."""
    deleted, more = c.scripts(
        "purge-2", [q.dead, q.tasks], [-1 if older_ms is None else older_ms, limit]
    )
    return int(deleted), bool(int(more))


def retry(c: Ctx, q: QueueKeys, members: Sequence[str]) -> int:
    """``retry-5``: how many of ``members`` were dead and are due now."""
    keys = [q.dead, q.sched, q.tasks, q.wake, q.prio]
    return int(c.scripts("retry-5", keys, list(members)))


def requeue_stale(
    c: Ctx, q: QueueKeys, limit: int, dry_run: bool, maxlen: int, queue: str, default_max: int
) -> tuple[int, int, bool]:
    """``requeue-stale-9``: (requeued, dead-lettered, whether more are left)."""
    rq, rd, more = c.scripts(
        "requeue-stale-9",
        [q.sched, q.proc, q.dead, q.tasks, q.history, q.wake, q.events, q.waiting, q.children],
        [limit, "1" if dry_run else "0", maxlen, queue, default_max, EVENTS_MAXLEN],
    )
    return int(rq), int(rd), bool(int(more))


def cancel_batch(
    c: Ctx, q: QueueKeys, members: Sequence[str], state: str, maxlen: int, queue: str, by: str
) -> tuple[int, int]:
    """``cancel-batch-9``: cancel those of ``members`` in ``state`` ("" any), each as
    :func:`cancel` does; (cancelled, of which processing)."""
    n, running = c.scripts(
        "cancel-batch-9",
        cancel_keys(q),
        [maxlen, queue, q.cancel_channel, by, state, EVENTS_MAXLEN, *members],
    )
    return int(n), int(running)


# === end of queue =============================================================


# === consumer: claim-18, ack-9, fail-10, heartbeat-2, release-4 ================


class ClaimReply(NamedTuple):
    """What ``claim-18`` answers: the server's clock, the queue's next due time and
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
    #: the rate limit holds back what is due until next_due_ms (its next permit)
    throttled: bool = False

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
    rate: str | None = None,
) -> ClaimReply:
    """``claim-18``: register ``consumer``, reap expired leases, claim up to
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
        handles_json or "",
        park_limit if park_limit is not None else 0,
        rate or "",
        EVENTS_MAXLEN,
        *type_patterns,
    ]
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
        q.prio,
        q.ready,
        q.rate,
        q.ratelimit,
        q.events,
        q.waiting,
        q.children,
    ]
    out = ctx.scripts("claim-18", keys, args)
    return ClaimReply(
        int(out[0]),
        int(out[1]),
        int(out[2]),
        int(out[3]) == 1,
        int(out[4]),
        int(out[5]),
        out[6:],
        int(out[3]) == 2,
    )


def ack(
    ctx: Ctx, q: QueueKeys, history_maxlen: int, runs: Sequence[tuple[str, str, str]]
) -> list[bool]:
    """``ack-9``: acknowledge ``runs`` (member, claim token, history record JSON or
    ""); one flag per run: False when its token no longer matches (refused). The
    tasks waiting for them (``add --after``) are released."""
    args: list[Any] = [history_maxlen]
    for member, token, record in runs:
        args += [member, token, record]
    res = ctx.scripts("ack-9", ack_keys(q), args)
    return [bool(int(ok)) for ok in res]


def ack_keys(q: QueueKeys) -> list[str]:
    """The KEYS of ``ack-9``."""
    return [q.proc, q.tasks, q.history, q.stats, q.sched, q.wake, q.prio, q.waiting, q.children]


def fail_keys(q: QueueKeys) -> list[str]:
    """The KEYS of ``fail-10``."""
    return [
        q.sched,
        q.proc,
        q.dead,
        q.tasks,
        q.history,
        q.stats,
        q.wake,
        q.events,
        q.waiting,
        q.children,
    ]


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
    """``fail-10``: retry the run after ``backoff_ms`` or dead-letter it. Returns
    ("retry", due) | ("dead", died_at) | ("stale", 0); None when ``client`` is a
    pipeline (read the reply from its ``execute()``: :func:`fail_reply`)."""
    keys = fail_keys(q)
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
        EVENTS_MAXLEN,
    ]
    out = ctx.scripts("fail-10", keys, args, client=client)
    return None if out is None else fail_reply(out)


def fail_reply(out: Any) -> tuple[str, int]:
    """A ``fail-10`` reply (as a pipeline returns it) as (what, ms)."""
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


def progress(
    ctx: Ctx, q: QueueKeys, member: str, token: str, fraction: float, message: str
) -> bool:
    """``progress-2``: keep a running task's progress (``fraction`` 0..1, ``message``)
    in its record; False when ``token`` no longer holds the task."""
    res = ctx.scripts("progress-2", [q.proc, q.tasks], [member, token, repr(fraction), message])
    return bool(int(res))


# === end of consumer ==========================================================


# === cron: cron-tick-9, cron-start-5, cron-finish-6, cron-heartbeat-1,
#     cron-pause-2, cron-shard-8, cron-forget-13,
#     cron-trigger-5, cron-trigger-claim-8 ========================================
# (The keys are :class:`rsched.core.keys.CronKeys`; a WaitPolicy is
# :class:`rsched.core.replication.WaitPolicy`: with one, the claim and a WAIT go
# on one connection and the reply says how many replicas acknowledged it.)


class CronTickReply(NamedTuple):
    """What ``cron-tick-9`` answers: the status (see the script's header), the
    server's clock, the run's fencing token (``run``), and with a WaitPolicy the
    replicas that acknowledged the claim (else None)."""

    status: str
    now_ms: int
    token: int | None = None
    replicas_acked: int | None = None


def cron_tick(
    ctx: Ctx,
    k: CronKeys,
    *,
    fire_ms: int,
    mode: str,
    runner: str,
    owner: str,
    ttl_ms: int,
    host: str,
    pid: int,
    concurrency: str,
    deadline_ms: int,
    keep_ms: int,
    history_maxlen: int,
    name: str,
    runner_ttl_ms: int,
    wait: WaitPolicy | None = None,
) -> CronTickReply:
    """``cron-tick-9``: claim tick ``fire_ms`` (``mode`` 'fire' or 'missed') and
    apply the cron's policies; ``wait``: WAIT for replicas after it."""
    keys = [k.ticks, k.state, k.run_lock, k.fence, k.paused, k.history, k.runners, k.wake, k.events]
    args: list[Any] = [
        fire_ms,
        mode,
        runner,
        owner,
        ttl_ms,
        host,
        pid,
        concurrency,
        deadline_ms,
        keep_ms,
        history_maxlen,
        name,
        runner_ttl_ms,
        EVENTS_MAXLEN,
    ]
    res, acked = _cron_call(ctx, "cron-tick-9", keys, args, wait)
    st = str(res[0])
    return CronTickReply(st, int(res[1]), int(res[2]) if st == "run" else None, acked)


def cron_start(
    ctx: Ctx,
    k: CronKeys,
    *,
    fire_ms: int,
    owner: str,
    ttl_ms: int,
    host: str,
    pid: int,
    give_up: str,
    history_maxlen: int,
    name: str,
    take: bool,
) -> CronTickReply:
    """``cron-start-5``: take the run lock for a tick that waits to replace the
    running one: status 'run' (with the token), 'held', 'skipped' or 'superseded'."""
    res = ctx.scripts(
        "cron-start-5",
        [k.run_lock, k.fence, k.state, k.history, k.wake],
        [fire_ms, owner, ttl_ms, host, pid, give_up, history_maxlen, name, 1 if take else 0],
    )
    st = str(res[0])
    return CronTickReply(st, int(res[1]), int(res[2]) if st == "run" else None)


def cron_finish(
    ctx: Ctx,
    k: CronKeys,
    *,
    owner: str,
    history_maxlen: int,
    record: Mapping[str, Any],
    wake: bool,
) -> bool:
    """``cron-finish-6``: a run ended: release the run lock (``owner`` "" when the
    run held none), append ``record`` (JSON-encoded here); ``wake``: end the
    run's blocking watchdog's wait. Whether the lock was released."""
    res = ctx.scripts(
        "cron-finish-6",
        [k.run_lock, k.state, k.history, k.stats, k.wake, k.events],
        [owner, history_maxlen, _cron_json(record), 1 if wake else 0, EVENTS_MAXLEN],
    )
    return int(res[0]) == 1


def event_silent(
    ctx: Ctx, k: CronKeys, *, name: str, fire_ms: int, seen_ms: int, host: str
) -> bool:
    """``event-silent-2``: record ``cron.silent`` for the unrun tick ``fire_ms``,
    once per silence (nothing ran since ``seen_ms``). Whether it was recorded."""
    res = ctx.scripts(
        "event-silent-2", [k.state, k.events], [fire_ms, seen_ms, name, host, EVENTS_MAXLEN]
    )
    return int(res) == 1


def cron_heartbeat(ctx: Ctx, k: CronKeys, runner: str, ttl_ms: int) -> tuple[int, int]:
    """``cron-heartbeat-1``: keep ``runner``'s registration; (live runners, server now)."""
    res = ctx.scripts("cron-heartbeat-1", [k.runners], [runner, ttl_ms])
    return int(res[0]), int(res[1])


def cron_pause(ctx: Ctx, k: CronKeys, pause: bool) -> bool:
    """``cron-pause-2``: pause (or resume) the cron; whether that changed anything."""
    res = ctx.scripts("cron-pause-2", [k.paused, k.state], ["pause" if pause else "resume"])
    return int(res[0]) == 1


class CronShardReply(NamedTuple):
    """What ``cron-shard-8`` answers: the status ('early', 'missed', 'paused',
    'ok'), the server's clock, the items claimed with their fencing tokens, and
    with a WaitPolicy the replicas that acknowledged the claim (else None)."""

    status: str
    now_ms: int
    items: list[tuple[str, int]]
    replicas_acked: int | None = None


def cron_shard(
    ctx: Ctx,
    k: CronKeys,
    *,
    fire_ms: int,
    mode: str,
    runner: str,
    items: int,
    deadline_ms: int,
    keep_ms: int,
    history_maxlen: int,
    name: str,
    host: str,
    pid: int,
    runner_ttl_ms: int,
    wait: WaitPolicy | None = None,
) -> CronShardReply:
    """``cron-shard-8``: claim this runner's items of tick ``fire_ms`` (``mode``
    'own', 'steal' or 'broadcast'); ``wait``: WAIT for replicas after it."""
    keys = [k.ticks, k.state, k.shards(fire_ms), k.runners, k.paused, k.history, k.fence, k.events]
    args: list[Any] = [
        fire_ms,
        mode,
        runner,
        items,
        deadline_ms,
        keep_ms,
        history_maxlen,
        name,
        host,
        pid,
        runner_ttl_ms,
        EVENTS_MAXLEN,
    ]
    res, acked = _cron_call(ctx, "cron-shard-8", keys, args, wait)
    got = [(str(res[j]), int(res[j + 1])) for j in range(2, len(res), 2)]
    return CronShardReply(str(res[0]), int(res[1]), got, acked)


def _cron_call(
    ctx: Ctx, name: str, keys: list[str], args: list[Any], wait: WaitPolicy | None
) -> tuple[Any, int | None]:
    if not wait:
        return ctx.scripts(name, keys, args), None
    return script_and_wait(ctx, name, keys, args, wait)


def _cron_json(record: Mapping[str, Any]) -> str:
    import json

    return json.dumps(record, separators=(",", ":"), ensure_ascii=False)


class CronForgetReply(NamedTuple):
    """What ``cron-forget-13`` answers: whether it was refused (live runners and no
    force: nothing deleted), the live runners, and the keys deleted."""

    refused: bool
    live_runners: int
    deleted: int


def cron_forget(ctx: Ctx, k: CronKeys, *, force: bool) -> CronForgetReply:
    """``cron-forget-13``: delete every key of the cron, in one step, unless a runner
    is live (``force``: even then)."""
    res = ctx.scripts(
        "cron-forget-13",
        [
            k.ticks,
            k.state,
            k.runners,
            k.run_lock,
            k.wake,
            k.fence,
            k.paused,
            k.history,
            k.stats,
            k.triggers,
            k.trigger_wake,
            k.events,
            k.events_done,
        ],
        ["1" if force else "0"],
    )
    return CronForgetReply(str(res[0]) == "live", int(res[1]), int(res[2]))


class CronTriggerReply(NamedTuple):
    """What ``cron-trigger-5`` answers: the status (see its header), the server's
    clock, the cron's live runners and, for a sharded or broadcast cron, the runs
    the request asks for (its shard count, or the live runners; 0 otherwise)."""

    status: str
    now_ms: int
    live_runners: int
    items: int = 0


def cron_trigger(
    ctx: Ctx,
    k: CronKeys,
    *,
    request: Mapping[str, Any],
    ttl_ms: int,
    after: str = "",
    entry: str = "",
) -> CronTriggerReply:
    """``cron-trigger-5``: queue a run request (``request``: id, by, cause[,
    after_token]) that expires after ``ttl_ms``; ``after``: the name of the cron A
    whose history record ``entry`` this request follows (once per record)."""
    res = ctx.scripts(
        "cron-trigger-5",
        [k.state, k.paused, k.runners, k.triggers, k.trigger_wake],
        [_cron_json(request), ttl_ms, f"after:{after}" if after else "", entry],
    )
    return CronTriggerReply(
        str(res[0]), int(res[1]), int(res[2]), int(res[3]) if len(res) > 3 else 0
    )


def cron_trigger_claim(
    ctx: Ctx,
    k: CronKeys,
    *,
    request: str,
    request_id: str,
    owner: str,
    ttl_ms: int,
    host: str,
    pid: int,
    concurrency: str,
    history_maxlen: int,
    name: str,
) -> CronTickReply:
    """``cron-trigger-claim-8``: claim the queued request ``request`` (its member
    text) and apply the cron's policies at the server's now: status 'run' (with
    the token), 'replace', 'skipped', 'paused', 'expired' or 'gone'."""
    res = ctx.scripts(
        "cron-trigger-claim-8",
        [
            k.triggers,
            k.trigger_reply(request_id),
            k.state,
            k.run_lock,
            k.fence,
            k.paused,
            k.history,
            k.wake,
        ],
        [request, owner, ttl_ms, host, pid, concurrency, history_maxlen, name],
    )
    st = str(res[0])
    return CronTickReply(st, int(res[1]), int(res[2]) if st == "run" else None)


class CronTriggerItemsReply(NamedTuple):
    """What ``cron-trigger-items-8`` answers: the status ('ok', 'gone', 'expired',
    'paused'), the server's clock, the run's fire_ms and the items this runner
    claimed with their fencing tokens."""

    status: str
    now_ms: int
    fire_ms: int
    items: list[tuple[str, int]]


def cron_trigger_items(
    ctx: Ctx,
    k: CronKeys,
    *,
    request: str,
    request_id: str,
    mode: str,
    runner: str,
    history_maxlen: int,
    name: str,
    host: str,
    pid: int,
    keep_ms: int,
) -> CronTriggerItemsReply:
    """``cron-trigger-items-8``: claim this runner's items (``mode`` 'own' or 'steal')
    of the queued run ``request`` (its member text) of a sharded or broadcast cron."""
    res = ctx.scripts(
        "cron-trigger-items-8",
        [
            k.triggers,
            k.trigger_reply(request_id),
            k.trigger_items(request_id),
            k.runners,
            k.paused,
            k.history,
            k.fence,
            k.state,
        ],
        [request, mode, runner, history_maxlen, name, host, pid, keep_ms],
    )
    got = [(str(res[j]), int(res[j + 1])) for j in range(3, len(res), 2)]
    return CronTriggerItemsReply(str(res[0]), int(res[1]), int(res[2]), got)


# === end of cron ==============================================================


# === locks: lock-acquire-2, lock-renew-1, lock-release-5, lock-unlock-2,
#     exec-acquire-3 ===========================================================
# (The keys are :class:`rsched.core.keys.LockKeys`; renewal and an operator's
# release take the lock key itself, since a cron's run lock is one too.)


class LockAcquireReply(NamedTuple):
    """What ``lock-acquire-2`` and ``exec-acquire-3`` answer. ``status``: 'ok'
    (``token``), 'locked' (the holder's host, pid, token and TTL left), and for
    ``exec-acquire-3`` also 'done' (the tick already ran; claimed at
    ``claimed_ms``) and 'early'. With a WaitPolicy: the replicas that
    acknowledged the acquisition (else None)."""

    status: str
    now_ms: int
    token: int | None = None
    holder_host: str = ""
    holder_pid: int | None = None
    holder_token: int | None = None
    holder_ttl_ms: int = 0
    claimed_ms: int | None = None
    replicas_acked: int | None = None


def lock_acquire(
    ctx: Ctx,
    k: LockKeys,
    *,
    owner: str,
    ttl_ms: int,
    host: str,
    pid: int,
    wait: WaitPolicy | None = None,
) -> LockAcquireReply:
    """``lock-acquire-2``: take lock ``k`` for ``owner`` with a new fencing token;
    ``wait``: WAIT for replicas after it (on the same connection)."""
    keys = [k.lock, k.fence]
    args: list[Any] = [owner, ttl_ms, host, pid]
    acked: int | None = None
    if wait:
        res, acked = script_and_wait(ctx, "lock-acquire-2", keys, args, wait)
    else:
        res = ctx.scripts("lock-acquire-2", keys, args)
    if int(res[0]) == 1:
        return LockAcquireReply("ok", int(res[2]), int(res[1]), replicas_acked=acked)
    return LockAcquireReply(
        "locked",
        int(res[1]),
        holder_host=str(res[2]),
        holder_pid=_lock_int(res[3]),
        holder_token=_lock_int(res[4]),
        holder_ttl_ms=int(res[5]),
        replicas_acked=acked,
    )


def lock_renew(ctx: Ctx, lock_key: str, owner: str, ttl_ms: int) -> int:
    """``lock-renew-1``: extend ``owner``'s lease to ``ttl_ms`` from now: 1 renewed,
    0 lost, 2 renewed but the holder is asked to stop (cron ``replace``)."""
    return int(ctx.scripts("lock-renew-1", [lock_key], [owner, ttl_ms])[0])


def lock_release(
    ctx: Ctx,
    k: LockKeys,
    *,
    owner: str,
    history_maxlen: int,
    record: Mapping[str, Any] | None,
    keep_ms: int,
) -> bool:
    """``lock-release-5``: release ``owner``'s lock, wake one waiter (the wake-up
    stays ``keep_ms``), append ``record`` (JSON-encoded here; None: no record).
    Whether it was released."""
    res = ctx.scripts(
        "lock-release-5",
        [k.lock, k.history, k.wake, k.stats, k.events],
        [
            owner,
            history_maxlen if record else 0,
            _lock_json(record) if record else "",
            keep_ms,
            EVENTS_MAXLEN,
        ],
    )
    return int(res[0]) == 1


def lock_unlock(ctx: Ctx, lock_key: str, wake_key: str | None, token: str, keep_ms: int) -> int:
    """``lock-unlock-2``: an operator's release by fencing ``token`` ("": forced);
    ``wake_key`` None: the lock has no waiters to wake (a cron's run lock). The
    released fencing token; NotFound / Conflict from the script's error replies."""
    keys = [lock_key, wake_key if wake_key is not None else lock_key]
    return int(ctx.scripts("lock-unlock-2", keys, [token, keep_ms, 0 if wake_key is None else 1]))


def exec_acquire(
    ctx: Ctx,
    k: LockKeys,
    *,
    owner: str,
    ttl_ms: int,
    host: str,
    pid: int,
    fire_ms: int | None,
    keep_ms: int,
) -> LockAcquireReply:
    """``exec-acquire-3``: take the lock and, with ``fire_ms``, claim that tick,
    atomically (status 'ok', 'done', 'locked' or 'early')."""
    res = ctx.scripts(
        "exec-acquire-3",
        [k.lock, k.fence, k.ticks],
        [owner, ttl_ms, host, pid, -1 if fire_ms is None else fire_ms, keep_ms],
    )
    st, now = str(res[0]), int(res[1])
    if st == "ok":
        return LockAcquireReply(st, now, int(res[2]))
    if st == "done":
        return LockAcquireReply(st, now, claimed_ms=_lock_int(res[2]))
    if st == "locked":
        return LockAcquireReply(
            st,
            now,
            holder_host=str(res[2]),
            holder_pid=_lock_int(res[3]),
            holder_token=_lock_int(res[4]),
            holder_ttl_ms=int(res[5]),
        )
    return LockAcquireReply(st, now)


def _lock_int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _lock_json(record: Mapping[str, Any]) -> str:
    import json

    return json.dumps(record, separators=(",", ":"), ensure_ascii=False)


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


# === logs: log-put-3 ==========================================================
# (The keys are any of :class:`rsched.core.keys.CronKeys`, ``LockKeys`` or
# ``QueueKeys``: each has ``logs``, ``log_index`` and ``live(token)`` in the
# hash slot of its history.)


def log_put(
    ctx: Ctx, k: Any, *, token: str, log: str, history_maxlen: int, client: Any = None
) -> int | None:
    """``log-put-3``: keep run ``token``'s log (JSON text) beside its history
    record, trimmed to ``history_maxlen`` logs; end its live stream. The number
    of older logs trimmed (-1: none kept); None when ``client`` is a pipeline."""
    out = ctx.scripts(
        "log-put-3",
        [k.logs, k.log_index, k.live(token)],
        [token, log, history_maxlen],
        client=client,
    )
    return None if out is None else int(out)


# === end of logs ==============================================================
