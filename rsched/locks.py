"""Owned locks with a TTL, watchdog renewal and fencing tokens.

    with rs.lock("report", ttl_ms=30_000) as token:
        ...  # token: this acquisition's fencing token (strictly increasing per name)

A lock is a Redis HASH (owner id, host, pid, since, token) with a PEXPIRE
TTL; acquiring INCRs the name's fence counter. Renewal and release check the
owner id inside Lua, so a holder whose lease expired can never extend or
delete a lock someone else took since. While the ``with`` block runs, a
watchdog thread renews the lease every TTL/3; if renewal fails (the lease
expired, or Redis was unreachable for a whole TTL) the lock is *lost*:
:attr:`Lock.lost` is set and ``on_lost`` is called, so the work can stop.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from rsched import errors, validate
from rsched.client import host_id

if TYPE_CHECKING:  # pragma: no cover
    from rsched.client import Rsched

DEFAULT_TTL_MS = 30_000
MIN_TTL_MS = 300


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


def _int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


class Watchdog:
    """Renews a lease every ``ttl/3`` in a daemon thread.

    ``renew()`` returns 1 (renewed), 0 (lost) or 2 (renewed, but the holder was
    asked to stop). Redis errors are retried quickly; when no renewal has
    succeeded for a whole TTL (by the local monotonic clock, which also covers
    a process that was SIGSTOPped) the lease is considered lost.

    ``wait(timeout_s)``, when given, replaces the sleep between renewals: it
    blocks up to ``timeout_s`` and may return early (a wake-up, such as a
    ``BZPOPMIN`` on a key another process pushes to when it asks the holder to
    stop), after which the watchdog renews at once. Whoever ends the run makes
    it return (then :meth:`stop` with ``join=False`` does not wait for it).
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
        self.on_lost = on_lost
        self.on_cancel = on_cancel
        self.lost = threading.Event()
        self.lost_reason = ""
        self.cancelled = threading.Event()
        self._stop = threading.Event()
        self._last_ok = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Watchdog:
        self._last_ok = time.monotonic()
        self._thread.start()
        return self

    def stop(self, join: bool = True) -> None:
        self._stop.set()
        if join:
            self.join(5)

    def join(self, timeout: float) -> None:
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def _sleep(self, wait: float) -> bool:
        """Wait until the next renewal; True when the watchdog is stopped."""
        if self._wait is None:
            return self._stop.wait(wait)
        if self._stop.is_set():
            return True
        t0 = time.monotonic()
        try:
            self._wait(wait)
        except Exception:  # noqa: BLE001 - Redis trouble: the renewal below deals with it
            self._stop.wait(max(0.0, min(wait, 0.25) - (time.monotonic() - t0)))
        return self._stop.is_set()

    def _lose(self, reason: str) -> None:
        if self.lost.is_set() or self._stop.is_set():
            return
        self.lost_reason = reason
        self.lost.set()
        if self.on_lost:
            self.on_lost(reason)

    def _run(self) -> None:
        interval = max(self.ttl_ms / 3000.0, 0.05)
        wait = interval
        while not self._sleep(wait):
            # Local check first: after a SIGSTOP / long pause the lease is gone for sure.
            if (time.monotonic() - self._last_ok) * 1000 >= self.ttl_ms:
                self._lose("the lease expired before it could be renewed")
                return
            sent = time.monotonic()  # the new lease runs from (at the latest) now
            try:
                st = self._renew()
            except (redis.RedisError, errors.RedisUnavailable, OSError):
                wait = min(interval, 0.25)  # retry soon; give up when the TTL has passed
                continue
            except Exception as exc:  # noqa: BLE001 - never die silently
                self._lose(f"renewal failed: {exc}")
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


class Lock:
    """An owned, fenced, auto-renewed lock. Use as a context manager.

    ``wait``: seconds to wait for a busy lock (``None``/0: fail at once with
    :class:`~rsched.errors.LockHeld`; ``float('inf')``: wait forever).

    ``wait_replicas``: after acquiring, ``WAIT`` (up to ``wait_replicas_timeout_ms``)
    until that many replicas have the lock, so that a failover right after is
    less likely to forget it (default: the settings' ``redis.wait_replicas``).
    :attr:`replicas_acked` says how many did; a shortfall does not release the
    lock (compare it with ``wait_replicas`` if it matters to you).
    """

    def __init__(
        self,
        rs: Rsched,
        name: str,
        *,
        ttl_ms: int = DEFAULT_TTL_MS,
        wait: float | None = None,
        watchdog: bool = True,
        on_lost: Callable[[str], None] | None = None,
        wait_replicas: int | None = None,
        wait_replicas_timeout_ms: int | None = None,
    ):
        from rsched import replication

        validate.name(name, "lock name")
        if ttl_ms < MIN_TTL_MS:
            raise errors.BadInput("--ttl", f"must be at least {MIN_TTL_MS}ms")
        self.rs = rs
        self.name = name
        self.keys = rs.keys.lock(name)
        self.ttl_ms = int(ttl_ms)
        self.wait = wait
        self.owner = new_owner_id()
        self.token: int | None = None
        self.acquired_ms: int | None = None
        self._use_watchdog = watchdog
        self._on_lost = on_lost
        self._watchdog: Watchdog | None = None
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
            from rsched.replication import script_and_wait

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
        deadline = None if self.wait in (None, 0) else time.monotonic() + float(self.wait or 0)
        delay = 0.05
        while True:
            got = self.try_acquire()
            if isinstance(got, int):
                if self._use_watchdog:
                    self._watchdog = Watchdog(
                        self.renew,
                        self.ttl_ms,
                        on_lost=self._on_lost,
                        name=f"rsched-lock-{self.name}",
                    ).start()
                return got
            if deadline is None or time.monotonic() >= deadline:
                raise errors.LockHeld(f"lock {self.name!r} is {got.describe()}")
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 1.0)

    def renew(self) -> int:
        res = self.rs.scripts("lock-renew-1", [self.keys.lock], [self.owner, self.ttl_ms])
        return int(res[0])

    def release(self, record: dict[str, Any] | None = None) -> bool:
        if self._watchdog:
            self._watchdog.stop()
        res = self.rs.scripts(
            "lock-release-2",
            [self.keys.lock, self.keys.history],
            [self.owner, self.rs.history_maxlen if record else 0, _dumps(record) if record else ""],
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
        from rsched.timeutil import iso

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


def list_locks(rs: Rsched, pattern: str | None = None, count: int = 500) -> list[LockInfo]:
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


def unlock(rs: Rsched, name: str, token: str | None = None, force: bool = False) -> int:
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
    key = rs.keys.lock(name).lock
    if not rs.redis.exists(key) and rs.redis.exists(rs.keys.cron(name).run_lock):
        key = rs.keys.cron(name).run_lock
    return int(rs.scripts("lock-unlock-1", [key], [arg]))


__all__ = ["Lock", "Watchdog", "Holder", "LockInfo", "list_locks", "unlock", "host_id"]
