"""Owned locks with a TTL, watchdog renewal and fencing tokens.

    with rs.lock("report", ttl_ms=30_000) as token:
        ...  # token: this acquisition's fencing token (strictly increasing per name)

A lock is a Redis HASH (owner id, host, pid, since, token) with a PEXPIRE
TTL; acquiring INCRs the name's fence counter. Renewal and release check the
owner id inside Lua, so a holder whose lease expired can never extend or
delete a lock someone else took since.

The watchdog. While the ``with`` block runs, a thread renews the lease every
TTL/3. The lease runs, at the latest, from the moment the last renewal that
succeeded was *sent* (the server set the new expiry after that), so the
holder knows, by its own monotonic clock, the earliest moment another client
can take the lock: that send time plus the TTL. The watchdog declares the
lock *lost* a margin before it (:func:`loss_margin_ms`: a fifth of the TTL,
100 ms to 2 s), whatever the network does: each renewal runs in a helper
thread and the watchdog waits for its answer only until that moment, so a
renewal stuck behind a partition (a socket timeout of 10 s, a TCP
retransmission, a half-open connection) cannot delay the verdict. Then
:attr:`Lock.lost` is set and ``on_lost`` is called, so that the work can
stop; ``rsched exec`` and ``rsched run cron`` stop their job then, with a
SIGKILL no later than half the margin before the lease can have expired
(:meth:`Watchdog.stop_grace`). A renewal that answers "not yours" (expired,
or taken away with ``rsched unlock``) is a loss at once. Measured under a
partition (a proxy that stops forwarding): TTL 1 s lost 0.80 s, 2 s lost
1.60 s, 30 s lost 28.0 s after the last renewal that went through.

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
from rsched.core.defaults import host_id

if TYPE_CHECKING:  # pragma: no cover
    from rsched.context import Context

DEFAULT_TTL_MS = 30_000
MIN_TTL_MS = 300
#: How long a release's wake-up waits for a waiter that is about to block.
WAKE_KEEP_MS = 5_000
#: ``renew()``'s answer when the lock it renewed was garbage-collected.
GONE = -1
#: A wake-up wait that got no answer this long after its timeout is abandoned.
_WAIT_SLACK_S = 0.5
#: The shortest timeout given to a blocking command (Redis reads 0 as "forever").
_MIN_BLOCK_S = 0.01


def new_owner_id() -> str:
    return secrets.token_hex(12)


def loss_margin_ms(ttl_ms: int) -> int:
    """How long before the lease can have expired the watchdog declares it lost:
    a fifth of the TTL, at least 100 ms and at most 2 s."""
    return min(max(int(ttl_ms) // 5, 100), 2000)


@dataclass
class Holder:
    """Who holds a lock (from a refused acquisition or a listing)."""

    host: str
    pid: int | None
    token: int | None
    ttl_ms: int

    def describe(self) -> str:
        return f"held by {self.host or '?'} pid {self.pid} (fencing token {self.token}, {self.ttl_ms} ms left)"


def _int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


class _Call:
    """One call run in a helper thread, so that its caller can stop waiting for it."""

    def __init__(self, fn: Callable[[], Any], kick: threading.Event, name: str):
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None
        self._fn = fn
        self._kick = kick
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        try:
            self.result = self._fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            self.error = exc
        finally:
            self.done = True
            self._kick.set()


class Watchdog:
    """Renews a lease every ``ttl/3`` in a daemon thread (see the module doc).

    ``renew()`` returns 1 (renewed), 0 (lost), 2 (renewed, but the holder was
    asked to stop) or :data:`GONE` (the lock object is gone: stop quietly). It
    runs in a helper thread; Redis errors are retried quickly. The lease is
    declared lost at :attr:`lost_at`: the send time of the last renewal that
    succeeded (or of the acquisition, given to :meth:`start`) plus the TTL
    minus :func:`loss_margin_ms`, by the local monotonic clock (which also
    covers a process that was SIGSTOPped), even while a renewal hangs.

    ``wait(timeout_s)``, when given, replaces the sleep between renewals: it
    blocks up to ``timeout_s`` and may return early (a wake-up, such as a
    ``BZPOPMIN`` on a key another process pushes to when it asks the holder to
    stop), after which the watchdog renews at once. It runs in a helper thread
    too (a wait that hangs past its timeout is abandoned). Whoever ends the run
    makes it return; :meth:`stop` never waits for it.
    """

    def __init__(
        self,
        renew: Callable[[], int],
        ttl_ms: int,
        *,
        on_lost: Callable[[str], None] | None = None,
        on_cancel: Callable[[], None] | None = None,
        name: str = "watchdog",
        wait: Callable[[float], object] | None = None,
    ):
        self._renew = renew
        self._wait = wait
        self.ttl_ms = ttl_ms
        self.margin_ms = loss_margin_ms(ttl_ms)
        self.on_lost = on_lost
        self.on_cancel = on_cancel
        self.name = name
        self.lost = threading.Event()
        self.lost_reason = ""
        #: Monotonic time the loss was declared (None while not lost).
        self.lost_time: float | None = None
        self.cancelled = threading.Event()
        self._stop = threading.Event()
        self._kick = threading.Event()  # set by stop() and by each helper call's end
        self._last_ok = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self, since: float | None = None) -> Watchdog:
        """Start renewing; ``since``: the monotonic time the acquisition was sent
        (default: now, which is later than the truth)."""
        self._last_ok = time.monotonic() if since is None else since
        self._thread.start()
        return self

    def stop(self, join: bool = True) -> None:
        self._stop.set()
        self._kick.set()
        if join:
            self.join(5)

    def join(self, timeout: float) -> None:
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    @property
    def last_ok(self) -> float:
        """Monotonic send time of the last renewal that succeeded (or of the acquisition)."""
        return self._last_ok

    @property
    def expires_at(self) -> float:
        """Monotonic time from which another client may hold the lock."""
        return self._last_ok + self.ttl_ms / 1000

    @property
    def lost_at(self) -> float:
        """Monotonic time at which the lease is declared lost unless renewed."""
        return self._last_ok + (self.ttl_ms - self.margin_ms) / 1000

    def stop_grace(self, grace_s: float) -> float:
        """The grace a job stopped for a lost lease may get: ``grace_s``, cut so
        that the SIGKILL after it comes half the margin before :attr:`expires_at`."""
        left = self.expires_at - self.margin_ms / 2000 - time.monotonic()
        return max(0.0, min(grace_s, left))

    def _call(self, fn: Callable[[], Any], until: float) -> _Call | None:
        """Run ``fn`` in a helper thread; the call, or None when it had not
        returned by ``until`` (monotonic) or the watchdog was stopped."""
        self._kick.clear()
        call = _Call(fn, self._kick, self.name + "-call")
        while True:
            if call.done:
                return call
            left = until - time.monotonic()
            if left <= 0 or self._stop.is_set():
                return None
            self._kick.wait(left)
            self._kick.clear()

    def _sleep(self, wait: float) -> bool:
        """Wait until the next renewal; True when the watchdog is stopped."""
        if self._wait is None or wait < _MIN_BLOCK_S:
            # (a blocking command's timeout that rounds down to 0 ms would block forever)
            return self._stop.wait(wait)
        if self._stop.is_set():
            return True
        t0 = time.monotonic()
        waiter = self._wait
        until = min(t0 + wait + _WAIT_SLACK_S, self.lost_at)
        call = self._call(lambda: waiter(wait), until)
        if call is not None and call.error is not None:
            # Redis trouble: the renewal below deals with it
            self._stop.wait(max(0.0, min(wait, 0.25) - (time.monotonic() - t0)))
        return self._stop.is_set()

    def _lose(self, reason: str) -> None:
        if self.lost.is_set() or self._stop.is_set():
            return
        self.lost_reason = reason
        self.lost_time = time.monotonic()
        self.lost.set()
        if self.on_lost:
            self.on_lost(reason)

    def _deadline_passed(self) -> str:
        return (
            f"no renewal got through for {self.ttl_ms - self.margin_ms} ms "
            f"(Redis unreachable or too slow); the {self.ttl_ms} ms lease may expire "
            f"{self.margin_ms} ms later"
        )

    def _run(self) -> None:
        interval = max(self.ttl_ms / 3000.0, 0.05)
        wait = interval
        while not self._sleep(max(0.0, min(wait, self.lost_at - time.monotonic()))):
            # Local check first: after a SIGSTOP / long pause the lease may be gone.
            if time.monotonic() >= self.lost_at:
                self._lose(self._deadline_passed())
                return
            sent = time.monotonic()  # the new lease runs from (at the latest) now
            call = self._call(self._renew, self.lost_at)
            if self._stop.is_set():
                return
            if call is None:  # no answer in time: the renewal hangs (a partition?)
                self._lose(self._deadline_passed())
                return
            if call.error is not None:
                if isinstance(call.error, redis.RedisError | errors.RedisUnavailable | OSError):
                    wait = min(interval, 0.25)  # retry soon; give up at lost_at
                    continue
                self._lose(f"renewal failed: {call.error}")  # never die silently
                return
            st = call.result
            if st == GONE:
                return
            if st == 0:
                self._lose("the lock expired or was taken by another owner")
                return
            self._last_ok = sent
            wait = interval
            if st == 2 and not self.cancelled.is_set():
                self.cancelled.set()
                if self.on_cancel:
                    self.on_cancel()


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
    timeout = max(round(timeout, 3), _MIN_BLOCK_S)  # BLPOP 0 would block forever
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
    woken.wait(timeout + _WAIT_SLACK_S)


def _renew(rs: Context, key: str, owner: str, ttl_ms: int) -> int:
    return int(rs.scripts("lock-renew-1", [key], [owner, ttl_ms])[0])


def _renewer(ref: weakref.ref[Lock]) -> Callable[[], int]:
    """The watchdog's renewal of the lock behind ``ref``, which it does not keep alive."""

    def renew() -> int:
        lk = ref()
        if lk is None:
            return GONE
        rs, key, owner, ttl_ms = lk.rs, lk.keys.lock, lk.owner, lk.ttl_ms
        del lk  # not held during the call: the lock may be collected meanwhile
        return _renew(rs, key, owner, ttl_ms)

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
        keys = [self.keys.lock, self.keys.fence]
        args = [self.owner, self.ttl_ms, ident["host"], ident["pid"]]
        if self.wait_policy:
            from rsched.core.replication import script_and_wait

            res, self.replicas_acked = script_and_wait(
                self.rs, "lock-acquire-2", keys, args, self.wait_policy
            )
        else:
            res = self.rs.scripts("lock-acquire-2", keys, args)
        if int(res[0]) == 1:
            self.token = int(res[1])
            self.acquired_ms = int(res[2])
            try:
                self.rs.redis.sadd(self.rs.keys.locks, self.name)
            except redis.RedisError:
                pass
            return self.token
        return Holder(str(res[2]), _int(res[3]), _int(res[4]), int(res[5]))

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
        return _renew(self.rs, self.keys.lock, self.owner, self.ttl_ms)

    def release(self, record: dict[str, Any] | None = None) -> bool:
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._watchdog:
            self._watchdog.stop()
        res = self.rs.scripts(
            "lock-release-3",
            [self.keys.lock, self.keys.history, self.keys.wake],
            [
                self.owner,
                self.rs.history_maxlen if record else 0,
                _dumps(record) if record else "",
                WAKE_KEEP_MS,
            ],
        )
        return int(res[0]) == 1

    def __enter__(self) -> int:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        try:
            self.release()
        except (redis.RedisError, errors.RedisUnavailable):
            pass  # the lease expires on its own


