"""`rsched check`: what a probe (Nagios, a liveness probe, a crontab `|| mail`)
asks: is anything wrong right now? One :class:`Problem` per finding.

- ``cron.failed``: a cron's last tick did not run ok (failed, timeout, lost, missed).
- ``cron.silent``: the dead-man's switch. The latest tick due at least
  :data:`GRACE_MS` ago is later than anything a runner did for the cron (the
  last tick it claimed, the last run, its registration): nothing ran it.
- ``cron.no-runner``: no live runner is registered.
- ``queue.lag`` (with ``max_lag_ms``): the oldest due task waits longer than that.
- ``queue.dead`` (with ``dead``): the queue holds dead tasks.

Paused crons are not checked (a pause is on purpose). Reads only: one pipelined
round trip for the crons, as ``rsched crons``, one more for their last claimed
ticks, and ``rsched queues``'s two when queues are checked.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rsched.core import cronexpr
from rsched.core.errors import BadInput
from rsched.core.timeutil import human_duration, iso

if TYPE_CHECKING:  # pragma: no cover
    from rsched.api import Rsched

#: A tick counts as unrun once it is this far in the past (SPEC: a grace of 30 s).
GRACE_MS = 30_000
#: The dead-man's switch of the live loops: one process of a namespace checks at a
#: time, the one that takes ``{ns}:silence-check`` (SET NX). Having checked, it sets
#: the key's PX to how long no cron can turn silent: until the earliest next tick of
#: an unpaused cron passes the grace (no cron with a schedule: the most), at least
#: SILENCE_EVERY_MS, at most SILENCE_HINT_MAX_MS. Every other loop tries again every
#: SILENCE_EVERY_MS, the taker when the key expires: a check runs at most
#: SILENCE_EVERY_MS after one could find something, and a silent cron is noticed
#: within 30 s + 20 s of its tick. A loop that runs crons checks SILENCE_EVERY_MS
#: after its start whatever the key says (its crons are registered by then and may
#: tick sooner than the key knew; none can be silent before its first tick plus
#: the grace). A cron resumed, or re-registered with another schedule by a runner
#: that then died, is noticed SILENCE_HINT_MAX_MS late at worst.
#: ``RSCHED_TEST_SILENCE_EVERY_MS`` shortens the interval in tests.
SILENCE_EVERY_MS = 20_000
SILENCE_HINT_MAX_MS = 300_000
#: Results of a last tick that make ``cron.failed``.
NOT_OK = ("failed", "timeout", "lost", "missed")


@dataclass(frozen=True)
class Problem:
    check: str
    name: str | None
    queue: str | None
    message: str
    #: cron.silent: the unrun tick, and the latest thing a runner did (for its event).
    fire_ms: int | None = None
    seen_ms: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "name": self.name,
            "queue": self.queue,
            "message": self.message,
        }

    def line(self) -> str:
        return f"{self.check} {self.name or self.queue}: {self.message}"


def run_checks(rs: Rsched, *, max_lag_ms: int | None = None, dead: bool = False) -> list[Problem]:
    return _checks(rs, max_lag_ms=max_lag_ms, dead=dead)[0]


def _checks(
    rs: Rsched, *, max_lag_ms: int | None = None, dead: bool = False
) -> tuple[list[Problem], int | None]:
    """The problems, and in how many ms the earliest unpaused cron's next tick
    passes the grace (None: no cron with a schedule)."""
    from rsched.cron.admin import list_crons

    out: list[Problem] = []
    crons = [c for c in list_crons(rs) if not c.paused]
    now = rs.now_ms()
    quiet: int | None = None
    if crons:
        pipe = rs.redis.pipeline(transaction=False)
        for c in crons:
            k = rs.keys.cron(c.name)
            pipe.zrange(k.ticks, -1, -1)  # the last claimed tick (ZRANGE: in the ACL grant)
            pipe.hget(k.state, "registered_ms")
        got = pipe.execute()
    for i, c in enumerate(crons):
        if c.last_result in NOT_OK:
            when = iso(c.last_fire_ms) or "its last tick"
            out.append(Problem("cron.failed", c.name, None, f"the tick of {when} {c.last_result}"))
        last_claimed, registered = got[2 * i], got[2 * i + 1]
        seen = max(
            int(float(last_claimed[0])) if last_claimed else 0,
            c.last_fire_ms or 0,
            int(registered) if registered else 0,
        )
        due = _last_due(c.schedule, c.tz, c.dialect, now - GRACE_MS)
        nxt = _next_due(c.schedule, c.tz, c.dialect, now - GRACE_MS)
        if nxt is not None:
            quiet = nxt + GRACE_MS if quiet is None else min(quiet, nxt + GRACE_MS)
        if due is not None and seen and due > seen:
            out.append(
                Problem(
                    "cron.silent",
                    c.name,
                    None,
                    f"the tick of {iso(due)} passed {human_duration(now - due)} ago and nothing ran it",
                    fire_ms=due,
                    seen_ms=seen,
                )
            )
        if c.runners == 0:
            out.append(Problem("cron.no-runner", c.name, None, "no live runner"))
    if max_lag_ms is not None or dead:
        for q in rs.queues():
            if max_lag_ms is not None and q.lag_ms > max_lag_ms:
                out.append(
                    Problem(
                        "queue.lag",
                        None,
                        q.queue,
                        f"the oldest due task waits {human_duration(q.lag_ms)} "
                        f"(more than {human_duration(max_lag_ms)})",
                    )
                )
            if dead and q.dead:
                out.append(Problem("queue.dead", None, q.queue, f"{q.dead} dead task(s)"))
    return out, (quiet - now if quiet is not None else None)


def _last_due(
    schedule: str | None, tz: str | None, dialect: str | None, until_ms: int
) -> int | None:
    """The latest tick at or before ``until_ms`` (None: no schedule we can read)."""
    if not schedule:
        return None
    try:
        return cronexpr.parse(schedule, tz or "UTC", dialect=dialect).prev_at_or_before(until_ms)
    except (BadInput, ValueError):
        return None


def _next_due(
    schedule: str | None, tz: str | None, dialect: str | None, after_ms: int
) -> int | None:
    """The first tick after ``after_ms`` (None: no schedule we can read)."""
    if not schedule:
        return None
    try:
        return cronexpr.parse(schedule, tz or "UTC", dialect=dialect).next_after(after_ms)
    except (BadInput, ValueError):
        return None


def notice_silences(rs: Rsched) -> int:
    """The dead-man's switch, recorded: a ``cron.silent`` event for each silent
    cron whose silence has none yet (``event-silent-2``). How many were new."""
    return _notice(rs)[0]


def _notice(rs: Rsched) -> tuple[int, int | None]:
    from rsched.tools.events import note_silent

    n = 0
    problems, quiet = _checks(rs)
    for p in problems:
        if p.check == "cron.silent" and p.name and p.fire_ms is not None:
            n += note_silent(rs, p.name, p.fire_ms, p.seen_ms or 0)
    return n, quiet


def silence_every_ms() -> int:
    return int(os.environ.get("RSCHED_TEST_SILENCE_EVERY_MS") or SILENCE_EVERY_MS)


class SilenceTurns:
    """A live loop's turns at the dead-man's switch (the Deliverer's ``every``):
    each call returns the seconds until the next one. ``runs_crons``: the loop's
    first check comes one interval after its start, whatever the key says."""

    def __init__(self, rs: Rsched, me: str, runs_crons: bool = False) -> None:
        self.rs, self.me = rs, me
        self._forced = 0 if runs_crons else -1  # 0: waiting to force, 1: forced once
        self.checks = 0

    def __call__(self) -> float:
        every = silence_every_ms()
        if self._forced == 0:
            self._forced = 1
            return every / 1000
        key = self.rs.keys.silence_check
        if self._forced == 1:
            self._forced = -1
        elif not self.rs.redis.set(key, self.me, nx=True, px=every):
            return every / 1000
        self.checks += 1
        _n, quiet_ms = _notice(self.rs)
        # No cron with a schedule: none can turn silent before a runner registers
        # one, and that runner checks one interval after its start.
        hint = SILENCE_HINT_MAX_MS if quiet_ms is None else quiet_ms
        hint = max(every, min(SILENCE_HINT_MAX_MS, hint))
        if hint != every:
            self.rs.redis.set(key, self.me, px=hint)
        return hint / 1000 + 0.05  # the key has expired by then: this loop takes it again
