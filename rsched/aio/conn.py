"""The ``redis.asyncio`` client of a URL, as :func:`rsched.core.conn.connect` makes
the synchronous one: the same URL forms and options.

* ``redis://``, ``rediss://``, ``unix://``: a plain client; with ``[redis]
  cluster = "auto"`` (the default) the first use asks the server (``HELLO``)
  and switches to the cluster client when it says ``mode cluster``
  (:func:`probe`);
* ``redis+cluster://`` (or ``cluster = true``): ``redis.asyncio.RedisCluster``,
  which routes each command, script calls included (by their KEYS: a queue's
  keys share one hash tag), to its slot's primary and follows ``MOVED``/``ASK``;
* ``redis+sentinel://`` (or ``[redis] sentinels``): the service's current
  master through ``redis.asyncio.sentinel.Sentinel``, asked again on each new
  connection (a failover is followed by the next command, as in the sync client).

No retries are hidden here but the ones a cluster needs (a failover or a slot
being migrated: the slot map refreshed and the command sent again, with backoff,
~10 s at most).
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from rsched.core.conn import (
    SENTINEL_PREFIXES,
    FailoverBackoff,
    _no_setinfo,
    check_settings_url,
    cluster_mode,
    failover_errors,
    hello_mode,
    plain_url,
    sentinel_options,
    tls_kwargs,
)
from rsched.core.errors import map_error

if TYPE_CHECKING:  # pragma: no cover
    from rsched.core.config import Settings


def _kwargs(settings: Settings) -> dict[str, Any]:
    kw: dict[str, Any] = dict(
        decode_responses=True,
        socket_connect_timeout=settings.connect_timeout_s,
        socket_timeout=settings.socket_timeout_s,
        **_no_setinfo(),
    )
    if settings.password is not None:
        kw["password"] = settings.password
    if settings.username is not None:
        kw["username"] = settings.username
    if settings.redis_url.startswith("rediss://"):
        kw.update(tls_kwargs(settings))
    return kw


def client_for(settings: Settings) -> tuple[Any, bool]:
    """``(client, ask)``: the client of the settings' URL; ``ask``: whether the
    server must be asked if it is a cluster node (:func:`probe`) before use."""
    from redis import asyncio as aredis

    check_settings_url(settings)
    kw = _kwargs(settings)
    url = settings.redis_url
    if url.startswith(SENTINEL_PREFIXES):
        return _sentinel(settings, kw), False
    mode = cluster_mode(settings)
    if mode is True:
        return _cluster(plain_url(url), kw), False
    return aredis.Redis.from_url(url, **kw), mode is None


def _cluster(url: str, kw: dict[str, Any]) -> Any:
    kw = dict(kw)
    kw.pop("db", None)
    return _failover_cluster_class().from_url(url, **kw)


@cache
def _failover_cluster_class() -> Any:
    """redis-py's asyncio RedisCluster, whose commands ride out a failover and a
    slot migration as the synchronous client's do (:func:`rsched.core.conn.connect`).

    Its own retries are immediate and few (a dead primary's slots have no primary
    for cluster-node-timeout plus an election; a migrating slot answers ``TRYAGAIN``
    to a multi-key script until its keys have moved, and "TTL exhausted" follows
    within half a second). This one sends a command that could not reach its node,
    or was answered ``CLUSTERDOWN`` / ``TRYAGAIN`` / ``MASTERDOWN`` or ran out of
    redirections, again with backoff for up to
    :data:`~rsched.core.conn.FAILOVER_WAIT_S`; never after a timeout (the node may
    have run it)."""
    import asyncio

    from redis.asyncio.cluster import RedisCluster

    retryable = failover_errors()

    class FailoverCluster(RedisCluster):  # type: ignore[misc]
        async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
            backoff = None
            while True:
                try:
                    return await super().execute_command(*args, **kwargs)
                except retryable as exc:
                    backoff = backoff or FailoverBackoff()
                    if (wait := backoff.wait_s(exc)) is None:
                        raise
                    await asyncio.sleep(wait)

    return FailoverCluster


def _sentinel(settings: Settings, kw: dict[str, Any]) -> Any:
    from redis.asyncio.sentinel import Sentinel

    target, node, sentinel_kw = sentinel_options(settings, kw)
    sentinel = Sentinel(list(target.sentinels), sentinel_kwargs=sentinel_kw)
    return sentinel.master_for(target.service, db=target.db, **node)


async def probe(settings: Settings, client: Any) -> Any:
    """``client``, or the cluster client of the same URL when the server says
    ``mode cluster`` (``HELLO``; a server without it is no cluster)."""
    import redis

    try:
        reply = await client.execute_command("HELLO")
    except redis.ResponseError:
        return client
    except Exception as exc:
        raise map_error(exc) from exc
    if hello_mode(reply) != "cluster":
        return client
    await client.aclose()
    return _cluster(plain_url(settings.redis_url), _kwargs(settings))
