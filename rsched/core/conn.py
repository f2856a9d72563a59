"""Open a Redis client from :class:`~rsched.core.config.Settings`: redis-py, or for
one-shot commands the small :mod:`rsched.core.resp` client (no redis-py import)."""

from __future__ import annotations

import os
import sys
from functools import cache
from typing import TYPE_CHECKING, Any

from rsched.core.config import Settings
from rsched.core.errors import ConfigError, RedisUnavailable, map_error

if TYPE_CHECKING:  # pragma: no cover
    import redis


def pool_connection(pool: Any) -> Any:
    """A connection from a redis-py pool: ``get_connection()`` takes no arguments
    since redis-py 5.3 (and warns when given one); before, it needed a command name."""
    try:
        return pool.get_connection()
    except TypeError:
        return pool.get_connection("PING")


def _no_setinfo() -> dict[str, Any]:
    """redis-py's options that turn off its ``CLIENT SETINFO`` at connect:
    ``driver_info=None`` since redis-py 7.1 (``lib_name`` is deprecated there),
    ``lib_name=None, lib_version=None`` before."""
    try:
        import redis.driver_info  # noqa: F401
    except ImportError:
        return {"lib_name": None, "lib_version": None}
    return {"driver_info": None}


def check_settings_url(settings: Settings) -> None:
    """Refuse a malformed URL (ConfigError, exit 78) whoever built the settings: the
    CLI checked it already (naming where it came from); the library's
    ``Rsched.from_url`` and hand-made :class:`Settings` are checked here."""
    from rsched.core.config import check_url

    if settings.redis_url.partition("://")[0] in (
        "redis",
        "rediss",
        "unix",
        "redis+cluster",
        "rediss+cluster",
    ):
        check_url(settings.redis_url, "--redis-url")


def connect(
    settings: Settings, *, check: bool = True, socket_timeout: float | None = None
) -> redis.Redis:
    """A client with short timeouts and no hidden retries (callers decide how to retry).

    With ``check`` it PINGs once, so an unreachable server or a refused password
    surfaces here as :class:`RedisUnavailable` (exit 69) within the connect timeout.

    Redis Cluster: a ``redis+cluster://`` (``rediss+cluster://``) URL or
    ``[redis] cluster = true`` gives a :class:`redis.cluster.RedisCluster`; with
    ``cluster = "auto"`` (the default) the check asks the server (``HELLO``)
    and switches to the cluster client when it says ``mode cluster``.
    """
    check_settings_url(settings)
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    kwargs: dict[str, Any] = dict(
        decode_responses=True,
        socket_connect_timeout=settings.connect_timeout_s,
        socket_timeout=socket_timeout if socket_timeout is not None else settings.socket_timeout_s,
        retry=Retry(NoBackoff(), 0),
        client_name=None,
        # No CLIENT SETINFO on connect: one round trip less, and nothing for the
        # least-privilege ACL user to be refused (Redis 7.0 has no such command to
        # grant; Valkey and Redis >= 7.2 log every refusal). Every clone copies these.
        **_no_setinfo(),
    )
    if settings.password is not None:
        kwargs["password"] = settings.password
    if settings.username is not None:
        kwargs["username"] = settings.username
    if settings.redis_url.startswith("rediss://"):
        kwargs.update(tls_kwargs(settings))
    if settings.redis_url.startswith(SENTINEL_PREFIXES):
        return connect_sentinel(settings, kwargs, check)
    mode = cluster_mode(settings)
    url = plain_url(settings.redis_url)
    if mode is True:
        return _connect_cluster(settings, url, kwargs, check)
    try:
        client = redis.Redis.from_url(url, **kwargs)
    except ValueError as exc:
        raise RedisUnavailable(f"--redis-url {settings.safe_url}: {exc}") from None
    if check:
        try:
            enabled = _cluster_enabled(client) if mode is None else False
        except redis.RedisError as exc:
            err = map_error(exc)
            if isinstance(err, ConfigError):
                raise err from None
            where = settings.safe_url
            raise RedisUnavailable(f"cannot use Redis at {where}: {_short(err)}") from None
        if enabled:
            try:
                cluster = _connect_cluster(settings, url, kwargs, check)
            except RedisUnavailable:
                # A node of a cluster that is down (slots not covered, ...): the
                # node itself answers, with CLUSTERDOWN for data, and `doctor`
                # can say what is wrong.
                return client
            client.close()
            return cluster
    return client