def _dumps(obj: Any) -> str:
    import json

    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


# --- listing and operator release ------------------------------------------------
@dataclass
class LockInfo:
    name: str
    kind: str  # "lock" (exec / library) or "cron" (a cron's run lock)
    host: str
    pid: int | None
    token: int | None
    since_ms: int | None
    ttl_ms: int
    held_ms: int | None
    fire_ms: int | None

    @property
    def owner(self) -> str:
        return f"{self.host}:{self.pid}"

    def to_json(self) -> dict[str, Any]:
        from rsched.core.timeutil import iso

        return {
            "name": self.name,
            "kind": self.kind,
            "owner": self.owner,
            "host": self.host,
            "pid": self.pid,
            "ttl_ms": self.ttl_ms,
            "held_ms": self.held_ms,
            "token": self.token,
            "since": iso(self.since_ms),
            "since_ms": self.since_ms,
            "fire_at": iso(self.fire_ms),
            "fire_ms": self.fire_ms,
        }


def list_locks(rs: Context, pattern: str | None = None, count: int = 500) -> list[LockInfo]:
    """Held locks (SCAN, never KEYS); ``pattern`` is a glob on the lock name."""
    import fnmatch

    now = rs.now_ms()
    out: list[LockInfo] = []
    for kind, match in (
        ("lock", rs.keys.lock_scan_pattern()),
        ("cron", rs.keys.cron_lock_scan_pattern()),
    ):
        keys = sorted(set(rs.redis.scan_iter(match=match, count=count)))
        if not keys:
            continue
        pipe = rs.redis.pipeline(transaction=False)
        for k in keys:
            pipe.hmget(k, "host", "pid", "token", "since", "fire")
            pipe.pttl(k)
        res = pipe.execute()
        for i, k in enumerate(keys):
            name = rs.keys.lock_name_from_key(k)
            if pattern and not fnmatch.fnmatchcase(name, pattern):
                continue
            host, pid, token, since, fire = res[2 * i]
            ttl = int(res[2 * i + 1])
            if token is None or ttl == -2:
                continue  # expired between SCAN and HMGET
            s = _int(since)
            out.append(
                LockInfo(
                    name,
                    kind,
                    host or "",
                    _int(pid),
                    _int(token),
                    s,
                    ttl,
                    now - s if s is not None else None,
                    _int(fire),
                )
            )
    out.sort(key=lambda x: (x.name, x.kind))
    return out


