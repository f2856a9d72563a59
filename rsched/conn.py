"""Open a Redis client from :class:`~rsched.config.Settings`: redis-py, or for
one-shot commands the small :mod:`rsched.resp` client (no redis-py import)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from rsched.config import Settings
from rsched.errors import RedisUnavailable
from rsched.scripts import map_error

if TYPE_CHECKING:  # pragma: no cover
    import redis


def connect(
    settings: Settings, *, check: bool = True, socket_timeout: float | None = None
) -> redis.Redis:
    """A client with short timeouts and no hidden retries (callers decide how to retry).

    With ``check`` it PINGs once, so an unreachable server or a refused password
    surfaces here as :class:`RedisUnavailable` (exit 69) within the connect timeout.
    """
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    kwargs: dict[str, Any] = dict(
        decode_responses=True,
        socket_connect_timeout=settings.connect_timeout_s,
        socket_timeout=socket_timeout if socket_timeout is not None else settings.socket_timeout_s,
        retry=Retry(NoBackoff(), 0),
        client_name=None,
    )
    if settings.password is not None:
        kwargs["password"] = settings.password
    if settings.username is not None:
        kwargs["username"] = settings.username
    if settings.redis_url.startswith("rediss://"):
        if settings.tls_ca:
            kwargs["ssl_ca_certs"] = settings.tls_ca
        if settings.tls_cert:
            kwargs["ssl_certfile"] = settings.tls_cert
        if settings.tls_key:
            kwargs["ssl_keyfile"] = settings.tls_key
        if settings.tls_insecure:
            kwargs["ssl_cert_reqs"] = "none"
            kwargs["ssl_check_hostname"] = False
    try:
        client = redis.Redis.from_url(settings.redis_url, **kwargs)
    except ValueError as exc:
        raise RedisUnavailable(f"--redis-url {settings.safe_url}: {exc}") from None
    if check:
        try:
            client.ping()
        except redis.RedisError as exc:
            err = map_error(exc)
            where = settings.safe_url
            raise RedisUnavailable(f"cannot use Redis at {where}: {_short(err)}") from None
    return client


def connect_oneshot(settings: Settings) -> Any:
    """A client for a command that does a few round trips and exits (``rsched add``).

    For plain ``redis://`` and ``unix://`` URLs it is :class:`rsched.resp.LiteRedis`,
    which starts without importing redis-py; anything else (TLS, URL options), or
    ``RSCHED_REDIS_PY=1`` in the environment, gets :func:`connect`. Either way an
    unreachable server or a refused password raises :class:`RedisUnavailable` here.
    """
    from rsched.resp import LiteRedis, parse_url

    opts = None if os.environ.get("RSCHED_REDIS_PY") == "1" else parse_url(settings.redis_url)
    if opts is None:
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
    )
    try:
        client.connect()
    except Exception as exc:
        err = map_error(exc)
        if err is exc:
            raise
        raise RedisUnavailable(f"cannot use Redis at {settings.safe_url}: {_short(err)}") from None
    return client


def _short(exc: BaseException) -> str:
    text = str(exc)
    for prefix in ("Redis unreachable: ", "Redis refused authentication: "):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    return text.splitlines()[0] if text else type(exc).__name__


def server_time_ms(client: Any) -> int:
    sec, usec = client.time()
    return int(sec) * 1000 + int(usec) // 1000
