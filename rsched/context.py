"""The context every domain function receives: one Redis client and namespace.

A :class:`Context` holds the client, the key builder, the Lua core, the
settings and the server clock. Domain code (``rsched.queue``, the loops,
``rsched.locks``) takes one as its first argument and imports nothing above
``rsched.core`` and ``rsched.lua``; the facade :class:`rsched.api.Rsched` is a
Context with the library's methods on top, and is the only module that
imports every domain.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from rsched.core import validate
from rsched.core.defaults import DEFAULT_MAX_ATTEMPTS, HISTORY_MAXLEN, host_id
from rsched.core.keys import Keys
from rsched.lua.loader import Scripts

if TYPE_CHECKING:  # pragma: no cover
    import redis

    from rsched.core.config import Settings


class Context:
    """Connection, namespace, keys, Lua core, settings and the server clock."""

    def __init__(
        self,
        client: redis.Redis,
        namespace: str = "rsched",
        *,
        settings: Settings | None = None,
        history_maxlen: int = HISTORY_MAXLEN,
    ):
        validate.name(namespace, "namespace")
        # Typed loosely: redis-py's stubs return unions of bytes/str/awaitables.
        self.redis: Any = client
        self.namespace = namespace
        self.keys = Keys(namespace)
        self.scripts = Scripts(client)
        self.settings = settings
        self.history_maxlen = history_maxlen

    def __repr__(self) -> str:
        return f"{type(self).__name__}(namespace={self.namespace!r})"

    def close(self) -> None:
        """Close the client's connections (redis-py leaves them to the garbage
        collector otherwise, which may find them only much later)."""
        close = getattr(self.redis, "close", None)
        if close is not None:
            close()

    def now_ms(self) -> int:
        """The Redis server's clock, in ms (the one clock)."""
        from rsched.core.conn import server_time_ms

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