def unlock(rs: Context, name: str, token: str | None = None, force: bool = False) -> int:
    """Release lock ``name`` by its fencing token (or ``force``). A cron's run lock
    is released when no plain lock of that name is held."""
    validate.name(name, "NAME")
    if not force and not token:
        raise errors.BadInput(
            "--token", "give the fencing token shown by `rsched locks`, or --force"
        )
    if token is not None and not (str(token).isascii() and str(token).isdigit()):
        raise errors.BadInput(
            "--token", f"{token!r} is not a fencing token (a whole number from `rsched locks`)"
        )
    arg = "" if force else str(token)
    lk = rs.keys.lock(name)
    keys, wake = [lk.lock, lk.wake], 1
    if not rs.redis.exists(lk.lock) and rs.redis.exists(rs.keys.cron(name).run_lock):
        run_lock = rs.keys.cron(name).run_lock
        keys, wake = [run_lock, run_lock], 0  # a cron's run lock has no waiters to wake
    return int(rs.scripts("lock-unlock-2", keys, [arg, WAKE_KEEP_MS, wake]))


__all__ = [
    "Lock",
    "Watchdog",
    "Holder",
    "check_wait",
    "loss_margin_ms",
    "wait_for_release",
    "LockInfo",
    "list_locks",
    "unlock",
    "host_id",
]
