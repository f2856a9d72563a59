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
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rsched.core import cronexpr
from rsched.core.errors import BadInput
from rsched.core.timeutil import human_duration, iso

if TYPE_CHECKING:  # pragma: no cover
    from rsched.api import Rsched

#: A tick counts as unrun once it is this far in the past (SPEC: a grace of 30 s).
GRACE_MS = 30_000
#: How often a namespace's live loops look for silent crons: one of them, the one that
#: takes ``{ns}:silence-check`` (SET NX PX this); the taker tries again as it expires,
#: the others every half of it, so at most 1.5 times this passes between two checks
#: when the taker died (20 s: 30 s, and a silent cron is noticed within a minute of
#: its tick, grace included). ``RSCHED_TEST_SILENCE_EVERY_MS`` shortens it in tests.
SILENCE_EVERY_MS = 20_000
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
    from rsched.cron.admin import list_crons

    out: list[Problem] = []
    crons = [c for c in list_crons(rs) if not c.paused]
    now = rs.now_ms()
    if crons:
        pipe = rs.redis.pipeline(transaction=False)
        for c in crons:
            k = rs.keys.cron(c.name)
            pipe.zrevrange(k.ticks, 0, 0)
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
    return out


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


def notice_silences(rs: Rsched) -> int:
    """The dead-man's switch, recorded: a ``cron.silent`` event for each silent
    cron whose silence has none yet (``event-silent-2``). How many were new."""
    from rsched.tools.events import note_silent

    n = 0
    for p in run_checks(rs):
        if p.check == "cron.silent" and p.name and p.fire_ms is not None:
            n += note_silent(rs, p.name, p.fire_ms, p.seen_ms or 0)
    return n


def silence_every_ms() -> int:
    return int(os.environ.get("RSCHED_TEST_SILENCE_EVERY_MS") or SILENCE_EVERY_MS)


def silence_turn(rs: Rsched, me: str) -> float:
    """A live loop's turn at the dead-man's switch: the one process of the namespace
    that takes ``{ns}:silence-check`` for the interval runs :func:`notice_silences`;
    the others skip (one command). The seconds until this process should try again."""
    every = silence_every_ms()
    taken = rs.redis.set(rs.keys.silence_check, me, nx=True, px=every)
    if not taken:
        return every / 2000
    expires = time.monotonic() + every / 1000  # at the latest: the SET has returned
    notice_silences(rs)
    return max(0.0, expires - time.monotonic()) + 0.05