def tls_kwargs(settings: Settings) -> dict[str, Any]:
    """redis-py's TLS options from ``--tls-*`` / ``[redis] tls_*`` / ``RSCHED_TLS_*``."""
    kw: dict[str, Any] = {}
    if settings.tls_ca:
        kw["ssl_ca_certs"] = settings.tls_ca
    if settings.tls_cert:
        kw["ssl_certfile"] = settings.tls_cert
    if settings.tls_key:
        kw["ssl_keyfile"] = settings.tls_key
    if settings.tls_insecure:
        kw["ssl_cert_reqs"] = "none"
        kw["ssl_check_hostname"] = False
    return kw


def cluster_mode(settings: Settings) -> bool | None:
    """True (cluster client), False (never), None (ask the server when connecting)."""
    if settings.redis_url.split("://", 1)[0].endswith("+cluster"):
        return True
    return settings.cluster


def plain_url(url: str) -> str:
    """``redis+cluster://h:p`` -> ``redis://h:p`` (what redis-py parses)."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme.endswith("+cluster"):
        return scheme[: -len("+cluster")] + "://" + rest
    return url


def _cluster_enabled(client: Any) -> bool:
    """Whether the server is a cluster node: ``HELLO`` says ``mode cluster`` (a
    connection command every rsched ACL user may run; without arguments it keeps
    the connection's protocol)."""
    import redis

    try:
        reply = client.execute_command("HELLO")
    except redis.ResponseError:  # a server without HELLO: not a cluster rsched supports
        client.ping()
        return False
    return hello_mode(reply) == "cluster"


def hello_mode(reply: Any) -> str | None:
    """The ``mode`` of a ``HELLO`` reply (a RESP2 list of pairs, or a dict)."""
    if isinstance(reply, dict):
        value = reply.get("mode", reply.get(b"mode"))
    elif isinstance(reply, list | tuple):
        pairs = dict(zip(reply[0::2], reply[1::2], strict=False))
        value = pairs.get("mode", pairs.get(b"mode"))
    else:
        return None
    return value.decode() if isinstance(value, bytes) else value


def _connect_cluster(settings: Settings, url: str, kwargs: dict[str, Any], check: bool) -> Any:
    """A :class:`redis.cluster.RedisCluster` from the URL's node (the others are
    discovered). Its only retries are the ones a cluster needs: following
    ``MOVED``/``ASK`` and, when a node is unreachable, refreshing the slot map
    and trying the slot's new primary (a failover), a bounded number of times."""
    import redis
    from redis.backoff import ExponentialBackoff
    from redis.retry import Retry

    RedisCluster = _failover_cluster_class()
    kw = dict(kwargs)
    kw.pop("client_name", None)
    kw.pop("db", None)
    # A failover takes about cluster-node-timeout plus an election: retry a
    # connection error with backoff for up to ~10 s, refreshing the slot map.
    kw["retry"] = Retry(ExponentialBackoff(cap=1.0, base=0.05), 12)
    try:
        client = RedisCluster.from_url(url, **kw)
    except ValueError as exc:
        raise RedisUnavailable(f"--redis-url {settings.safe_url}: {exc}") from None
    except IndexError:
        # redis-py < 5.1 when no node serves a slot (a cluster not set up yet): the
        # node itself, as a plain client, so that `doctor` can say so; every keyed
        # command is refused by the node (CLUSTERDOWN) as with newer redis-py.
        plain = redis.Redis.from_url(url, **{k: v for k, v in kwargs.items() if k != "db"})
        return _pinged(plain, settings) if check else plain
    except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
        err = map_error(exc)
        raise RedisUnavailable(
            f"cannot use Redis Cluster at {settings.safe_url}: {_short(err)}"
        ) from None
    client._rsched_clone_kwargs = (url, kw)  # for rsched.core.clients.clone()
    return _pinged(client, settings) if check else client


def _pinged(client: Any, settings: Settings) -> Any:
    """``client`` once a PING went through; else RedisUnavailable naming the cluster."""
    import redis

    try:
        client.ping()
    except redis.RedisError as exc:
        raise RedisUnavailable(
            f"cannot use Redis Cluster at {settings.safe_url}: {_short(map_error(exc))}"
        ) from None
    return client


#: How long a command waits for a slot whose primary is gone to get a new one
#: (a failover takes cluster-node-timeout plus an election: a few seconds).
FAILOVER_WAIT_S = 10.0


@cache
def failover_errors() -> tuple[type[Exception], ...]:
    """The errors a cluster command is sent again after (:class:`FailoverBackoff`):
    unreachable, CLUSTERDOWN / MASTERDOWN, TRYAGAIN, and ``ClusterError`` itself,
    redis-py's "TTL exhausted" (too many redirections: a slot being migrated)."""
    from redis import exceptions as rx

    return (rx.ConnectionError, rx.ClusterError, rx.TryAgainError)


class FailoverBackoff:
    """When a cluster command that met one of :func:`failover_errors` is sent again:
    :meth:`wait_s` is the pause before the next try (50 ms doubling to 0.5 s), or
    ``None`` to give up: after :data:`FAILOVER_WAIT_S`, or at once for a timeout (a
    node that took the command may have run it). Made only once a command failed;
    shared by the sync and asyncio cluster clients."""

    def __init__(self) -> None:
        import time

        self._deadline = time.monotonic() + FAILOVER_WAIT_S
        self._delay = 0.05

    def wait_s(self, exc: BaseException) -> float | None:
        import time

        from redis.exceptions import TimeoutError as RedisTimeout

        now = time.monotonic()
        if isinstance(exc, RedisTimeout) or now >= self._deadline:
            return None
        wait, self._delay = min(self._delay, self._deadline - now), min(self._delay * 2, 0.5)
        return wait


@cache
def _failover_cluster_class() -> Any:
    """redis-py's RedisCluster, whose commands ride out a failover.

    redis-py already refreshes its slot map and retries when a node is
    unreachable, but at once, a few times: while the dead primary's slots have
    no primary yet (``cluster-node-timeout`` plus an election) that fails. This
    client retries a command that could not reach its node, or was answered
    ``CLUSTERDOWN`` / ``TRYAGAIN`` / ``MASTERDOWN``, or that ran out of redirections
    (redis-py's "TTL exhausted": a slot being migrated answers ``TRYAGAIN`` to a
    multi-key script until all its keys have moved), with backoff for up to
    :data:`FAILOVER_WAIT_S` (:class:`FailoverBackoff`). It does not retry a timeout
    (a node that took the command may have run it), nor anything else. Pipelines
    are not retried (their callers have their own loops: consumers back off and
    carry on).
    """
    import time

    from redis.cluster import RedisCluster

    retryable = failover_errors()

    class FailoverCluster(RedisCluster):  # type: ignore[misc]
        def execute_command(self, *args: Any, **kwargs: Any) -> Any:
            backoff = None
            while True:
                try:
                    return super().execute_command(*args, **kwargs)
                except retryable as exc:
                    backoff = backoff or FailoverBackoff()
                    if (wait := backoff.wait_s(exc)) is None:
                        raise
                    time.sleep(wait)

    return FailoverCluster


def is_cluster(client: Any) -> bool:
    """Whether ``client`` is a redis-py cluster client (or its pipeline)."""
    rc = sys.modules.get("redis.cluster")
    return rc is not None and isinstance(client, rc.RedisCluster)


SENTINEL_PREFIXES = ("redis+sentinel://", "rediss+sentinel://")


def sentinel_options(
    settings: Settings, kwargs: dict[str, Any]
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """``(target, node options, sentinel options)`` of a Sentinel URL, the data
    nodes' options from ``kwargs`` (shared with :mod:`rsched.aio.conn`)."""
    from rsched.core.config import parse_sentinel_url

    target = parse_sentinel_url(settings.redis_url)
    node = dict(kwargs)
    if target.username:
        node["username"] = target.username
    if target.password:
        node["password"] = target.password
    sentinel_kw: dict[str, Any] = {
        "socket_connect_timeout": kwargs["socket_connect_timeout"],
        "socket_timeout": settings.connect_timeout_s,
        "decode_responses": True,
        **_no_setinfo(),
    }
    if settings.sentinel_password is not None:
        sentinel_kw["password"] = settings.sentinel_password
    if settings.sentinel_username is not None:
        sentinel_kw["username"] = settings.sentinel_username
    if target.tls:
        tls = {"ssl": True, **tls_kwargs(settings)}
        node.update(tls)
        sentinel_kw.update(tls)
    return target, node, sentinel_kw


def connect_sentinel(settings: Settings, kwargs: dict[str, Any], check: bool = True) -> Any:
    """The current master of a Sentinel service (``redis+sentinel://`` URL or
    ``[redis] sentinels``), with the data nodes' options in ``kwargs``.

    redis-py's SentinelConnectionPool asks the sentinels for the master on each
    new connection and drops idle connections when the answer changes; a
    connection error (the old master died) or a READONLY reply (it came back as a
    replica) closes the connection, so the caller's next command, on a fresh
    connection, reaches the promoted replica. No retry is hidden here: the
    callers' own reconnect loops carry on through a failover.
    """
    import redis
    from redis.sentinel import Sentinel

    target, node, sentinel_kw = sentinel_options(settings, kwargs)
    sentinel = Sentinel(list(target.sentinels), sentinel_kwargs=sentinel_kw)
    client = sentinel.master_for(target.service, db=target.db, **node)
    if check:
        try:
            client.ping()
        except redis.RedisError as exc:
            err = map_error(exc)
            if isinstance(err, ConfigError):
                raise err from None
            raise RedisUnavailable(
                f"cannot use Redis (Sentinel) at {settings.safe_url}: {_short(err)}"
            ) from None
    return client


def connect_oneshot(settings: Settings) -> Any:
    """A client for a command that does a few round trips and exits (``rsched add``).

    For plain ``redis://`` and ``unix://`` URLs it is :class:`rsched.core.resp.LiteRedis`,
    which starts without importing redis-py; anything else (TLS, URL options), or
    ``RSCHED_REDIS_PY=1`` in the environment, gets :func:`connect`. Either way an
    unreachable server or a refused password raises :class:`RedisUnavailable` here.
    """
    from rsched.core.resp import LiteRedis, parse_url

    check_settings_url(settings)
    mode = cluster_mode(settings)
    opts = None if os.environ.get("RSCHED_REDIS_PY") == "1" else parse_url(settings.redis_url)
    if opts is None or mode is True:
        return connect(settings)
    # As redis-py's from_url: what the URL says wins over the other settings.
    client = LiteRedis(
        host=opts.get("host"),
        port=opts.get("port", 6379),
        path=opts.get("path"),
        db=opts["db"],
        username=opts["username"] or settings.username,
        password=opts["password"] or settings.password,
        connect_timeout=settings.connect_timeout_s,
        socket_timeout=settings.socket_timeout_s,
        probe_cluster=mode is None,
    )
    try:
        client.connect()
    except Exception as exc:
        err = map_error(exc)
        if err is exc:
            raise
        if isinstance(err, ConfigError):
            raise err from None
        raise RedisUnavailable(f"cannot use Redis at {settings.safe_url}: {_short(err)}") from None
    if client.cluster_enabled:  # a cluster node: redis-py's cluster client routes by slot
        client.close()
        settings.cluster = True
        return connect(settings)
    return client


_PASSWORD_HINT = (
    "give the password in $RSCHED_REDIS_PASSWORD or [redis] password_file "
    "(and an ACL user in the URL, redis://USER@host, or [redis] username)"
)


def _short(exc: BaseException) -> str:
    text = str(exc)
    for prefix in ("Redis unreachable: ", "Redis refused authentication: "):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    text = text.splitlines()[0] if text else type(exc).__name__
    if "NOAUTH" in text or "must be called with the client already authenticated" in text:
        return f"the server requires a password and none was given: {_PASSWORD_HINT}"
    if "WRONGPASS" in text or "invalid username-password" in text or "invalid password" in text:
        return f"the server refused this user and password ({text.rstrip('.')}): check them; {_PASSWORD_HINT}"
    return text


def server_time_ms(client: Any) -> int:
    """The server's clock in ms (the one clock: every reader of ``TIME`` uses this)."""
    return time_reply_ms(client.execute_command("TIME"))


def time_reply_ms(reply: Any) -> int:
    """A ``TIME`` reply (``[seconds, microseconds]``, as text or numbers) in ms."""
    sec, usec = reply
    return int(sec) * 1000 + int(usec) // 1000
