"""The operator's view of locks: :func:`list_locks` (`rsched locks`, `rsched top`;
exec / library locks and cron run locks, by SCAN) and :func:`unlock` (`rsched
unlock`: by fencing token, or forced)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rsched.core import errors, validate
from rsched.locks.lock import WAKE_KEEP_MS
from rsched.lua import calls

if TYPE_CHECKING:  # pragma: no cover
    from rsched.context import Context


def _int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


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
    lock_key: str = lk.lock
    wake_key: str | None = lk.wake
    if not rs.redis.exists(lk.lock) and rs.redis.exists(rs.keys.cron(name).run_lock):
        # a cron's run lock has no waiters to wake
        lock_key, wake_key = rs.keys.cron(name).run_lock, None
    return calls.lock_unlock(rs, lock_key, wake_key, arg, WAKE_KEEP_MS)


__all__ = ["LockInfo", "list_locks", "unlock"]
