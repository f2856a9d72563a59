"""The operator's view of crons: :func:`list_crons` (`rsched crons`, `rsched top`),
the emergency switch :func:`pause` / :func:`resume`, and :func:`forget` of a
retired cron.

Forgetting is one script (``cron-forget-13``) that checks the live runners and
deletes every key of the cron in the same step, so a runner registering at that
moment is either seen (and the forget refused) or registers afresh afterwards.
The crons registry lives in another hash slot on a cluster, so it is updated
after the script: removed, then put back if a runner registered in between (its
state or registration exists again). A tick's shard claims
(``{c:NAME}:shards:FIRE``) are not deleted: they expire on their own. The
fencing counter stays: a cron later started under the same name gets higher
fencing tokens (they only go up, guarantee 4)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rsched.core import cronexpr, errors, validate
from rsched.core.timeutil import iso
from rsched.lua import calls

if TYPE_CHECKING:  # pragma: no cover
    from rsched.context import Context


def registered(rs: Context, name: str) -> bool:
    """Whether a runner ever registered cron ``name`` (it is in the crons registry)."""
    return bool(rs.redis.sismember(rs.keys.crons, name))


def seen(rs: Context, name: str) -> bool:
    """Whether rsched has seen cron ``name``: a runner registered it, or it has state
    (paused with ``--create`` before its first runner started, say)."""
    k = rs.keys.cron(name)
    pipe = rs.redis.pipeline(transaction=False)
    pipe.sismember(rs.keys.crons, name)
    pipe.exists(k.state)
    pipe.exists(k.paused)
    return any(bool(int(x)) for x in pipe.execute())


def _unknown(name: str, verb: str) -> errors.NotFound:
    return errors.NotFound(
        f'no cron "{name}": no runner has registered it; nothing was {verb} '
        f"(--create {verb[:-1]}s it anyway, before its first runner starts)"
    )


def pause(rs: Context, name: str, *, create: bool = True) -> bool:
    """Pause cron ``name``; returns whether any runner ever registered it.
    ``create=False``: a name rsched has never seen (:func:`seen`) is refused
    (NotFound) and nothing is written."""
    validate.name(name, "NAME")
    k = rs.keys.cron(name)
    known = registered(rs, name)
    if not known and not create and not seen(rs, name):
        raise _unknown(name, "paused")
    calls.cron_pause(rs, k, pause=True)
    return known


def resume(rs: Context, name: str, *, create: bool = True) -> bool:
    """Resume cron ``name``; returns whether it was paused. The pause's span is kept
    (state ``pause_from_ms`` / ``pause_to_ms``): ticks inside it that a runner only
    catches up on later are recorded ``skipped`` (paused), not ``missed``.
    ``create=False``: a name rsched has never seen is refused (NotFound)."""
    validate.name(name, "NAME")
    k = rs.keys.cron(name)
    if not create and not seen(rs, name):
        raise _unknown(name, "resumed")
    return calls.cron_pause(rs, k, pause=False)


@dataclass(frozen=True)
class Forgotten:
    """What :func:`forget` did: the keys deleted and the runners that were live
    (non-zero only when forced)."""

    name: str
    keys: int
    live_runners: int

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "forgotten": True,
            "keys": self.keys,
            "live_runners": self.live_runners,
        }


def forget(rs: Context, name: str, *, force: bool = False) -> Forgotten:
    """Remove every key of cron ``name`` and its registry entry. NotFound when
    there is nothing of it; Conflict (nothing deleted) while a runner is live,
    unless ``force``."""
    validate.name(name, "NAME")
    k = rs.keys.cron(name)
    got = calls.cron_forget(rs, k, force=force)
    if got.refused:
        raise errors.Conflict(
            f'cron "{name}" has {got.live_runners} live runner'
            f"{'' if got.live_runners == 1 else 's'}; nothing was forgotten (stop "
            "them first, or --force for runners that are gone)"
        )
    unlisted = int(rs.redis.srem(rs.keys.crons, name))
    pipe = rs.redis.pipeline(transaction=False)
    pipe.exists(k.state)
    pipe.zcard(k.runners)
    if any(int(x) for x in pipe.execute()):  # a runner registered after the script
        rs.redis.sadd(rs.keys.crons, name)
    if not got.deleted and not unlisted:
        raise errors.NotFound(f'no cron "{name}": nothing to forget')
    return Forgotten(name, got.deleted, got.live_runners)


@dataclass
class CronInfo:
    name: str
    schedule: str | None
    tz: str | None
    next_fire_ms: int | None
    last_fire_ms: int | None
    last_result: str | None
    last_host: str | None
    runners: int
    paused: bool
    running: bool
    dialect: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: The crons this one runs after (``run cron B --after A``; [] otherwise).
    after: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "schedule": self.schedule,
            "tz": self.tz,
            "dialect": self.dialect,
            "next_fire_at": iso(self.next_fire_ms),
            "next_fire_ms": self.next_fire_ms,
            "last_fire_at": iso(self.last_fire_ms),
            "last_fire_ms": self.last_fire_ms,
            "last_result": self.last_result,
            "last_host": self.last_host,
            "runners": self.runners,
            "paused": self.paused,
            "running": self.running,
            "after": list(self.after),
        }


def list_crons(rs: Context) -> list[CronInfo]:
    names = sorted(rs.redis.smembers(rs.keys.crons))
    now = rs.now_ms()
    if not names:
        return []
    pipe = rs.redis.pipeline(transaction=False)
    for n in names:
        k = rs.keys.cron(n)
        pipe.hgetall(k.state)
        pipe.exists(k.paused)
        pipe.zcount(k.runners, now, "+inf")
        pipe.exists(k.run_lock)
    res = pipe.execute()
    out = []
    for i, n in enumerate(names):
        st, paused, runners, running = res[4 * i : 4 * i + 4]
        nxt = None
        dialect = st.get("dialect") or (
            cronexpr.dialect_of(st["schedule"], None) if st.get("schedule") else None
        )
        if st.get("schedule"):
            try:
                nxt = cronexpr.parse(
                    st["schedule"], st.get("tz") or "UTC", dialect=dialect
                ).next_after(now)
            except errors.BadInput:
                nxt = None
        lf = st.get("last_run_fire")
        out.append(
            CronInfo(
                n,
                st.get("schedule") or None,  # "" for a cron that only runs --after
                st.get("tz"),
                nxt,
                int(lf) if lf else None,
                st.get("last_result"),
                st.get("last_host"),
                int(runners),
                bool(paused),
                bool(running),
                dialect,
                after=[a for a in (st.get("after") or "").split(",") if a],
            )
        )
    return out
