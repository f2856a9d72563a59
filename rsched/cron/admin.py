"""The operator's view of crons: :func:`list_crons` (`rsched crons`, `rsched top`)
and the emergency switch :func:`pause` / :func:`resume`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rsched.core import cronexpr, errors, validate
from rsched.core.timeutil import iso
from rsched.lua import calls

if TYPE_CHECKING:  # pragma: no cover
    from rsched.context import Context


def pause(rs: Context, name: str) -> bool:
    """Pause cron ``name``; returns whether any runner ever registered it."""
    validate.name(name, "NAME")
    k = rs.keys.cron(name)
    known = bool(rs.redis.sismember(rs.keys.crons, name))
    calls.cron_pause(rs, k, pause=True)
    return known


def resume(rs: Context, name: str) -> bool:
    """Resume cron ``name``; returns whether it was paused. The pause's span is kept
    (state ``pause_from_ms`` / ``pause_to_ms``): ticks inside it that a runner only
    catches up on later are recorded ``skipped`` (paused), not ``missed``."""
    validate.name(name, "NAME")
    k = rs.keys.cron(name)
    return calls.cron_pause(rs, k, pause=False)


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
                st.get("schedule"),
                st.get("tz"),
                nxt,
                int(lf) if lf else None,
                st.get("last_result"),
                st.get("last_host"),
                int(runners),
                bool(paused),
                bool(running),
                dialect,
            )
        )
    return out
