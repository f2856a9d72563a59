"""The library entry point: one object per Redis connection and namespace."""

from __future__ import annotations

import builtins
import os
import socket
from typing import TYPE_CHECKING, Any

from rsched.keys import Keys
from rsched.scripts import Scripts

if TYPE_CHECKING:  # pragma: no cover
    import redis

    from rsched.config import Settings
    from rsched.tasks import AddResult, QueueStats, Task

#: Execution records kept per queue / cron / lock (a capped stream).
HISTORY_MAXLEN = 10_000
#: Max attempts for tasks added without --max-attempts, unless the queue's config says otherwise.
DEFAULT_MAX_ATTEMPTS = 5


def host_id() -> str:
    return socket.gethostname()


class Rsched:
    """Connection, namespace and Lua core, plus the queue operations.

    >>> rs = Rsched.from_url("redis://localhost:6379/0")
    >>> rs.add("order.close", "1001", delay="30m")
    """

    def __init__(
        self,
        client: redis.Redis,
        namespace: str = "rsched",
        *,
        settings: Settings | None = None,
        history_maxlen: int = HISTORY_MAXLEN,
    ):
        from rsched import validate

        validate.name(namespace, "namespace")
        # Typed loosely: redis-py's stubs return unions of bytes/str/awaitables.
        self.redis: Any = client
        self.namespace = namespace
        self.keys = Keys(namespace)
        self.scripts = Scripts(client)
        self.settings = settings
        self.history_maxlen = history_maxlen

    @classmethod
    def from_url(cls, url: str, namespace: str = "rsched", **kwargs: Any) -> Rsched:
        from rsched.config import Settings
        from rsched.conn import connect

        s = Settings(redis_url=url, namespace=namespace)
        return cls(connect(s), namespace, settings=s, **kwargs)

    @classmethod
    def from_settings(cls, settings: Settings, **kwargs: Any) -> Rsched:
        from rsched.conn import connect

        return cls(connect(settings), settings.namespace, settings=settings, **kwargs)

    def __repr__(self) -> str:
        return f"Rsched(namespace={self.namespace!r})"

    def close(self) -> None:
        """Close the client's connections (redis-py leaves them to the garbage
        collector otherwise, which may find them only much later)."""
        close = getattr(self.redis, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> Rsched:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def now_ms(self) -> int:
        """The Redis server's clock, in ms (the one clock)."""
        from rsched.conn import server_time_ms

        return server_time_ms(self.redis)

    def queue_option(self, queue: str, key: str, default: Any = None) -> Any:
        if self.settings is None:
            return default
        return self.settings.queue_options(queue).get(key, default)

    def default_max_attempts(self, queue: str) -> int:
        return int(self.queue_option(queue, "max_attempts", DEFAULT_MAX_ATTEMPTS))

    @staticmethod
    def identity() -> dict[str, Any]:
        return {"host": host_id(), "pid": os.getpid()}

    # --- the queue operations (implemented in rsched.tasks) -------------------
    def add(self, task_type: str, task_id: str, **kw: Any) -> AddResult:
        from rsched import tasks

        return tasks.add(self, task_type, task_id, **kw)

    def add_many(self, specs: Any, **kw: Any) -> builtins.list[AddResult]:
        from rsched import tasks

        return tasks.add_many(self, specs, **kw)

    def cancel(self, task_type: str, task_id: str, queue: str = "default") -> str:
        from rsched import tasks

        return tasks.cancel(self, task_type, task_id, queue)

    def show(self, task_type: str, task_id: str, queue: str = "default") -> Task:
        from rsched import tasks

        return tasks.show(self, task_type, task_id, queue)

    def list(self, queue: str = "default", **kw: Any) -> builtins.list[Task]:
        from rsched import tasks

        return tasks.list_tasks(self, queue, **kw)

    def queues(self) -> builtins.list[QueueStats]:
        from rsched import tasks

        return tasks.queue_stats(self)

    def requeue_stale(self, queue: str | None = None, dry_run: bool = False) -> dict[str, int]:
        from rsched import tasks

        return tasks.requeue_stale(self, queue, dry_run=dry_run)

    def retry(self, task_type: str, task_id: str, queue: str = "default") -> int:
        from rsched import tasks

        return tasks.retry(self, queue, [(task_type, task_id)])

    def retry_all(self, queue: str | None = None) -> int:
        from rsched import tasks

        return tasks.retry_all(self, queue)

    def purge_dead(self, queue: str | None = None, older_than_ms: int | None = None) -> int:
        from rsched import tasks

        return tasks.purge_dead(self, queue, older_than_ms)

    def pause_queue(self, queue: str) -> None:
        from rsched import tasks

        tasks.pause(self, queue)

    def resume_queue(self, queue: str) -> None:
        from rsched import tasks

        tasks.resume(self, queue)

    def consumer(self, **kw: Any) -> Any:
        from rsched.consumer import Consumer

        return Consumer(self, **kw)

    def lock(self, name: str, **kw: Any) -> Any:
        from rsched.locks import Lock

        return Lock(self, name, **kw)
