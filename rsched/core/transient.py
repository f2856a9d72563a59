"""The errors that mean "Redis is away for now": loops and bulk writers ride
them out by retrying. Imports redis-py (keep it off the one-shot paths)."""

from __future__ import annotations

import redis

from rsched.core.errors import RedisUnavailable

#: Errors a loop (or a bulk writer) rides out by retrying: the server blinked,
#: restarted, is loading its data, is failing over (Sentinel or Cluster), or is
#: full (``maxmemory`` reached with ``noeviction``: writes are refused until memory
#: is freed; a refused Lua script wrote nothing, so trying it again is safe).
TRANSIENT: tuple[type[Exception], ...] = (
    RedisUnavailable,  # RedisFull (out of memory, mapped) is one
    redis.exceptions.OutOfMemoryError,  # the same, from a command outside a script
    redis.ConnectionError,  # BusyLoadingError (the server loading its data) is one
    redis.TimeoutError,
    redis.exceptions.ReadOnlyError,  # a replica after a failover, until we follow it
    redis.exceptions.ClusterDownError,  # MasterDownError is one
    redis.exceptions.ClusterError,  # "TTL exhausted": redirected (ASK/TRYAGAIN) while a slot moves
    redis.exceptions.TryAgainError,
)
