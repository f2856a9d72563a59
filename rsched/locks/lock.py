"""Owned locks with a TTL, watchdog renewal and fencing tokens.

    with rs.lock("report", ttl_ms=30_000) as token:
        ...  # token: this acquisition's fencing token (strictly increasing per name)

A lock is a Redis HASH (owner id, host, pid, since, token) with a PEXPIRE
TTL; acquiring INCRs the name's fence counter. Renewal and release check the
owner id inside Lua, so a holder whose lease expired can never extend or
delete a lock someone else took since.

The watchdog (:mod:`rsched.locks.watchdog`): while the ``with`` block runs,
a thread renews the lease every TTL/3 and declares the lock lost a margin
before the lease can have expired, whatever the network does; then
:attr:`Lock.lost` is set and ``on_lost`` is called, so that the work can stop.
Listing and an operator's release are in :mod:`rsched.locks.admin`.

The watchdog thread holds the :class:`Lock` only through a weak reference: a
lock that is dropped while held (never released) is garbage-collected, its
watchdog stops renewing it, a :class:`RuntimeWarning` says so, and the lease
ends with its TTL.

Waiting (``wait=``): a release (and ``rsched unlock``) pushes one element to
the lock's ``wake`` LIST (``lua/_lock.lua``); a waiter whose try failed blocks
in ``BLPOP`` on it, so it hears of the release at once (measured hand-over,
release sent to the waiter holding it: about 1 ms; see ``rsched bench --only
locks``) and costs nothing while it waits. A lease that ends by its TTL pushes
nothing: each ``BLPOP`` is bounded by the holder's remaining TTL (and by the
connection's socket timeout), after which the waiter tries again.
"""

from __future__ import annotations

import math
import secrets
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from rsched.core import errors, validate
from rsched.locks.watchdog import GONE, MIN_BLOCK_S, WAIT_SLACK_S, Watchdog
from rsched.lua import calls

if TYPE_CHECKING:  # pragma: no cover
    from rsched.context import Context

DEFAULT_TTL_MS = 30_000
MIN_TTL_MS = 300
#: How long a release's wake-up waits for a waiter that is about to block.
WAKE_KEEP_MS = 5_000


def new_owner_id() -> str:
    return secrets.token_hex(12)


@dataclass
class Holder:
    """Who holds a lock (from a refused acquisition or a listing)."""

    host: str
    pid: int | None
    token: int | None
    ttl_ms: int

    def describe(self) -> str:
        return f"held by {self.host or '?'} pid {self.pid} (fencing token {self.token}, {self.ttl_ms} ms left)"

    @classmethod
    def of(cls, reply: calls.LockAcquireReply) -> Holder:
        """The holder named in a refused acquisition."""
        return cls(reply.holder_host, reply.holder_pid, reply.holder_token, reply.holder_ttl_ms)


def check_wait(wait: Any, field: str = "wait") -> float | None:
    """``wait`` as seconds (None: do not wait): a number >= 0 or ``inf``."""
    if wait is None:
        return None
    if isinstance(wait, bool) or not isinstance(wait, int | float):
        raise errors.BadInput(
            field, f"{wait!r} is not a number of seconds (>= 0, float('inf') to wait forever)"
        )
    if math.isnan(wait) or wait < 0:
        raise errors.BadInput(
            field,
            f"{wait!r} is not a number of seconds >= 0 (None or 0: do not wait; "
            "float('inf'): wait forever)",
        )
    return float(wait)


def _max_block_s(client: Any) -> float:
    """The longest a blocking command may wait on ``client``: a second under its
    socket timeout (a reply later than that would be an error)."""
    st: Any = None
    try:
        pool = getattr(client, "connection_pool", None)
        if pool is None:  # Redis Cluster: the nodes' connection settings
            node = client.get_default_node()
            pool = node.redis_connection.connection_pool
        st = pool.connection_kwargs.get("socket_timeout")
    except Exception:  # noqa: BLE001 - unknown client: be conservative
        st = 5.0
    if not st:
        return 60.0
    return max(0.1, float(st) - 1.0)


def wait_for_release(
    client: Any,
    wake_key: str,
    holder_ttl_ms: int,
    deadline: float,
    *,
    woken: threading.Event | None = None,
) -> None:
    """Block until a release of the lock wakes us (``BLPOP`` on its ``wake_key``),
    until the holder's lease can have run out (``holder_ttl_ms`` from now), or
    until ``deadline`` (monotonic), whichever comes first; then the caller tries
    again. ``woken``: the wait runs in a helper thread and ``woken`` (which the
    caller may also set, from a signal handler) ends it."""
    left = deadline - time.monotonic()
    if left <= 0:
        return
    if holder_ttl_ms == -2:  # gone between the try and now: try again at once
        return
    # -1: a lock without a TTL (someone PERSISTed it): try again every second
    ttl_s = holder_ttl_ms / 1000 + 0.005 if holder_ttl_ms >= 0 else 1.0
    timeout = min(left, ttl_s, _max_block_s(client))
    timeout = max(round(timeout, 3), MIN_BLOCK_S)  # BLPOP 0 would block forever
    if woken is None:
        client.blpop([wake_key], timeout=timeout)
        return

    def call() -> None:
        try:
            client.blpop([wake_key], timeout=timeout)
        except Exception:  # noqa: BLE001 - the caller's next try reports Redis trouble
            pass
        finally:
            woken.set()

    threading.Thread(target=call, name="rsched-lock-wait", daemon=True).start()
    woken.wait(timeout + WAIT_SLACK_S)


