"""The application object: declare tasks, crons and locked functions in code.

>>> app = App()                      # URL, namespace: environment / config file, as the CLI
>>> @app.task("order.close", queue="orders", timeout="30s")
... def close_order(task): ...
>>> close_order.delay("1001", delay="30m", payload={"order": 1001})   # -> AddResult
>>> close_order.at("1002", "2026-12-24T18:00:00Z")                      # the same, at a time
>>> @app.cron("0 0 2 * * ?", tz="Asia/Shanghai")
... def daily_report(run): ...      # run.name, run.fire_at, run.fencing_token, ...
>>> @app.locked("reindex", ttl="5m")
... def reindex(): ...              # raises rsched.LockHeld while another holder has it

Declaring is pure: nothing connects until a task is scheduled, a locked
function is called or a worker runs. A decorator returns the function itself
with its scheduling methods added (``delay``, ``at``), so the function stays callable
and picklable as it was.

**Where things run.** ``rsched run worker MODULE:ATTR`` runs one consumer for
every queue of the app's tasks and one cron runner per cron
(:mod:`rsched.app.worker`). A task handler runs in the worker (its timeout:
:mod:`rsched.runtime.pycall`). A cron's run is a child process,
``python -m rsched.app.child MODULE:ATTR NAME``, run by the cron runner like
the command of ``rsched run cron``: so a Python cron has every guarantee of
one (once per tick across processes and hosts, fencing token, watchdog,
``--concurrency replace``, timeout and lost lock kill the child, history,
run log of its output, alerts). The child imports the module again (its cost
is Python's start plus that import, ~50-150 ms a run) and gets the worker's
connection settings on stdin, so ``task.delay()`` from a cron reaches the same
Redis; the password is never in its argv or environment.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from rsched.core import errors, validate
from rsched.core.timeutil import duration_ms

if TYPE_CHECKING:  # pragma: no cover
    from rsched.context import Context
    from rsched.core.config import Settings
    from rsched.cron.spec import CronSpec
    from rsched.queue.model import AddResult

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class TaskDef:
    """One ``@app.task``: its type, queue, defaults, and the handler."""

    type: str
    fn: Callable[..., Any]
    queue: str = "default"
    max_attempts: int | None = None
    timeout_ms: int | None = None
    lease_ms: int | None = None
    #: (N, window ms, text) of ``rate_limit="N/DUR"``: this type's own rate limit
    rate_limit: tuple[int, int, str] | None = None


@dataclass(frozen=True)
class CronDef:
    """One ``@app.cron``: the function and its checked spec's inputs."""

    name: str
    fn: Callable[..., Any]
    expr: str
    tz: str = "UTC"
    concurrency: str = "forbid"
    misfire: str = "skip"
    shards: int | None = None
    timeout: Any = None
    dialect: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def spec(self, command: list[str], stdin: bytes | None = None) -> CronSpec:
        """The runner's spec (every field checked, naming the decorator's argument)."""
        from rsched.cron.spec import make_spec

        sp = make_spec(
            self.name,
            self.expr,
            command,
            tz=self.tz,
            dialect=self.dialect,
            concurrency=self.concurrency,
            misfire=self.misfire,
            shards=self.shards,
            timeout=self.timeout,
            prefix=f"@app.cron({self.name}).",
            **self.options,
        )
        sp.stdin = stdin
        return sp


@dataclass(frozen=True)
class CronRun:
    """What a Python cron function gets: the run being fired."""

    name: str
    fire_at: str
    fire_ms: int
    fencing_token: int
    shard_index: int | None = None
    shard_total: int | None = None


def _dur(value: Any, what: str) -> int | None:
    return None if value is None else duration_ms(value, what)


