"""A cron's spec: every option of `rsched run cron` (or a ``[cron.NAME]`` table
of the config file) checked and turned into a value, naming the field, before
anything touches Redis. The CLI builds the :class:`CronSpec`; the runner
(:mod:`rsched.cron.runner`) takes it as it is."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rsched.core import cronexpr, errors, validate
from rsched.core.timeutil import parse_duration
from rsched.locks.lock import DEFAULT_TTL_MS, MIN_TTL_MS
from rsched.runtime import proc

CONCURRENCY = ("forbid", "allow", "replace")
MISFIRE = ("skip", "run-once")
ON_LOCK_LOST = ("kill", "continue")

CONFIG_KEYS = {
    "schedule",
    "tz",
    "dialect",
    "command",
    "ttl",
    "concurrency",
    "misfire",
    "starting_deadline",
    "timeout",
    "jitter",
    "shards",
    "broadcast",
    "on_lock_lost",
    "grace",
    "after",
}


@dataclass
class CronSpec:
    name: str
    #: None: the cron only runs when asked (``after`` or ``rsched trigger``).
    schedule: cronexpr.Schedule | None
    command: list[str]
    ttl_ms: int = DEFAULT_TTL_MS
    concurrency: str = "forbid"
    misfire: str = "skip"
    starting_deadline_ms: int | None = None
    timeout_ms: int | None = None
    jitter_ms: int = 0
    shards: int | None = None
    broadcast: bool = False
    on_lock_lost: str = "kill"
    grace_s: float = 5.0
    #: Runs once each time one of these crons finishes ok (``--after``).
    after: tuple[str, ...] = ()
    #: bytes the job's command gets on stdin (None: /dev/null); a Python cron's
    #: child (rsched.app) reads its connection settings there, never from argv
    stdin: bytes | None = None

    @property
    def sharded(self) -> bool:
        return bool(self.shards) or self.broadcast


def make_spec(
    name: str,
    schedule: str | None,
    command: str | Sequence[str],
    *,
    tz: str = "UTC",
    dialect: str | None = None,
    ttl: str | int | None = None,
    concurrency: str = "forbid",
    misfire: str = "skip",
    starting_deadline: str | int | None = None,
    timeout: str | int | None = None,
    jitter: str | int | None = None,
    shards: int | None = None,
    broadcast: bool = False,
    on_lock_lost: str = "kill",
    grace: str | int | None = None,
    after: Sequence[str] = (),
    prefix: str = "--",
) -> CronSpec:
    """Check every option (naming the field) before anything touches Redis."""

    def f(opt: str) -> str:
        return f"{prefix}{opt}" if prefix == "--" else f"{prefix}{opt.replace('-', '_')}"

    def dur(v: str | int | None, opt: str) -> int | None:
        if v is None:
            return None
        if isinstance(v, int) and not isinstance(v, bool):
            if v <= 0:
                raise errors.BadInput(f(opt), f"{v} is not a positive duration")
            return v
        return parse_duration(str(v), f(opt))

    validate.name(name, "NAME")
    if isinstance(after, str) or not all(isinstance(a, str) for a in after):
        raise errors.BadInput(f("after"), 'takes a list of cron names, like after = ["A"]')
    for a in after:
        validate.name(a, f("after"))
    if name in after:
        raise errors.BadInput(f("after"), f"a cron cannot run after itself ({name})")
    if schedule is None and not after:
        raise errors.BadInput(
            f("schedule"), "is required (unless --after), like --schedule '*/5 * * * *'"
        )
    sched = None
    if schedule is not None:
        sched = cronexpr.parse(
            schedule,
            tz or "UTC",
            field=f("schedule"),
            tz_field=f("tz"),
            dialect=dialect,
            dialect_field=f("dialect"),
        )
    argv = proc.split_command(command, f("command") if prefix != "--" else "CMD")
    if concurrency not in CONCURRENCY:
        raise errors.BadInput(
            f("concurrency"), f"{concurrency!r} is not one of {', '.join(CONCURRENCY)}"
        )
    if misfire not in MISFIRE:
        raise errors.BadInput(f("misfire"), f"{misfire!r} is not one of {', '.join(MISFIRE)}")
    if on_lock_lost not in ON_LOCK_LOST:
        raise errors.BadInput(
            f("on-lock-lost"), f"{on_lock_lost!r} is not one of {', '.join(ON_LOCK_LOST)}"
        )
    ttl_ms = dur(ttl, "ttl") or DEFAULT_TTL_MS
    if ttl_ms < MIN_TTL_MS:
        raise errors.BadInput(f("ttl"), f"must be at least {MIN_TTL_MS}ms")
    if shards is not None:
        if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= 10_000:
            raise errors.BadInput(f("shards"), f"{shards!r} is not a whole number from 1 to 10000")
        if broadcast:
            raise errors.BadInput(f("broadcast"), "cannot be combined with --shards")
    if (shards or broadcast) and concurrency != "forbid":
        raise errors.BadInput(
            f("concurrency"),
            "sharded and broadcast crons run every item of every tick; "
            "--concurrency does not apply to them",
        )
    g = dur(grace, "grace")
    return CronSpec(
        name=name,
        schedule=sched,
        command=argv,
        ttl_ms=ttl_ms,
        concurrency=concurrency,
        misfire=misfire,
        starting_deadline_ms=dur(starting_deadline, "starting-deadline"),
        timeout_ms=dur(timeout, "timeout"),
        jitter_ms=dur(jitter, "jitter") or 0,
        shards=shards,
        broadcast=bool(broadcast),
        on_lock_lost=on_lock_lost,
        grace_s=(g / 1000) if g else 5.0,
        after=tuple(dict.fromkeys(after)),
    )


def spec_from_config(name: str, table: Mapping[str, Any]) -> CronSpec:
    """A ``[cron.NAME]`` table of the config file."""
    if not isinstance(table, Mapping):
        raise errors.ConfigError(f"[cron.{name}] must be a table")
    unknown = set(table) - CONFIG_KEYS
    if unknown:
        raise errors.ConfigError(
            f"[cron.{name}]: unknown key(s) {', '.join(sorted(unknown))} "
            f"(known: {', '.join(sorted(CONFIG_KEYS))})"
        )
    for req in ("schedule", "command"):
        if req not in table and not (req == "schedule" and table.get("after")):
            raise errors.ConfigError(f"[cron.{name}]: {req} is required")
    try:
        return make_spec(
            name,
            table.get("schedule"),
            table["command"],
            tz=table.get("tz", "UTC"),
            dialect=table.get("dialect"),
            ttl=table.get("ttl"),
            concurrency=table.get("concurrency", "forbid"),
            misfire=table.get("misfire", "skip"),
            starting_deadline=table.get("starting_deadline"),
            timeout=table.get("timeout"),
            jitter=table.get("jitter"),
            shards=table.get("shards"),
            broadcast=bool(table.get("broadcast", False)),
            on_lock_lost=table.get("on_lock_lost", "kill"),
            grace=table.get("grace"),
            after=table.get("after", ()),
            prefix=f"cron.{name}.",
        )
    except errors.BadInput as exc:
        raise errors.ConfigError(f"config: {exc}") from None
