"""Partitioned queues: one logical queue spread over N hash tags.

A queue with ``partitions = N`` (``[queues.Q]`` in the config file, or
``--partitions N`` on ``add`` / ``run consumer``) is stored as N queues named
``Q#0`` ... ``Q#N-1`` (see :mod:`rsched.core.keys`), each with its own hash tag, so
that on Redis Cluster a big queue uses every primary. A task's partition is
``crc32("TYPE ID") % N``, so ``cancel``, ``show`` and ``retry`` find it again.

The count must be the same for every producer and consumer: it is stored in
the ``{ns}:queue-config`` hash when a queue is first used with ``N > 1`` and
read from there by everyone; asking for another count is refused
(:class:`~rsched.core.errors.ConfigError`, exit 78) naming the stored one. A queue
that already holds tasks, or has live consumers, unpartitioned cannot become
partitioned (its tasks would be in no partition; its consumers would not
watch the partitions).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rsched.core import keys as K
from rsched.core.errors import BadInput, ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from rsched.context import Context

#: Most partitions a queue may have (each is a hash tag, a key set and a waker).
MAX_PARTITIONS = 1024


def check_count(value: Any, field: str = "--partitions") -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if isinstance(value, bool) or n < 1 or n > MAX_PARTITIONS or str(n) != str(value).strip():
        raise BadInput(field, f"{value!r} is not a whole number from 1 to {MAX_PARTITIONS}")
    return n


def _cache(rs: Context) -> dict[str, int]:
    cache = getattr(rs, "_partition_counts", None)
    if cache is None:
        cache = {}
        rs._partition_counts = cache  # type: ignore[attr-defined]
    return cache


def count(rs: Context, queue: str, want: int | None = None) -> int:
    """The agreed partition count of ``queue`` (1: not partitioned).

    ``want`` (a ``--partitions`` flag), else the config file's
    ``[queues.Q] partitions``, is checked against the count stored in Redis;
    a first use with ``want > 1`` stores it. (Plain ``execute_command``: the
    one-shot client of :mod:`rsched.core.resp` has no command helpers.)"""
    cache = _cache(rs)
    if want is None:
        cfg = rs.queue_option(queue, "partitions")
        want = check_count(cfg, f"queues.{queue}.partitions") if cfg is not None else None
    got = cache.get(queue)
    if got is None:
        stored = rs.redis.execute_command("HGET", rs.keys.queue_config, queue)
        if stored is None and want is not None and want > 1:
            q = rs.keys.queue(queue)
            if rs.redis.execute_command("EXISTS", q.tasks):
                raise ConfigError(
                    f"queue {queue} already holds tasks unpartitioned; "
                    f"it cannot become {want} partitions (use a new queue name)"
                )
            if rs.redis.execute_command("ZCOUNT", q.consumers, f"({rs.now_ms()}", "+inf"):
                raise ConfigError(
                    f"queue {queue} has consumers running unpartitioned; "
                    f"it cannot become {want} partitions under them (stop them, or "
                    f"start them with --partitions {want} first)"
                )
            rs.redis.execute_command("HSETNX", rs.keys.queue_config, queue, want)
            stored = rs.redis.execute_command(
                "HGET", rs.keys.queue_config, queue
            )  # whoever was first
        got = int(stored) if stored is not None else 1
        if got > 1:  # "not partitioned" is not cached: another process may store a count
            cache[queue] = got
    if want is not None and want != got:
        where = f"{rs.keys.queue_config} in Redis"
        if got == 1:
            raise ConfigError(
                f"queue {queue} is not partitioned ({where} has no entry); "
                f"--partitions {want} conflicts"
            )
        raise ConfigError(
            f"queue {queue} has {got} partitions ({where}); --partitions {want} conflicts "
            "(every producer and consumer must agree)"
        )
    return got


def names(rs: Context, queue: str, want: int | None = None) -> list[str]:
    """The stored queues behind ``queue``: itself, or its partitions."""
    n = count(rs, queue, want)
    return [queue] if n == 1 else [K.partition_name(queue, i) for i in range(n)]


def of_task(rs: Context, queue: str, task_type: str, task_id: str, want: int | None = None) -> str:
    """The stored queue that holds (or will hold) task TYPE ID of ``queue``."""
    n = count(rs, queue, want)
    if n == 1:
        return queue
    return K.partition_name(queue, K.partition_index(task_type, task_id, n))
