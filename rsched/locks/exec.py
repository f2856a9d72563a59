"""`rsched exec`: guard one run of a command from a host crontab or a systemd timer.

At most one host runs the command at a time (an owned lock with watchdog
renewal); with ``--once-per`` at most once per tick of that schedule: the
tick is the most recent one at or before the **server's** now, and it is
claimed once ever, atomically with the lock, so hosts whose cron daemons fire
late or early (by less than a tick) never run one tick twice.

The command's stdout and stderr go to ours as always, and their tails are
kept as the run's log (``log-put-3``, right after ``lock-release-5`` wrote the
record), streamed while it runs to the run's live stream (``rsched logs --follow``).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rsched.core import cronexpr, errors, replication, validate
from rsched.core.timeutil import iso, parse_duration
from rsched.locks.lock import (
    DEFAULT_TTL_MS,
    MIN_TTL_MS,
    WAKE_KEEP_MS,
    Holder,
    new_owner_id,
    wait_for_release,
)
from rsched.locks.watchdog import Watchdog, run_result
from rsched.lua import calls
from rsched.runtime import proc
from rsched.runtime.handlers import Command, HandlerRun, live_log, log_max_bytes, store_log
from rsched.runtime.loop import stop_signals

if TYPE_CHECKING:  # pragma: no cover
    from rsched.context import Context
    from rsched.core.keys import LockKeys
    from rsched.core.replication import WaitPolicy

IF_LOCKED = ("skip", "wait", "fail")
ON_LOCK_LOST = ("kill", "continue")
#: Claimed ticks are remembered at least this long (and at least 3 intervals).
MIN_TICK_KEEP_MS = 3_600_000
#: How long a finished run's record waits for an unreachable (or full) Redis
#: before `exec` exits without it (a signal ends the wait at once).
RECORD_WAIT_S = 60.0


@dataclass
class ExecOutcome:
    status: str  # "ran" | "skipped" (locked) | "done" (tick already run)
    exit_code: int
    result: str | None = None  # history result when it ran
    token: int | None = None
    fire_ms: int | None = None
    note: str = ""


class OncePer:
    """The tick rule of ``--once-per``: a cron expression or a plain duration."""

    def __init__(self, text: str, tz: str = "UTC", dialect: str | None = None):
        self.text = text
        self.every_ms = cronexpr.parse_every(text)
        if self.every_ms and tz not in ("UTC", "Etc/UTC", "Z"):
            raise errors.BadInput(
                "--tz",
                f"{tz!r} does not apply to --once-per {text} (a duration: its ticks are "
                "multiples of it since the Unix epoch, UTC); give a cron expression with "
                "--tz, like --once-per '0 * * * *' --tz " + tz,
            )
        if not self.every_ms and len(text.split()) == 1 and not text.startswith("@"):
            raise errors.BadInput(
                "--once-per",
                f"{text!r} is neither a duration (30s, 15m, 1h, 1d) nor a cron expression "
                "('0 * * * *', '*/10 * * * * *', @hourly)",
            )
        if self.every_ms and dialect:
            raise errors.BadInput(
                "--dialect", f"applies to a cron expression, not to --once-per {text} (a duration)"
            )
        self.schedule = (
            None if self.every_ms else cronexpr.parse(text, tz, field="--once-per", dialect=dialect)
        )

    def tick_at(self, now_ms: int) -> int:
        if self.every_ms:
            return now_ms - now_ms % self.every_ms
        assert self.schedule is not None
        return self.schedule.prev_at_or_before(now_ms)

    def keep_ms(self, now_ms: int) -> int:
        if self.every_ms:
            interval = self.every_ms
        else:
            assert self.schedule is not None
            interval = self.schedule.interval_ms(now_ms)
        return max(3 * interval, MIN_TICK_KEEP_MS)


@dataclass(frozen=True)
class ExecSpec:
    """One `rsched exec`, checked (:func:`make_exec_spec`): what :func:`run_exec` runs."""

    name: str
    command: list[str]
    ttl_ms: int = DEFAULT_TTL_MS
    once_per: OncePer | None = None
    if_locked: str = "skip"
    wait_timeout_ms: int | None = None
    timeout_ms: int | None = None
    on_lock_lost: str = "kill"
    grace_s: float = 5.0


def make_exec_spec(
    name: str,
    command: str | Sequence[str],
    *,
    ttl: str | int = DEFAULT_TTL_MS,
    once_per: str | None = None,
    tz: str = "UTC",
    dialect: str | None = None,
    if_locked: str = "skip",
    wait_timeout: str | int | None = None,
    timeout: str | int | None = None,
    on_lock_lost: str = "kill",
    grace_s: float = 5.0,
) -> ExecSpec:
    """Check every option of `rsched exec` (naming the flag) before anything
    touches Redis; durations are text (``30s``) or ms."""
    rule = OncePer(once_per, tz, dialect) if once_per is not None else None
    ttl_ms = parse_duration(ttl, "--ttl") if isinstance(ttl, str) else ttl
    wait_timeout_ms = (
        parse_duration(wait_timeout, "--wait-timeout")
        if isinstance(wait_timeout, str)
        else wait_timeout
    )
    timeout_ms = parse_duration(timeout, "--timeout") if isinstance(timeout, str) else timeout
    if wait_timeout is not None and if_locked != "wait":
        raise errors.BadInput("--wait-timeout", "only applies with --if-locked wait")
    validate.name(name, "--lock")
    if ttl_ms < MIN_TTL_MS:
        raise errors.BadInput("--ttl", f"must be at least {MIN_TTL_MS}ms")
    if if_locked not in IF_LOCKED:
        raise errors.BadInput("--if-locked", f"{if_locked!r} is not one of {', '.join(IF_LOCKED)}")
    if wait_timeout_ms is not None and (
        isinstance(wait_timeout_ms, bool)
        or not isinstance(wait_timeout_ms, int)
        or wait_timeout_ms <= 0
    ):
        raise errors.BadInput(
            "--wait-timeout",
            f"{wait_timeout_ms!r} is not a positive number of milliseconds "
            "(None waits without a limit)",
        )
    if on_lock_lost not in ON_LOCK_LOST:
        raise errors.BadInput(
            "--on-lock-lost", f"{on_lock_lost!r} is not one of {', '.join(ON_LOCK_LOST)}"
        )
    argv = proc.split_command(list(command) if not isinstance(command, str) else command, "CMD")
    if dialect and not once_per:
        raise errors.BadInput("--dialect", "applies to --once-per CRON; give --once-per")
    return ExecSpec(
        name,
        argv,
        ttl_ms=int(ttl_ms),
        once_per=rule,
        if_locked=if_locked,
        wait_timeout_ms=wait_timeout_ms,
        timeout_ms=timeout_ms,
        on_lock_lost=on_lock_lost,
        grace_s=grace_s,
    )


def run_exec(
    rs: Context,
    spec: ExecSpec,
    *,
    log: Callable[[str], None] | None = None,
    wait: WaitPolicy | None = None,
    warn: Callable[[str], None] | None = None,
) -> ExecOutcome:
    """Run ``spec.command`` under lock ``spec.name``; see the module doc. The spec
    was checked when it was made (:func:`make_exec_spec`)."""
    say = log or (lambda _m: None)
    # SIGTERM/SIGINT/SIGHUP from here on: while waiting for the lock, stop waiting;
    # once it is held, stop the child's group gracefully and release the lock. (A
    # KeyboardInterrupt between acquiring and starting would leave the lock to its TTL.)
    sig = _Signals(spec.grace_s)
    with stop_signals(sig.on_signal, signals=(signal.SIGTERM, signal.SIGINT, signal.SIGHUP)):
        return _run_exec(
            rs, spec.name, spec.command, spec.once_per, sig,
            ttl_ms=spec.ttl_ms, if_locked=spec.if_locked, wait_timeout_ms=spec.wait_timeout_ms,
            timeout_ms=spec.timeout_ms, on_lock_lost=spec.on_lock_lost, grace_s=spec.grace_s,
            say=say, wait=wait, warn=warn,
        )  # fmt: skip


class _Signals:
    """The signals `exec` received, and the child to pass them on to."""

    def __init__(self, grace_s: float):
        self.grace_s = grace_s
        self.got: list[str] = []
        self.child: HandlerRun | None = None
        #: Ends a wait for the lock (a signal, or the wake-up wait's own end).
        self.woken = threading.Event()

    def on_signal(self, name: str) -> None:
        self.got.append(name)
        self.woken.set()
        child = self.child
        if child is not None:
            threading.Thread(
                target=child.stop, args=(f"signal {name}", self.grace_s), daemon=True
            ).start()

    def status(self, default: int) -> int:
        """Ctrl-C: exit 130 (interrupted), whatever the child made of it."""
        return int(errors.ExitCode.INTERRUPTED) if "SIGINT" in self.got else default


def _run_exec(
    rs: Context,
    name: str,
    argv: list[str],
    rule: OncePer | None,
    sig: _Signals,
    *,
    ttl_ms: int,
    if_locked: str,
    wait_timeout_ms: int | None,
    timeout_ms: int | None,
    on_lock_lost: str,
    grace_s: float,
    say: Callable[[str], None],
    wait: WaitPolicy | None,
    warn: Callable[[str], None] | None,
) -> ExecOutcome:
    k = rs.keys.lock(name)
    owner = new_owner_id()
    ident = rs.identity()
    deadline = None
    if if_locked == "wait":
        deadline = time.monotonic() + (wait_timeout_ms / 1000 if wait_timeout_ms else float("inf"))
    first = True
    fire_ms: int | None = None
    while True:
        if sig.got:  # stopped while waiting for the lock: 130 for Ctrl-C, else 128 + signal
            if "SIGINT" in sig.got:
                raise KeyboardInterrupt
            raise SystemExit(128 + int(signal.Signals[sig.got[0]]))
        now = rs.now_ms()
        fire_ms = rule.tick_at(now) if rule else None
        keep = rule.keep_ms(now) if rule else 0
        sent = time.monotonic()  # the lease runs from (at the latest) now
        try:
            res = calls.exec_acquire(
                rs,
                k,
                owner=owner,
                ttl_ms=ttl_ms,
                host=str(ident["host"]),
                pid=int(ident["pid"]),
                fire_ms=fire_ms,
                keep_ms=keep,
            )
        except errors.RedisFull as exc:
            raise errors.RedisFull(
                f"{exc}; lock {name!r} was not taken and the command was not run"
            ) from exc
        status = res.status
        if status == "ok":
            assert res.token is not None
            token, started_ms = res.token, res.now_ms
            break
        if status == "early":  # the server's clock moved back between TIME and the claim
            continue
        if status == "done":
            note = f"tick {iso(fire_ms)} of lock {name!r} already ran (claimed at {iso(res.claimed_ms)})"
            say(note)
            return ExecOutcome("done", 0, fire_ms=fire_ms, note=note)
        holder = Holder.of(res)
        note = f"lock {name!r} is {holder.describe()}"
        if if_locked == "skip":
            say(note + "; skipped")
            return ExecOutcome("skipped", 0, fire_ms=fire_ms, note=note)
        if if_locked == "fail":
            raise errors.LockHeld(note)
        assert deadline is not None
        if time.monotonic() >= deadline:
            raise errors.LockHeld(note + f"; still held after waiting {wait_timeout_ms} ms")
        if first:
            first = False
            say(
                note
                + "; waiting"
                + (f" up to {wait_timeout_ms} ms" if wait_timeout_ms else " for it")
            )
        # Woken by the holder's release (or when its lease can have run out, or a signal).
        sig.woken.clear()
        if not sig.got:
            wait_for_release(rs.redis, k.wake, holder.ttl_ms, deadline, woken=sig.woken)

    try:
        rs.redis.sadd(rs.keys.locks, name)
    except Exception:  # noqa: BLE001 - registry is for listings only
        pass
    env = {
        "RSCHED_NAME": name,
        "RSCHED_FIRE_AT": iso(fire_ms if fire_ms is not None else started_ms) or "",
        "RSCHED_FENCING_TOKEN": str(token),
    }
    say(f"lock {name!r} acquired with fencing token {token}")
    if wait:  # before the watchdog: this thread's write was the last on its connection
        short: str | None
        try:
            acked = replication.wait(rs.redis, wait, [rs.keys.lock(name).lock])
        except errors.RschedError as exc:
            short = f"WAIT for replicas failed ({exc})"
        else:
            short = wait.shortfall(acked, f"lock {name!r} (fencing token {token})")
        if short:
            (warn or say)(f"rsched: warning: {short}; running the command anyway")
    timeout_s = timeout_ms / 1000 if timeout_ms else None
    live = live_log(rs, k.live(token))
    child = HandlerRun(
        Command(
            argv,
            env,
            timeout_s=timeout_s,
            grace_s=grace_s,
            log_bytes=log_max_bytes(rs),
            on_output=live,
        )
    )
    sig.child = child
    child.start()  # before the watchdog, whose on_lost stops it
    lost = threading.Event()

    def on_lost(reason: str) -> None:
        lost.set()
        say(
            f"lock {name!r} lost: {reason}"
            + ("; stopping the command" if on_lock_lost == "kill" else "")
        )
        if on_lock_lost == "kill":  # SIGKILL before the lease can have expired
            child.stop("lock lost", dog.stop_grace(grace_s))

    def renew() -> int:
        return calls.lock_renew(rs, k.lock, owner, ttl_ms)

    dog = Watchdog(renew, ttl_ms, on_lost=on_lost, name=f"rsched-exec-{name}").start(since=sent)

    try:
        if sig.got:  # a signal came while the lock was being taken: do not start it
            child.stop(f"signal {sig.got[0]}", grace_s)
        result = child.wait()
    finally:
        dog.stop()
        live.close()
    outcome = run_result(lost.is_set(), result.timed_out, result.ok)
    rec: dict[str, Any] = {
        "kind": "exec",
        "name": name,
        "fire_ms": fire_ms if fire_ms is not None else started_ms,
        "started_ms": started_ms,
        "duration_ms": result.duration_ms,
        "result": outcome,
        "exit_code": result.exit_code,
        "host": ident["host"],
        "pid": ident["pid"],
        "attempt": 1,
        "token": token,
    }
    if outcome != "ok":
        rec["error"] = result.describe()
    if _release_with_retry(rs, k, owner, rec, sig, warn or say):
        store_log(rs, k, token, result)
    note = result.stderr_tail if not result.started else ""  # could not even start it
    return ExecOutcome(
        "ran", sig.status(result.exit_code), result=outcome, token=token, fire_ms=fire_ms, note=note
    )


def _release_with_retry(
    rs: Context,
    k: LockKeys,
    owner: str,
    rec: dict[str, Any],
    sig: _Signals | None = None,
    note: Callable[[str], None] | None = None,
) -> bool:
    """Release the lock and write the run's record; while Redis is unreachable (or
    full) keep the record and try again, with backoff, for up to
    :data:`RECORD_WAIT_S` (a signal stops the wait). True once it is written."""
    from rsched.core.errors import map_error
    from rsched.core.transient import TRANSIENT

    delay = 0.1
    give_up = time.monotonic() + RECORD_WAIT_S
    pending = False
    while True:
        try:
            calls.lock_release(
                rs,
                k,
                owner=owner,
                history_maxlen=rs.history_maxlen,
                record=rec,
                keep_ms=WAKE_KEEP_MS,
            )
            if pending and note:
                note(
                    f"rsched: the record of lock {rec['name']!r}'s run is written ({rec['result']})"
                )
            return True
        except Exception as exc:  # noqa: BLE001
            if not isinstance(exc, TRANSIENT) and not isinstance(
                map_error(exc), errors.RedisUnavailable
            ):
                raise
            left = give_up - time.monotonic()
            if left <= 0 or (sig is not None and sig.got):
                if note:
                    note(
                        f"rsched: warning: the record of lock {rec['name']!r}'s run "
                        f"({rec['result']}) was not written: {map_error(exc)}"
                    )
                return False
            if not pending:
                pending = True
                # Written late: its finish is when the command ended, not when Redis came back.
                rec.setdefault("finished_ms", rec["started_ms"] + rec["duration_ms"])
                if note:
                    note(
                        f"rsched: warning: {map_error(exc)}; keeping the record of this run "
                        f"({rec['result']}) to write when Redis is back "
                        f"(for up to {RECORD_WAIT_S:g}s)"
                    )
            time.sleep(min(delay, left))
            delay = min(delay * 2, 2.0)


__all__ = ["run_exec", "make_exec_spec", "ExecSpec", "ExecOutcome", "OncePer", "os"]
