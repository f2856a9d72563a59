"""``--wait-replicas N``: after a write, Redis ``WAIT N timeout`` until N replicas
have it, to narrow (not close) what a failover can lose.

Redis replicates asynchronously: the master acknowledges a write before any
replica has it, so a master that dies right after an ``rsched add`` or a lock
acquisition can take that write with it when Sentinel (or Cluster) promotes a
replica. ``WAIT`` blocks the connection until N replicas acknowledged every
write that connection made, or the timeout passes, and answers how many did.

It must run on the connection that made the write (a connection whose last
write is older returns at once), so:

* :func:`rsched.lua.calls.script_and_wait` sends the Lua call and ``WAIT`` in one pipeline (one
  connection), for callers that share a client between threads (cron runners,
  the library's :class:`~rsched.locks.lock.Lock`);
* :func:`wait` is a plain ``WAIT`` for single-threaded callers whose last write
  was on the pool's most recently released connection (``rsched add``,
  ``rsched exec`` before its watchdog starts).

A shortfall is not an error of the write: the write is done and stays done.
``rsched add`` reports it and exits 1 (a producer retries: adding the same task
again keeps it, or runs it once more if a consumer already ran it, which
at-least-once handlers tolerate anyway); a lock holder reports it and goes on (giving up the lock
would skip the tick everywhere).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from rsched.core import errors


class Context(Protocol):
    """What this module needs of :class:`rsched.context.Context` (core knows no domain)."""

    redis: Any
    scripts: Any
    settings: Any


DEFAULT_TIMEOUT_MS = 1000


@dataclass(frozen=True)
class WaitPolicy:
    """How many replicas to wait for, and for how long (0 replicas: don't wait)."""

    replicas: int = 0
    timeout_ms: int = DEFAULT_TIMEOUT_MS

    def __bool__(self) -> bool:
        return self.replicas > 0

    def shortfall(self, acked: int, what: str) -> str | None:
        """A message when fewer than ``replicas`` acknowledged ``what``, else None."""
        if acked >= self.replicas:
            return None
        return (
            f"{what} is written, but only {acked} of {self.replicas} replicas acknowledged it "
            f"within {self.timeout_ms} ms (a failover now could lose it)"
        )


class ReplicasShort(errors.RschedError):
    """The write is done, but fewer replicas than asked for acknowledged it (exit 1)."""

    exit_code = errors.ExitCode.FAILURE

    def __init__(self, message: str, acked: int, wanted: int):
        super().__init__(message)
        self.acked = acked
        self.wanted = wanted


def policy(
    rs: Context | None, replicas: int | None = None, timeout_ms: int | None = None
) -> WaitPolicy:
    """``--wait-replicas`` / ``--wait-replicas-timeout``, else ``[redis] wait_replicas`` /
    ``wait_replicas_timeout``, else no waiting."""
    return policy_of(rs.settings if rs is not None else None, replicas, timeout_ms)


def policy_of(
    settings: Any, replicas: int | None = None, timeout_ms: int | None = None
) -> WaitPolicy:
    """:func:`policy` from :class:`~rsched.core.config.Settings` (or None): the one
    place the options and the settings are combined (the CLI's commands use it too)."""
    s = settings
    n = replicas if replicas is not None else (s.wait_replicas if s is not None else 0)
    t = (
        timeout_ms
        if timeout_ms is not None
        else (s.wait_replicas_timeout_ms if s is not None else DEFAULT_TIMEOUT_MS)
    )
    if n < 0:
        raise errors.BadInput("--wait-replicas", "must be a whole number >= 0")
    if t <= 0:
        raise errors.BadInput("--wait-replicas-timeout", "must be a positive duration")
    return WaitPolicy(int(n), int(t))


def wait(client: Any, pol: WaitPolicy, keys: list[str] | None = None) -> int:
    """``WAIT`` on the client's (single-threaded) connection; replicas that acknowledged.

    On Redis Cluster, ``WAIT`` goes to the primaries of ``keys`` (what was just
    written), or to every primary without them; the answer is the smallest."""
    from rsched.core.conn import is_cluster
    from rsched.core.errors import map_error

    try:
        if is_cluster(client):
            # WAIT counts the writes of its own connection, so it must reach each
            # node on the connection that wrote there: a node's pool hands back
            # its most recently released connection (LIFO), the one that wrote
            # last in this thread.
            if keys:
                nodes = {n.name: n for n in (client.get_node_from_key(k) for k in keys)}
                targets = list(nodes.values())
            else:
                targets = client.get_primaries()
            return min(
                int(client.execute_command("WAIT", pol.replicas, pol.timeout_ms, target_nodes=n))
                for n in targets
            )
        return int(client.execute_command("WAIT", pol.replicas, pol.timeout_ms))
    except Exception as exc:
        mapped = map_error(exc)
        if mapped is exc:
            raise
        raise mapped from exc
