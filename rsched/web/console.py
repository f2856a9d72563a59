"""What the console's pages read, through the library calls the CLI makes.

The overview is one *snapshot* (queues, crons, held locks, the latest runs)
kept for :data:`SNAPSHOT_TTL_S` and shared by every open page, and the
``doctor`` verdicts kept for :data:`DOCTOR_TTL_S` (they cost tens of commands
and change rarely), so the Redis load of the console does not grow with its
viewers and an open overview polled every :data:`POLL_S` seconds stays under
5 commands/s. Measured (``tests/integration/web/bench_web.py``, chromium keeping
the overview open for 60 s, three queues and two crons): 268 commands, 4.5/s; a
snapshot is ~60 pipelined commands, ~13 of them per queue (``queue_stats``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from rsched.api import Rsched

SNAPSHOT_TTL_S = 2.0
DOCTOR_TTL_S = 60.0
#: how often console.js reloads the live part of a page (seconds)
POLL_S = 15
#: latest runs on the overview
LATEST_RUNS = 15
#: recent events on the overview
LATEST_EVENTS = 10


class Cache:
    """Values computed at most once per ``ttl`` seconds, whoever asks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[str, tuple[float, Any]] = {}

    def get(self, key: str, ttl: float, compute: Callable[[], Any]) -> Any:
        with self._lock:  # one computation at a time: ten viewers cost one read
            got = self._kept.get(key)
            if got is not None and time.monotonic() - got[0] < ttl:
                return got[1]
            value = compute()
            self._kept[key] = (time.monotonic(), value)
            return value

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()


class Console:
    def __init__(self, rs: Rsched, config_crons: dict[str, Any] | None = None):
        self.rs = rs
        self.config_crons = config_crons or {}
        self.cache = Cache()

    # --- the overview ------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        return self.cache.get("snapshot", SNAPSHOT_TTL_S, self._snapshot)

    def _snapshot(self) -> dict[str, Any]:
        from rsched.cron.admin import list_crons
        from rsched.locks.admin import list_locks
        from rsched.queue import ops as tasks
        from rsched.tools import history

        rs = self.rs
        return {
            "now_ms": rs.now_ms(),
            "queues": tasks.queue_stats(rs),
            "crons": list_crons(rs),
            "locks": list_locks(rs),
            "runs": history.read(rs, limit=LATEST_RUNS, logs=False),
            "events": self.events(LATEST_EVENTS),
        }

    def events(self, limit: int) -> list[Any]:
        """The newest events (``Rsched.events``), as ``rsched events --json`` has them."""
        return self.rs.events(limit=limit)

    def doctor(self) -> list[Any]:
        from rsched.tools.doctor import run_checks

        return self.cache.get("doctor", DOCTOR_TTL_S, lambda: run_checks(self.rs))

    def changed(self) -> None:
        """After an action: the next page shows its effect."""
        self.cache.clear()

    # --- one queue, one task -----------------------------------------------------------
    def queue(self, name: str) -> Any:
        from rsched.queue import ops as tasks

        rows = tasks.queue_stats(self.rs, [name])
        return rows[0] if rows else None

    def page(self, query: Any, cursor: str | None) -> Any:
        from rsched.queue import paging

        return paging.page(self.rs, query, cursor)

    def task(self, ref: Any) -> Any:
        from rsched.queue import ops as tasks

        return tasks.show_ref(self.rs, ref)

    # --- crons -------------------------------------------------------------------------
    def cron(self, name: str) -> Any:
        from rsched.cron.admin import list_crons

        for c in list_crons(self.rs):
            if c.name == name:
                return c
        return None

    def ticks(self, name: str, count: int = 10) -> list[dict[str, Any]]:
        from rsched.tools import actions

        sched = actions.schedule_of(lambda: self.rs, self.config_crons, name, None, None)
        return actions.next_ticks(sched, count)

    def history(
        self, name: str | None = None, queue: str | None = None, limit: int = 50
    ) -> list[Any]:
        from rsched.tools import history

        return history.read(self.rs, name, queue=queue, limit=limit)

    def run_log(self, name: str, token: str) -> dict[str, Any]:
        """A finished run's kept log, or what a running one wrote so far
        (``live``: true; the page refreshes it)."""
        from rsched.core.errors import NotFound
        from rsched.tools import logs

        try:
            return {**logs.runs(self.rs, name, token=token)[0], "live": False}
        except NotFound:
            got = logs.running(self.rs, name, token=token)
            if got is None:
                raise
            keys, tok = got
            return {
                "token": tok,
                "result": "running",
                "live": True,
                "truncated": False,
                **logs.so_far(self.rs, keys, tok),
            }

    def running_token(self, name: str) -> str | None:
        """The token of the cron's run in progress, if any."""
        from rsched.tools import logs

        got = logs.running(self.rs, name)
        return got[1] if got else None

    def locks(self, pattern: str | None = None) -> list[Any]:
        from rsched.locks.admin import list_locks

        return list_locks(self.rs, pattern)
