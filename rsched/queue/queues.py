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

The unpartitioned queue's own ``tasks`` hash holds the field ``#partitions``
(-> N) once the queue is partitioned (never a task's member: those have a
space). ``add-7`` checks it (its "p" check), so that an add that took the
queue to be unpartitioned, without reading ``queue-config`` first, is refused
and nothing written: the add is one round trip. The ``queue-config`` entry
stays the authority: the same round trip reads it, and a queue partitioned by
an earlier version (no field yet) gets the field on the first add that meets it
(:func:`rsched.queue.ops.add_spec`).
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


#: The field of an unpartitioned queue's ``tasks`` hash that says it is partitioned.
PARTITIONS_FIELD = "#partitions"


class Known:
    """What one context has learned of its queues (kept on the context)."""

    def __init__(self) -> None:
        #: queue -> its partition count, once read as > 1 ("not partitioned" is
        #: not kept: another process may partition the queue)
        self.counts: dict[str, int] = {}
        #: stored queues whose keys' types add-7 has checked on this connection
        self.checked: set[str] = set()
        #: queues this context added a task to unpartitioned, as ``queue-config``
        #: said: a later add reads it no more (add-7's "p" check sees a
        #: partitioning by this version)
        self.ready: set[str] = set()
        #: stored queue -> its keys (an add builds them once)
        self.keys: dict[str, K.QueueKeys] = {}


def known(rs: Context) -> Known:
    k = rs.__dict__.get("_rsched_known")
    if k is None:
        k = rs.__dict__["_rsched_known"] = Known()
    return k


def _cache(rs: Context) -> dict[str, int]:
    return known(rs).counts


def _want(rs: Context, queue: str, want: int | None) -> int | None:
    if want is None:
        cfg = rs.queue_option(queue, "partitions")
        want = check_count(cfg, f"queues.{queue}.partitions") if cfg is not None else None
    return want


def resolve(rs: Context, queue: str, want: int | None = None) -> int | None:
    """:func:`count` without a round trip where it can: the count this context
    knows, or, for a queue taken to be unpartitioned (no ``want`` above 1),
    None: the caller adds with ``add-7``'s "p" check (see the module docstring)
    and reads ``queue-config`` in the same round trip."""
    want = _want(rs, queue, want)
    got = _cache(rs).get(queue)
    if got is not None:
        _agree(rs, queue, want, got)
        return got
    if want is None or want == 1:
        return None
    return count(rs, queue, want)


def learn(rs: Context, queue: str, stored: Any) -> None:
    """Keep a ``queue-config`` reply (read in an add's round trip) as the count."""
    if stored is not None and int(stored) > 1:
        _cache(rs)[queue] = int(stored)


def count(rs: Context, queue: str, want: int | None = None) -> int:
    """The agreed partition count of ``queue`` (1: not partitioned).

    ``want`` (a ``--partitions`` flag), else the config file's
    ``[queues.Q] partitions``, is checked against the count stored in Redis;
    a first use with ``want > 1`` stores it. (Plain ``execute_command``: the
    one-shot client of :mod:`rsched.core.resp` has no command helpers.)"""
    cache = _cache(rs)
    want = _want(rs, queue, want)
    got = cache.get(queue)
    if got is None:
        stored = rs.redis.execute_command("HGET", rs.keys.queue_config, queue)
        if stored is None and want is not None and want > 1:
            q = rs.keys.queue(queue)
            held = int(rs.redis.execute_command("HLEN", q.tasks))
            # (the field alone: another process partitioned it just now; read again below)
            if held > 1 or (
                held and not rs.redis.execute_command("HEXISTS", q.tasks, PARTITIONS_FIELD)
            ):
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
            rs.redis.execute_command("HSET", q.tasks, PARTITIONS_FIELD, int(stored))
        got = int(stored) if stored is not None else 1
        if got > 1:  # "not partitioned" is not cached: another process may store a count
            cache[queue] = got
    _agree(rs, queue, want, got)
    return got


def _agree(rs: Context, queue: str, want: int | None, got: int) -> None:
    """Refuse a ``want`` that is not the stored count ``got``."""
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


def names(rs: Context, queue: str, want: int | None = None) -> list[str]:
    """The stored queues behind ``queue``: itself, or its partitions."""
    n = count(rs, queue, want)
    return [queue] if n == 1 else [K.partition_name(queue, i) for i in range(n)]


def names_many(rs: Context, queues: list[str]) -> dict[str, list[str]]:
    """:func:`names` of many queues with one read of ``queue-config`` (HGETALL;
    none when every count is cached) instead of one HGET per queue: listings
    of every queue (``rsched queues``, the console's overview, history)."""
    cache = _cache(rs)
    stored: dict[str, Any] = {}
    if any(q not in cache for q in queues):
        reply = rs.redis.execute_command("HGETALL", rs.keys.queue_config)
        if isinstance(reply, dict):
            stored = reply
        elif reply:  # RESP2's flat list (the one-shot client of rsched.core.resp)
            stored = dict(zip(reply[0::2], reply[1::2], strict=True))
    out = {}
    for q in queues:
        got = cache.get(q) or int(stored.get(q) or 1)
        if got > 1:
            cache[q] = got
        _agree(rs, q, _want(rs, q, None), got)
        out[q] = [q] if got == 1 else [K.partition_name(q, i) for i in range(got)]
    return out


def of_task(rs: Context, queue: str, task_type: str, task_id: str, want: int | None = None) -> str:
    """The stored queue that holds (or will hold) task TYPE ID of ``queue``."""
    n = count(rs, queue, want)
    if n == 1:
        return queue
    return K.partition_name(queue, K.partition_index(task_type, task_id, n))