def _renewer(ref: weakref.ref[Lock]) -> Callable[[], int]:
    """The watchdog's renewal of the lock behind ``ref``, which it does not keep alive."""

    def renew() -> int:
        lk = ref()
        if lk is None:
            return GONE
        rs, key, owner, ttl_ms = lk.rs, lk.keys.lock, lk.owner, lk.ttl_ms
        del lk  # not held during the call: the lock may be collected meanwhile
        return calls.lock_renew(rs, key, owner, ttl_ms)

    return renew


def _dropped(dog: Watchdog, name: str, token: int | None) -> None:
    """A held lock was garbage-collected: stop its watchdog and say so."""
    if dog.stopped or dog.lost.is_set():
        dog.stop(join=False)
        return
    dog.stop(join=False)
    warnings.warn(
        f"rsched: lock {name!r} (fencing token {token}) was garbage-collected while held; "
        "its watchdog stopped renewing it and it expires with its TTL (release it, or "
        "use it as a context manager)",
        RuntimeWarning,
        stacklevel=2,
    )


class Lock:
    """An owned, fenced, auto-renewed lock. Use as a context manager.

    ``wait``: seconds to wait for a busy lock (``None``/0: fail at once with
    :class:`~rsched.core.errors.LockHeld`; ``float('inf')``: wait forever; a
    negative number is refused). A waiter is woken by the release itself.

    ``on_lost(reason)``: called from the watchdog thread when the lease is lost
    (see the module doc: before another client can take it).

    ``wait_replicas``: after acquiring, ``WAIT`` (up to ``wait_replicas_timeout_ms``)
    until that many replicas have the lock, so that a failover right after is
    less likely to forget it (default: the settings' ``redis.wait_replicas``).
    :attr:`replicas_acked` says how many did; a shortfall does not release the
    lock (compare it with ``wait_replicas`` if it matters to you).
    """

    def __init__(
        self,
        rs: Context,
        name: str,
        *,
        ttl_ms: int = DEFAULT_TTL_MS,
        wait: float | None = None,
        watchdog: bool = True,
        on_lost: Callable[[str], None] | None = None,
        wait_replicas: int | None = None,
        wait_replicas_timeout_ms: int | None = None,
    ):
        from rsched.core import replication

        validate.name(name, "lock name")
        if ttl_ms < MIN_TTL_MS:
            raise errors.BadInput("--ttl", f"must be at least {MIN_TTL_MS}ms")
        self.wait = check_wait(wait)
        self.rs = rs
        self.name = name
        self.keys = rs.keys.lock(name)
        self.ttl_ms = int(ttl_ms)
        self.owner = new_owner_id()
        self.token: int | None = None
        self.acquired_ms: int | None = None
        self._use_watchdog = watchdog
        self._on_lost = on_lost
        self._watchdog: Watchdog | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self.wait_policy = replication.policy(rs, wait_replicas, wait_replicas_timeout_ms)
        self.replicas_acked: int | None = None

    @property
    def lost(self) -> threading.Event:
        return self._watchdog.lost if self._watchdog else threading.Event()

    def try_acquire(self) -> int | Holder:
        ident = self.rs.identity()
        res = calls.lock_acquire(
            self.rs,
            self.keys,
            owner=self.owner,
            ttl_ms=self.ttl_ms,
            host=str(ident["host"]),
            pid=int(ident["pid"]),
            wait=self.wait_policy,
        )
        if self.wait_policy:
            self.replicas_acked = res.replicas_acked
        if res.token is not None:
            self.token = res.token
            self.acquired_ms = res.now_ms
            try:
                self.rs.redis.sadd(self.rs.keys.locks, self.name)
            except redis.RedisError:
                pass
            return self.token
        return Holder.of(res)

    def acquire(self) -> int:
        deadline = None if not self.wait else time.monotonic() + self.wait
        while True:
            sent = time.monotonic()  # the lease runs from (at the latest) now
            got = self.try_acquire()
            if isinstance(got, int):
                if self._use_watchdog:
                    dog = Watchdog(
                        _renewer(weakref.ref(self)),
                        self.ttl_ms,
                        on_lost=self._on_lost,
                        name=f"rsched-lock-{self.name}",
                    )
                    self._watchdog = dog.start(since=sent)
                    self._finalizer = weakref.finalize(self, _dropped, dog, self.name, got)
                    self._finalizer.atexit = False
                return got
            if deadline is None or time.monotonic() >= deadline:
                raise errors.LockHeld(f"lock {self.name!r} is {got.describe()}")
            wait_for_release(self.rs.redis, self.keys.wake, got.ttl_ms, deadline)

    def renew(self) -> int:
        return calls.lock_renew(self.rs, self.keys.lock, self.owner, self.ttl_ms)

    def release(self, record: dict[str, Any] | None = None) -> bool:
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._watchdog:
            self._watchdog.stop()
        return calls.lock_release(
            self.rs,
            self.keys,
            owner=self.owner,
            history_maxlen=self.rs.history_maxlen,
            record=record,
            keep_ms=WAKE_KEEP_MS,
        )

    def __enter__(self) -> int:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        try:
            self.release()
        except (redis.RedisError, errors.RedisUnavailable):
            pass  # the lease expires on its own


__all__ = ["Lock", "Holder", "check_wait", "wait_for_release", "new_owner_id"]
