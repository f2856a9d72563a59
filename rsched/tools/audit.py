"""The audit trail: one record per operator action, from the CLI or the web console.

Every action of :mod:`rsched.tools.actions` (pause/resume a cron or a queue,
trigger, retry, purge, cancel, unlock) ends with one record in the capped
stream ``{ns}:audit`` (``XADD ... MAXLEN ~`` :data:`AUDIT_MAXLEN`): what was
done to what, by whom, and whether it was done or refused (and why). The
stream entry's ID is the server's clock, so ``at_ms`` needs no extra command.
On Redis Cluster the stream is one key in one slot: it is written after the
action, not as part of its atomic step.

Who: from the web, how the caller authenticated (``bearer``, ``session:HASH``
-- the first 8 hex digits of the session's SHA-256, never the session id --
or ``local`` when no token is configured) and the client's address; from the
CLI, the OS user and this host. No secret is ever recorded (lock tokens are
fencing counters, not secrets).

``rsched history --actions`` and the web's ``/api/audit`` show the records
as :meth:`AuditRecord.to_json` has them.
"""

from __future__ import annotations

import getpass
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from rsched.core import errors
from rsched.core.defaults import host_id
from rsched.core.timeutil import iso

if TYPE_CHECKING:  # pragma: no cover
    from rsched.context import Context

#: audit records kept (a capped stream; the oldest go first)
AUDIT_MAXLEN = 10_000

#: the names of the actions, as records and the web's routes have them
ACTIONS = (
    "cron.pause",
    "cron.resume",
    "cron.trigger",
    "queue.pause",
    "queue.resume",
    "dead.retry",
    "dead.purge",
    "task.retry",
    "task.cancel",
    "lock.unlock",
)


@dataclass(frozen=True)
class Actor:
    """Who acts: ``via`` cli or web, ``user`` (OS user; or bearer, session:HASH,
    local) and ``addr`` (this host; or the web client's address)."""

    via: str
    user: str
    addr: str

    def to_json(self) -> dict[str, str]:
        return {"via": self.via, "user": self.user, "addr": self.addr}


def cli_actor() -> Actor:
    """The person running this CLI process: the OS user at this host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no $USER
        user = "?"
    return Actor("cli", user, host_id())


@dataclass(frozen=True)
class AuditRecord:
    id: str
    at_ms: int
    action: str
    target: dict[str, Any]
    who: dict[str, Any]
    result: str
    reason: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "at": iso(self.at_ms),
            "at_ms": self.at_ms,
            "action": self.action,
            "target": self.target,
            "who": self.who,
            "result": self.result,
            "reason": self.reason,
        }


def key(rs: Context) -> str:
    return rs.keys.audit


def record(
    rs: Context,
    action: str,
    target: dict[str, Any],
    by: Actor,
    result: str = "done",
    reason: str | None = None,
) -> str | None:
    """Append one record; its ID (server time), or None when Redis refused the
    write (the action's own outcome stands: an audit write never hides it)."""
    fields = {
        "action": action,
        "target": json.dumps(target, sort_keys=True, ensure_ascii=False),
        "who": json.dumps(by.to_json(), sort_keys=True, ensure_ascii=False),
        "result": result,
    }
    if reason is not None:
        fields["reason"] = reason
    try:
        got = rs.redis.xadd(key(rs), fields, maxlen=AUDIT_MAXLEN, approximate=True)
    except (errors.RschedError, RedisError):  # the action's outcome stands all the same
        return None
    return got if isinstance(got, str) else got.decode()


def refusal(exc: BaseException) -> bool:
    """Whether an action's error is a refusal to record: not bad input (that is
    refused before anything connects, and writes nothing) nor an unreachable Redis."""
    return isinstance(exc, errors.RschedError) and not isinstance(
        exc, errors.BadInput | errors.RedisUnavailable
    )


@contextmanager
def recording(
    rs: Context, action: str, target: dict[str, Any], by: Actor | None
) -> Iterator[dict[str, Any]]:
    """Run an action inside: on return one ``done`` record, on a refusal
    (NotFound, Conflict...: :func:`refusal`) one ``refused`` record with its message,
    and the error goes on. The yielded dict may add to the target (e.g. counts)."""
    extra: dict[str, Any] = {}
    who = by or cli_actor()
    try:
        yield extra
    except errors.RschedError as exc:
        if refusal(exc):
            record(rs, action, {**target, **extra}, who, "refused", str(exc))
        raise
    record(rs, action, {**target, **extra}, who, "done")


def _s(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _obj(raw: Any) -> dict[str, Any]:
    try:
        v = json.loads(_s(raw))
    except ValueError:
        return {}
    return v if isinstance(v, dict) else {}


def read(rs: Context, limit: int = 50) -> list[AuditRecord]:
    """The newest ``limit`` records, newest first."""
    rows = rs.redis.xrevrange(key(rs), count=limit)
    out = []
    for rid, f in rows:
        rid = _s(rid)
        d = {_s(k): v for k, v in f.items()}
        out.append(
            AuditRecord(
                id=rid,
                at_ms=int(rid.split("-", 1)[0]),
                action=_s(d.get("action", "")),
                target=_obj(d.get("target", "{}")),
                who=_obj(d.get("who", "{}")),
                result=_s(d.get("result", "")),
                reason=_s(d["reason"]) if "reason" in d else None,
            )
        )
    return out
