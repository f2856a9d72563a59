"""What the console's pages read, through the library calls the CLI makes.

The overview is one *snapshot* (queues, crons, held locks, the latest runs)
kept for :data:`SNAPSHOT_TTL_S` and shared by every open page, and the
``doctor`` verdicts kept for :data:`DOCTOR_TTL_S` (they cost tens of commands
and change rarely), so the Redis load of the console does not grow with its
viewers. A snapshot's cost grows with what there is to show (~11 commands per
queue: 9 for its counts, its history and its events), so the overview's poll interval is measured,
not fixed: each snapshot counts the commands it sent, and the page reloads every
``max(POLL_S, cost / POLL_BUDGET_PER_S)`` seconds (at most :data:`POLL_MAX_S`),
which keeps one open overview under 5 commands/s however many queues there are.
Measured (``tests/integration/web/bench_web.py``, chromium keeping the overview
open, three queues and two crons): see the closing figures in the README.
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
#: how often console.js reloads the live part of a page (seconds): the least
POLL_S = 15
#: the overview polls less often when a snapshot costs more: commands/s it may use
POLL_BUDGET_PER_S = 3.5
POLL_MAX_S = 300
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


def count_commands(client: Any) -> Callable[[], int]:
    """Count the commands this client object sends from now on (direct calls and
    pipelined ones; scripts count one each): a function that reads the count.
    Only this object is touched; other clients are not."""
    sent = [0]
    execute_command, pipeline = client.execute_command, client.pipeline

    def counted_execute(*args: Any, **kw: Any) -> Any:
        sent[0] += 1
        return execute_command(*args, **kw)

    def counted_pipeline(*args: Any, **kw: Any) -> Any:
        pipe = pipeline(*args, **kw)
        run = pipe.execute

        def counted_run(*a: Any, **k: Any) -> Any:
            sent[0] += len(pipe.command_stack)
            return run(*a, **k)

        pipe.execute = counted_run
        return pipe

    client.execute_command, client.pipeline = counted_execute, counted_pipeline
    return lambda: sent[0]


class Console:
    def __init__(self, rs: Rsched, config_crons: dict[str, Any] | None = None):
        self.rs = rs
        self.config_crons = config_crons or {}
        self.cache = Cache()
        self._sent = count_commands(rs.redis)
        #: the overview's poll interval (s), from the last snapshot's cost
        self.overview_poll_s: int = POLL_S
        #: commands the last snapshot sent
        self.snapshot_cost = 0

    # --- the overview ------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        return self.cache.get("snapshot", SNAPSHOT_TTL_S, self._snapshot)

    def _snapshot(self) -> dict[str, Any]:
        from rsched.cron.admin import list_crons
        from rsched.locks.admin import list_locks
        from rsched.queue import ops as tasks
        from rsched.tools import history

        rs = self.rs
        before = self._sent()
        snap = {
            "now_ms": rs.now_ms(),
            "queues": tasks.queue_stats(rs),
            "crons": list_crons(rs),
            "locks": list_locks(rs),
            "runs": history.read(rs, limit=LATEST_RUNS, logs=False),
            "events": self.events(LATEST_EVENTS),
        }
        self.snapshot_cost = self._sent() - before
        wanted = -(-self.snapshot_cost // POLL_BUDGET_PER_S)  # ceil
        self.overview_poll_s = int(min(POLL_MAX_S, max(POLL_S, wanted)))
        return snap

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

    def audit(self, limit: int) -> list[Any]:
        """The newest operator actions (``rsched history --actions``)."""
        from rsched.tools import audit

        return audit.read(self.rs, limit)

    def locks(self, pattern: str | None = None) -> list[Any]:
        from rsched.locks.admin import list_locks

        return list_locks(self.rs, pattern)
