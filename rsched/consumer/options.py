"""The consumer's configuration, validated once before any Redis I/O.

:func:`consumer_options` turns what the caller gave (flags as text, or Python
values) and the config file's ``[queues.Q]`` sections into a
:class:`ConsumerOptions`: the queues, each one's :class:`QueueOptions` (explicit
values win; then ``[queues.Q]``; then the defaults), the concurrency, the grace
and the partition count. ``rsched run consumer`` builds it and hands it to
:class:`~rsched.consumer.loop.Consumer`; the library's ``Consumer(...)`` builds
it from its keyword arguments. Every refusal names the flag (``--lease``) or the
config entry (``queues.Q.lease``, a :class:`~rsched.core.errors.ConfigError`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rsched.core import validate
from rsched.core.errors import BadInput, ConfigError
from rsched.core.timeutil import duration_ms
from rsched.runtime.options import positive_int

if TYPE_CHECKING:  # pragma: no cover
    from rsched.core.config import Settings

DEFAULT_LEASE_MS = 60_000
DEFAULT_BACKOFF_MS = 1_000
DEFAULT_BACKOFF_MAX_MS = 600_000
DEFAULT_GRACE_MS = 30_000
#: Most handlers running at once.
CONCURRENCY_LIMIT = 1024


@dataclass(frozen=True)
class QueueOptions:
    lease_ms: int
    max_attempts: int  # for tasks added without their own
    timeout_ms: int | None
    backoff_ms: int
    backoff_max_ms: int
    #: (N, window ms, text) of ``rate_limit = "N/DUR"``, or None
    rate_limit: tuple[int, int, str] | None = None
    #: ((type, N, window ms, text), ...) of ``type_rate_limits``, by type
    type_rate_limits: tuple[tuple[str, int, int, str], ...] = ()


def from_config(
    settings: Settings | None, queue: str, key: str, parse: Callable[[Any, str], Any]
) -> Any:
    if settings is None:
        return None
    value = settings.queue_options(queue).get(key)
    if value is None:
        return None
    try:
        return parse(value, f"queues.{queue}.{key}")
    except BadInput as exc:
        raise ConfigError(f"config {settings.config_path}: {exc}") from None


def queue_options(
    settings: Settings | None,
    queue: str,
    *,
    lease_ms: Any = None,
    max_attempts: Any = None,
    timeout_ms: Any = None,
    backoff_ms: Any = None,
    backoff_max_ms: Any = None,
    rate_limit: Any = None,
    type_rate_limits: Any = None,
) -> QueueOptions:
    """Explicit values win; then ``[queues.Q]`` in the config file; then the defaults."""

    def pick(
        explicit: Any, key: str, flag: str, parse: Callable[[Any, str], Any], default: Any
    ) -> Any:
        if explicit is not None:
            return parse(explicit, flag)
        v = from_config(settings, queue, key, parse)
        return default if v is None else v

    lease = pick(lease_ms, "lease", "--lease", duration_ms, DEFAULT_LEASE_MS)
    if lease < 300:
        raise BadInput("--lease", f"{lease}ms is too short; give at least 300ms")
    ma = pick(max_attempts, "max_attempts", "--max-attempts", validate.max_attempts, None)
    if ma is None:
        from rsched.core.defaults import DEFAULT_MAX_ATTEMPTS

        ma = DEFAULT_MAX_ATTEMPTS
    backoff = pick(backoff_ms, "backoff", "--backoff", duration_ms, DEFAULT_BACKOFF_MS)
    cap = pick(backoff_max_ms, "backoff_max", "--backoff-max", duration_ms, DEFAULT_BACKOFF_MAX_MS)
    if cap < backoff:
        raise BadInput("--backoff-max", f"{cap}ms is shorter than --backoff ({backoff}ms)")
    timeout = pick(timeout_ms, "timeout", "--timeout", duration_ms, None)
    rate = pick(rate_limit, "rate_limit", "--rate-limit", validate.rate_limit, None)
    stored = from_config(settings, queue, "type_rate_limits", validate.type_rate_limits)
    per_type = {t[0]: t for t in stored or ()}
    if type_rate_limits is not None:  # the flag's (or the app's) win over the file's, per type
        given = validate.type_rate_limits(type_rate_limits, "--type-rate-limit")
        per_type.update((t[0], t) for t in given)
    return QueueOptions(
        lease, int(ma), timeout, backoff, cap, rate, tuple(per_type[t] for t in sorted(per_type))
    )


@dataclass(frozen=True)
class ConsumerOptions:
    """A consumer's whole configuration, checked (see the module doc)."""

    queues: tuple[str, ...]
    #: queue name (as given, before partitions) -> its options
    per_queue: dict[str, QueueOptions]
    concurrency: int
    grace_ms: int
    partitions: int | None  # None: as stored in Redis, else 1


def check_queues(queues: str | Sequence[str]) -> list[str]:
    """The queue names, checked, each once, in order (a string: one queue)."""
    if isinstance(queues, str):
        queues = [queues]
    names = list(dict.fromkeys(validate.queue(q) for q in queues))
    if not names:
        raise BadInput("--queue", "give at least one queue")
    return names


def consumer_options(
    settings: Settings | None,
    queues: str | Sequence[str] = ("default",),
    *,
    concurrency: Any = None,
    lease_ms: Any = None,
    max_attempts: Any = None,
    backoff_ms: Any = None,
    backoff_max_ms: Any = None,
    timeout_ms: Any = None,
    grace_ms: Any = None,
    partitions: Any = None,
    rate_limit: Any = None,
    type_rate_limits: Any = None,
) -> ConsumerOptions:
    """Check every option (flags as text or Python values; ``None``: from the config
    file, else the default) before any Redis I/O."""
    names = check_queues(queues)
    conc = (
        None
        if concurrency is None
        else positive_int(concurrency, "--concurrency", CONCURRENCY_LIMIT)
    )
    parts = None
    if partitions is not None:
        from rsched.queue.queues import check_count

        parts = check_count(partitions)
    if max_attempts is not None:
        max_attempts = validate.max_attempts(max_attempts)
    explicit = {
        "lease_ms": None if lease_ms is None else duration_ms(lease_ms, "--lease"),
        "backoff_ms": None if backoff_ms is None else duration_ms(backoff_ms, "--backoff"),
        "backoff_max_ms": None
        if backoff_max_ms is None
        else duration_ms(backoff_max_ms, "--backoff-max"),
        "timeout_ms": None if timeout_ms is None else duration_ms(timeout_ms, "--timeout"),
        "rate_limit": None
        if rate_limit is None
        else validate.rate_limit(rate_limit, "--rate-limit"),
        "type_rate_limits": None
        if not type_rate_limits
        else validate.type_rate_limits(type_rate_limits, "--type-rate-limit"),
    }
    grace = None if grace_ms is None else duration_ms(grace_ms, "--grace")
    per_queue = {
        q: queue_options(settings, q, max_attempts=max_attempts, **explicit) for q in names
    }
    cfg_conc = from_config(settings, names[0], "concurrency", positive_int)
    cfg_grace = from_config(settings, names[0], "grace", duration_ms)
    if conc is None:
        conc = positive_int(cfg_conc or 1, "--concurrency", CONCURRENCY_LIMIT)
    if grace is None:
        grace = DEFAULT_GRACE_MS if cfg_grace is None else cfg_grace
    return ConsumerOptions(tuple(names), per_queue, conc, grace, parts)
