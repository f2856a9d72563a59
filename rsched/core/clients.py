"""Clones of a Redis client: the one way a loop gets connections of its own.

A blocking call (``BZPOPMIN`` of the consumer's waker, the cron runner's wait,
a Pub/Sub subscription of ``run expired``) must not share the context's
connections: it holds one for seconds, and needs a ``socket_timeout`` longer
than its block (the context's is the short one of ordinary commands). And a
loop stopping shuts such a client's sockets down under the blocked call
(:func:`close`), which ends it at once.

* :func:`clone`: another client to the same server(s), with its own pool and
  some connection options changed (``socket_timeout``, ``decode_responses``,
  ``db``...): a plain client gets a pool of the same connection class (TLS or
  not) with the same options; a cluster client another cluster client
  (:func:`_cluster_clone`).
* :func:`node_options` / :func:`node_client`: a plain client to one node of a
  cluster (``run expired`` subscribes on every primary), with the cluster
  client's connection options minus its cluster hooks and retries.
* :func:`close`: disconnect every connection of a client, plain or cluster;
* :class:`Interruptible`: a client for blocking calls that another thread ends at
  once, whenever it comes (a loop's stop).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from rsched.core.conn import is_cluster
from rsched.core.errors import RedisUnavailable

#: Connection options of a cluster client's node that belong to the cluster client.
_CLUSTER_ONLY_KWARGS = (
    "redis_connect_func",
    "oss_cluster_maint_notifications_handler",
    "maint_notifications_config",
    "himport_registry",
    "retry",
)


def clone(client: Any, *, max_connections: int | None = None, **options: Any) -> Any:
    """Another client to the same server(s) as ``client``, with its own connections
    and ``options`` (connection keyword arguments, e.g. ``socket_timeout``) changed.
    ``max_connections`` caps a plain client's pool. A cluster client's clone
    takes ``socket_timeout`` only."""
    if is_cluster(client):
        return _cluster_clone(client, socket_timeout=options["socket_timeout"])
    kw, connection_class = options_of(client)
    return node_client({**kw, **options}, connection_class, max_connections)


def options_of(client: Any) -> tuple[dict[str, Any], Any]:
    """A plain client's connection options (a copy) and connection class."""
    pool = client.connection_pool
    return dict(pool.connection_kwargs), pool.connection_class


def node_client(
    options: dict[str, Any], connection_class: Any, max_connections: int | None = None
) -> Any:
    """A plain client from connection ``options`` and ``connection_class``."""
    import redis

    kw = dict(options)
    if max_connections is not None:
        kw["max_connections"] = max_connections
    return redis.Redis(
        connection_pool=redis.ConnectionPool(connection_class=connection_class, **kw)
    )


def node_options(cluster: Any) -> tuple[dict[str, Any], Any]:
    """Plain-client connection options (and class: TLS or not) for the nodes of
    redis-py cluster client ``cluster``, without its cluster hooks and retries,
    host and port (give those per node), with ``decode_responses`` off."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    primaries = cluster.get_primaries()
    if not primaries:
        raise RedisUnavailable("the cluster client knows no primary node")
    pool = primaries[0].redis_connection.connection_pool
    kw = {
        k: v
        for k, v in pool.connection_kwargs.items()
        if k not in _CLUSTER_ONLY_KWARGS and not k.startswith(("orig_", "_"))
    }
    kw.pop("client_name", None)
    kw.pop("host", None)
    kw.pop("port", None)
    kw.update(decode_responses=False, db=0, retry=Retry(NoBackoff(), 0))
    return kw, pool.connection_class


def close(client: Any) -> None:
    """Disconnect every connection of ``client`` (shuts the socket down under a
    blocked call); best effort."""
    try:
        if is_cluster(client):
            client.disconnect_connection_pools()
        else:
            client.connection_pool.disconnect()
    except Exception:  # noqa: BLE001 - best effort, at exit
        pass


class Interruptible:
    """A client for one thread's blocking calls (``XREAD BLOCK``) that another thread
    ends at once with :meth:`close`, whenever it comes: before the call (it does not
    start), during it (its socket is shut down), or just as it starts (redis-py
    reconnects a shut connection on its next send, so :meth:`close` keeps shutting
    the sockets down until the call in flight has returned). ``make``: builds the
    client, on first use."""

    def __init__(self, make: Callable[[], Any]):
        self._make = make
        self._client: Any = None
        self._busy = threading.Event()
        self.closed = False

    def call(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(client)``, or None once closed (also when closing ended it)."""
        self._busy.set()
        try:
            if self.closed:
                return None
            if self._client is None:
                self._client = self._make()
            try:
                return fn(self._client)
            except Exception:
                if self.closed:
                    return None
                raise
        finally:
            self._busy.clear()

    def close(self, within_s: float = 5.0) -> None:
        """End the call in flight (if any) and every later one."""
        self.closed = True
        deadline = time.monotonic() + within_s
        while True:
            if self._client is not None:
                close(self._client)
            if not self._busy.is_set() or time.monotonic() > deadline:
                return
            time.sleep(0.02)


def _cluster_clone(client: Any, *, socket_timeout: float) -> Any:
    """Another cluster client to the same cluster, with its own connections and
    ``socket_timeout`` (the consumer's blocking wake-up listeners: plain
    redis-py, whose error on a shut socket ends the listener's call at once)."""
    from redis.cluster import RedisCluster

    made = getattr(client, "_rsched_clone_kwargs", None)
    if made is not None:
        url, kw = made
        return RedisCluster.from_url(url, **{**kw, "socket_timeout": socket_timeout})
    # A client the library user built: its nodes and plain connection options.
    kw = {
        k: v
        for k, v in client.nodes_manager.connection_kwargs.items()
        if k not in ("redis_connect_func", "oss_cluster_maint_notifications_handler")
        and not k.startswith("_")
    }
    kw["socket_timeout"] = socket_timeout
    nodes = list(client.nodes_manager.startup_nodes.values())
    return RedisCluster(startup_nodes=nodes, **kw)
