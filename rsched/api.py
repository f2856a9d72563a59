"""The library's facade: :class:`Rsched`, a :class:`~rsched.context.Context`
with the library's operations on it.

This is the only module that imports every domain (lazily, so that a one-shot
command pays only for what it uses); domain code never imports it.
"""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, Any

from rsched.context import Context

if TYPE_CHECKING:  # pragma: no cover
    from rsched.core.config import Settings
    from rsched.queue.model import AddResult, QueueStats, Task


class Rsched(Context):
    """Connection, namespace and Lua core, plus the queue operations.

    >>> rs = Rsched.from_url("redis://localhost:6379/0")
    >>> rs.add("order.close", "1001", delay="30m")
    """

    @classmethod
    def from_url(cls, url: str, namespace: str = "rsched", **kwargs: Any) -> Rsched:
        from rsched.core.config import Settings
        from rsched.core.conn import connect

        s = Settings(redis_url=url, namespace=namespace)
        return cls(connect(s), namespace, settings=s, **kwargs)

    @classmethod
    def from_settings(cls, settings: Settings, **kwargs: Any) -> Rsched:
        from rsched.core.conn import connect

        return cls(connect(settings), settings.namespace, settings=settings, **kwargs)

    def __enter__(self) -> Rsched:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the queue operations (implemented in rsched.queue.ops) -------------------
    def add(self, task_type: str, task_id: str, **kw: Any) -> AddResult:
        from rsched.queue import ops as tasks

        return tasks.add(self, task_type, task_id, **kw)

    def add_many(self, specs: Any, **kw: Any) -> builtins.list[AddResult]:
        from rsched.queue import bulk

        return bulk.add_many(self, specs, **kw)

    def cancel(self, task_type: str, task_id: str, queue: str = "default") -> str:
        from rsched.queue import ops as tasks

        return tasks.cancel(self, task_type, task_id, queue)

    def show(self, task_type: str, task_id: str, queue: str = "default") -> Task:
        from rsched.queue import ops as tasks

        return tasks.show(self, task_type, task_id, queue)

    def list(self, queue: str = "default", **kw: Any) -> builtins.list[Task]:
        from rsched.queue import ops as tasks

        return tasks.list_tasks(self, queue, **kw)

    def queues(self) -> builtins.list[QueueStats]:
        from rsched.queue import ops as tasks

        return tasks.queue_stats(self)

    def requeue_stale(self, queue: str | None = None, dry_run: bool = False) -> dict[str, int]:
        from rsched.queue import ops as tasks

        return tasks.requeue_stale(self, queue, dry_run=dry_run)

    def retry(self, task_type: str, task_id: str, queue: str = "default") -> int:
        from rsched.queue import ops as tasks

        return tasks.retry(self, queue, [(task_type, task_id)])

    def retry_all(self, queue: str | None = None) -> int:
        from rsched.queue import ops as tasks

        return tasks.retry_all(self, queue)

    def purge_dead(self, queue: str | None = None, older_than_ms: int | None = None) -> int:
        from rsched.queue import ops as tasks

        return tasks.purge_dead(self, queue, older_than_ms)

    def pause_queue(self, queue: str) -> None:
        from rsched.queue import ops as tasks

        tasks.pause(self, queue)

    def resume_queue(self, queue: str) -> None:
        from rsched.queue import ops as tasks

        tasks.resume(self, queue)

    def events(self, limit: int = 50) -> builtins.list[dict[str, Any]]:
        """The ``limit`` newest events, newest first: the objects of ``rsched events
        --json`` (SPEC fields, ``delivery``, ``attempts``)."""
        from rsched.tools.events import recent

        return recent(self, limit)

    def consumer(self, **kw: Any) -> Any:
        from rsched.consumer.loop import Consumer

        return Consumer(self, **kw)

    def lock(self, name: str, **kw: Any) -> Any:
        from rsched.locks.lock import Lock

        return Lock(self, name, **kw)

    # --- crons -------------------------------------------------------------------------------
    def trigger(
        self, name: str, wait: bool = False, timeout_ms: int | None = None
    ) -> dict[str, Any]:
        """Run cron ``name`` now through its live runners (``rsched trigger``): a dict
        with ``name``, ``id``, ``status``, ``host``, ``token``, ``triggered_by``, and with
        ``wait`` ``result``, ``exit_code``, ``error``, ``timed_out``. Raises NotFound
        (unknown, no live runner, not taken in time) or Conflict (paused, forbid and
        running)."""
        from rsched.cron import trigger as trig

        return trig.trigger(self, name, wait=wait, timeout_ms=timeout_ms)
