"""A throwaway namespace on a server and the ``rsched`` processes run in it: what
``rsched bench`` and ``rsched demo`` share (the environment of their child
processes, the servers whose figures count, deleting the namespace afterwards).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rsched.core.conn import is_cluster

if TYPE_CHECKING:  # pragma: no cover
    from rsched.api import Rsched
    from rsched.core.config import Settings


def namespace_keys(rs: Rsched, namespace: str, limit: int | None = None) -> list[str]:
    """Keys of ``namespace`` (SCAN, never KEYS); stops after ``limit``."""
    out: list[str] = []
    for k in rs.redis.scan_iter(match=f"{namespace}:*", count=1000):
        out.append(k)
        if limit is not None and len(out) >= limit:
            break
    return out


def delete_namespace(rs: Rsched, namespace: str) -> int:
    n = 0
    batch: list[str] = []
    for k in rs.redis.scan_iter(match=f"{namespace}:*", count=1000):
        batch.append(k)
        if len(batch) >= 500:
            n += int(rs.redis.unlink(*batch))
            batch = []
    if batch:
        n += int(rs.redis.unlink(*batch))
    return n


def child_env(
    settings: Settings, namespace: str, workdir: str, *, embedded: bool
) -> dict[str, str]:
    """The environment of the ``rsched`` processes a bench or demo starts: the
    same server, credentials, TLS files and config file as this process (the
    config's path made absolute: they run in ``workdir``), none of the caller's
    other ``RSCHED_*`` variables; an embedded server's run sees no config file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RSCHED_") and k != "REDIS_URL"}
    env.update(
        {
            "RSCHED_REDIS_URL": settings.redis_url,
            "RSCHED_NAMESPACE": namespace,
            "NO_COLOR": "1",
        }
    )
    if embedded:
        env["XDG_CONFIG_HOME"] = os.path.join(workdir, "xdg")  # no user config
        return env
    if settings.password is not None:
        env["RSCHED_REDIS_PASSWORD"] = settings.password
    if settings.config_path is not None:
        env["RSCHED_CONFIG"] = str(Path(settings.config_path).resolve())
    if settings.cluster is not None:
        env["RSCHED_REDIS_CLUSTER"] = "true" if settings.cluster else "false"
    for var in ("RSCHED_TLS_CA", "RSCHED_TLS_CERT", "RSCHED_TLS_KEY", "RSCHED_SENTINEL_PASSWORD"):
        if os.environ.get(var):
            env[var] = os.environ[var]
    return env


def primaries(client: Any) -> list[tuple[str, Any]]:
    """(name, plain client) of every server whose figures count: each primary of
    a Redis Cluster (redis-py sends INFO, TIME, MONITOR to one node only), else
    the one server."""
    if not is_cluster(client):
        return [("server", client)]
    return sorted(
        ((n.name, client.get_redis_connection(n)) for n in client.get_primaries()),
        key=lambda t: t[0],
    )


def node_of(client: Any, key: str) -> tuple[str, Any]:
    """(name, plain client) of the primary that holds ``key``'s slot."""
    if not is_cluster(client):
        return ("server", client)
    node = client.get_node_from_key(key)
    return node.name, client.get_redis_connection(node)