class App:
    """An application's tasks, crons and locked functions; see the module doc.

    ``url``, ``namespace``, ``config``: as the CLI's ``--redis-url``,
    ``--namespace``, ``--config`` (None: ``RSCHED_REDIS_URL`` / ``REDIS_URL``,
    ``RSCHED_NAMESPACE``, ``RSCHED_CONFIG`` / ``./rsched.toml``, the defaults).
    """

    def __init__(
        self, url: str | None = None, namespace: str | None = None, config: str | None = None
    ):
        if namespace is not None:
            validate.name(namespace, "namespace")
        self.url = url
        self.namespace = namespace
        self.config = config
        self.tasks: dict[str, TaskDef] = {}
        self.crons: dict[str, CronDef] = {}
        self._rs: Context | None = None
        self._settings: Settings | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"App(tasks={sorted(self.tasks)}, crons={sorted(self.crons)})"

    # --- connection ------------------------------------------------------------------
    @property
    def settings(self) -> Settings:
        if self._settings is None:
            from rsched.core.config import resolve

            self._settings = resolve(self.url, self.namespace, self.config)
        return self._settings

    def configure(self, settings: Settings) -> None:
        """Use these settings (the worker's, with the CLI's flags applied); before any use."""
        with self._lock:
            self._settings = settings
            if self._rs is not None:
                self._rs.close()
                self._rs = None

    @property
    def rs(self) -> Context:
        """The app's connection (opened on first use, shared by its threads)."""
        with self._lock:
            if self._rs is None:
                from rsched.context import Context
                from rsched.core.conn import connect

                s = self.settings
                self._rs = Context(connect(s), s.namespace, settings=s)
            return self._rs

    def close(self) -> None:
        with self._lock:
            if self._rs is not None:
                self._rs.close()
                self._rs = None

    # --- tasks -----------------------------------------------------------------------
    def task(
        self,
        task_type: str,
        queue: str = "default",
        max_attempts: int | None = None,
        timeout: Any = None,
        lease: Any = None,
        rate_limit: Any = None,
    ) -> Callable[[F], F]:
        """Register ``fn(task)`` as the handler of ``task_type``; ``fn.delay(id, delay=None,
        at=None, payload=None)`` schedules one, ``fn.at(id, at, payload=None)`` at a time
        (the same as ``delay(id, at=...)``); both return what ``Rsched.add`` returns.
        ``rate_limit="N/DUR"``: at most N runs of this type in any window of DUR, across
        every worker (the queue's ``type_rate_limits`` in the config file wins)."""
        validate.task_type(task_type, "@app.task type")
        validate.queue(queue, "@app.task queue")
        if max_attempts is not None:
            max_attempts = validate.max_attempts(max_attempts)
        d_timeout = _dur(timeout, "@app.task timeout")
        d_lease = _dur(lease, "@app.task lease")
        rate = (
            None if rate_limit is None else validate.rate_limit(rate_limit, "@app.task rate_limit")
        )

        def deco(fn: F) -> F:
            if task_type in self.tasks:
                raise errors.BadInput("@app.task", f"{task_type!r} is registered twice")
            self.tasks[task_type] = TaskDef(
                task_type, fn, queue, max_attempts, d_timeout, d_lease, rate
            )

            def delay(
                task_id: str, delay: Any = None, at: Any = None, payload: Any = None
            ) -> AddResult:
                return self.add(task_type, task_id, delay=delay, at=at, payload=payload)

            def at(task_id: str, at: Any, payload: Any = None) -> AddResult:
                return self.add(task_type, task_id, at=at, payload=payload)

            fn.delay = delay  # type: ignore[attr-defined]
            fn.at = at  # type: ignore[attr-defined]
            fn.task_type = task_type  # type: ignore[attr-defined]
            return fn

        return deco

    def add(self, task_type: str, task_id: str, **kw: Any) -> AddResult:
        """``Rsched.add`` with the registered task's queue and max attempts."""
        from rsched.queue import ops

        t = self.tasks.get(task_type)
        if t is not None:
            kw.setdefault("queue", t.queue)
            if t.max_attempts is not None:
                kw.setdefault("max_attempts", t.max_attempts)
        return ops.add(self.rs, task_type, task_id, **kw)

    # --- crons -----------------------------------------------------------------------
    def cron(
        self,
        expr: str,
        name: str | None = None,
        tz: str = "UTC",
        concurrency: str = "forbid",
        misfire: str = "skip",
        shards: int | None = None,
        timeout: Any = None,
        dialect: str | None = None,
        **options: Any,
    ) -> Callable[[F], F]:
        """Register ``fn(run)`` (a :class:`CronRun`) as a cron; ``options``: the other
        options of ``rsched run cron`` (``ttl``, ``jitter``, ``starting_deadline``,
        ``broadcast``, ``on_lock_lost``, ``grace``). Checked here, naming the argument."""

        def deco(fn: F) -> F:
            cname = name or f"{fn.__module__}.{fn.__qualname__}".replace("<", "").replace(">", "")
            if cname in self.crons:
                raise errors.BadInput("@app.cron", f"{cname!r} is registered twice")
            d = CronDef(
                cname, fn, expr, tz, concurrency, misfire, shards, timeout, dialect, options
            )
            d.spec(["python"])  # checks every field now (bad input fails at import)
            self.crons[cname] = d
            fn.cron_name = cname  # type: ignore[attr-defined]
            return fn

        return deco

    # --- locks -----------------------------------------------------------------------
    def locked(self, name: str, ttl: Any = "30s", wait: float | None = None) -> Callable[[F], F]:
        """Run the function under the owned lock ``name`` (renewed while it runs);
        another holder makes the call raise :class:`rsched.LockHeld` (after ``wait``
        seconds, when given). Works on ``async def`` functions too."""
        from rsched.locks.lock import MIN_TTL_MS, check_wait

        validate.name(name, "@app.locked name")
        ttl_ms = duration_ms(ttl, "@app.locked ttl")
        if ttl_ms < MIN_TTL_MS:
            raise errors.BadInput("@app.locked ttl", f"must be at least {MIN_TTL_MS}ms")
        check_wait(wait)

        def lock() -> Any:
            from rsched.locks.lock import Lock

            return Lock(self.rs, name, ttl_ms=ttl_ms, wait=wait)

        def deco(fn: F) -> F:
            if inspect.iscoroutinefunction(fn):

                @functools.wraps(fn)
                async def alocked(*a: Any, **kw: Any) -> Any:
                    import asyncio

                    lk = lock()
                    await asyncio.to_thread(lk.acquire)
                    try:
                        return await fn(*a, **kw)
                    finally:
                        await asyncio.to_thread(lk.__exit__, None, None, None)

                return alocked  # type: ignore[return-value]

            @functools.wraps(fn)
            def locked_fn(*a: Any, **kw: Any) -> Any:
                with lock():
                    return fn(*a, **kw)

            return locked_fn  # type: ignore[return-value]

        return deco
