"""One run of a cron job: the child process, the run lock's watchdog (and, with
``--concurrency replace``, its blocking wait on the cron's wake key), what a
lost lock does (``--on-lock-lost``), and the execution record written by
``cron-finish-6``, then the run's log (its stdout and stderr tails) by
``log-put-3`` beside it; while it runs its output also goes to the run's live
stream (:class:`rsched.runtime.handlers.LiveLog`, ``rsched logs --follow``).

The child is run by :mod:`rsched.runtime.handlers`, the one command runner
of every loop (argv, environment, timeout, grace, group kill); a run cancelled
before its child started (during its jitter) is not started at all.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from rsched.core.timeutil import iso
from rsched.core.transient import TRANSIENT
from rsched.locks.watchdog import Watchdog, run_result
from rsched.lua import calls
from rsched.runtime.handlers import (
    Command,
    HandlerRun,
    LiveLog,
    Outcome,
    live_log,
    log_max_bytes,
    store_log,
)

if TYPE_CHECKING:  # pragma: no cover
    from rsched.context import Context
    from rsched.core.keys import CronKeys
    from rsched.cron.spec import CronSpec


class JobHost(Protocol):
    """What a run needs of its runner (:class:`rsched.cron.runner.CronRunner`)."""

    rs: Context
    spec: CronSpec
    k: CronKeys
    host: str
    pid: int
    log: Callable[[str], None]
    debug: Callable[[str], None]

    def blocking_client(self) -> Any: ...


class RunMark:
    """A run asked for that holds no run lock (``--concurrency allow``, a shard or
    broadcast item) keeps a marker (``run_mark(token)``, PX the cron's ``--ttl``),
    renewed every TTL/3 while it runs and deleted once its record is written: what
    ``trigger --wait`` reads to tell a run whose runner died (the marker expired, no
    record) from one still going on. Cost: one ``SET PX`` per TTL/3 per such run."""

    def __init__(self, rs: Context, key: str, value: str, ttl_ms: int):
        self.rs, self.key, self.value, self.ttl_ms = rs, key, value, ttl_ms
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._renew, daemon=True, name="rsched-mark")

    def start(self) -> RunMark:
        self._put()
        self._thread.start()
        return self

    def _put(self) -> None:
        try:
            self.rs.redis.set(self.key, self.value, px=self.ttl_ms)
        except TRANSIENT:  # Redis down: the next renewal puts it back
            pass

    def _renew(self) -> None:
        while not self._done.wait(self.ttl_ms / 3000):
            self._put()

    def end(self) -> None:
        if self._done.is_set():
            return
        self._done.set()
        self._thread.join(2)
        try:
            self.rs.redis.delete(self.key)
        except TRANSIENT:  # it expires within the TTL
            pass


class JobRun:
    """One run of a cron job: child process, watchdog, execution record."""

    def __init__(
        self,
        runner: JobHost,
        fire: int,
        token: int,
        owner: str,
        started_ms: int,
        shard: tuple[int, int] | None,
        since: float | None = None,
        extra: dict[str, Any] | None = None,
    ):
        self.r = runner
        #: Record fields of a run that was asked for: cause, triggered_by, trigger, after_token.
        self.extra = extra or {}
        #: Monotonic send time of the call that took the run lock (its lease runs from then).
        self.since = since
        self.fire = fire
        self.token = token
        self.owner = owner
        self.started_ms = started_ms  # server time of the claim; moved to the child's start
        self._claimed = time.monotonic()
        self.shard = shard
        self.handler: HandlerRun | None = None
        self.stop_reason: str | None = None
        self._cancel = threading.Event()
        self.lost = threading.Event()
        self.dog: Watchdog | None = None
        self.mark: RunMark | None = None
        #: The run's watchdog blocks on the cron's wake key (replace): finish wakes it.
        self._wakes = bool(owner) and runner.spec.concurrency == "replace"

    def _waiter(self) -> Callable[[float], object]:
        """The watchdog's wait between renewals (replace): ``BZPOPMIN`` on the wake key,
        so that a runner asking this run to stop is heard at once, at no cost while idle."""
        r = self.r
        client = r.blocking_client()
        wake_key = r.k.wake

        def wait(timeout_s: float) -> object:
            popped = client.bzpopmin([wake_key], timeout=timeout_s)
            if popped and popped[1] in ("w", b"w") and self.dog is not None and self.dog.stopped:
                # This run ended meanwhile: the wake-up is meant for the next holder.
                r.rs.redis.zadd(wake_key, {"w": float(popped[2])})
            return popped

        return wait

    def cancel(self, reason: str, grace_s: float | None = None) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
        self._cancel.set()
        if self.handler is not None:
            self.handler.stop(reason, self.r.spec.grace_s if grace_s is None else grace_s)

    def run(self) -> None:
        r, s = self.r, self.r.spec
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001 - report, never kill the runner
            r.log(
                f"cron {s.name}: job for tick {iso(self.fire)} failed to run: {type(exc).__name__}: {exc}"
            )
        finally:
            if self.mark is not None:
                self.mark.end()

    def _run(self) -> None:
        r, s = self.r, self.r.spec
        dog: Watchdog | None = None
        if self.owner:

            def renew() -> int:
                return calls.lock_renew(r.rs, r.k.run_lock, self.owner, s.ttl_ms)

            def on_lost(reason: str) -> None:
                self.lost.set()
                r.log(
                    f"cron {s.name}: run lock of tick {iso(self.fire)} lost ({reason})"
                    + ("; stopping the job" if s.on_lock_lost == "kill" else "; the job continues")
                )
                if s.on_lock_lost == "kill" and dog is not None:
                    # SIGKILL before the lease can have expired (the grace is cut to fit)
                    self.cancel("lock lost", dog.stop_grace(s.grace_s))

            def on_cancel() -> None:
                r.log(
                    f"cron {s.name}: a newer tick replaces the run of {iso(self.fire)}; stopping it"
                )
                self.cancel("replaced by a newer tick")

            wait = None
            if s.concurrency == "replace":
                wait = self._waiter()
            dog = Watchdog(
                renew,
                s.ttl_ms,
                on_lost=on_lost,
                on_cancel=on_cancel,
                name=f"rsched-watchdog-{s.name}",
                wait=wait,
            ).start(since=self.since)
            self.dog = dog
        if not self.owner and self.extra.get("trigger"):
            self.mark = RunMark(r.rs, r.k.run_mark(self.token), r.host, s.ttl_ms).start()
        if s.jitter_ms:
            self._cancel.wait(random.uniform(0, s.jitter_ms) / 1000)
        env = {
            "RSCHED_NAME": s.name,
            "RSCHED_FIRE_AT": iso(self.fire) or "",
            "RSCHED_FENCING_TOKEN": str(self.token),
        }
        if self.shard is not None and not s.broadcast:
            env["RSCHED_SHARD_INDEX"] = str(self.shard[0])
            env["RSCHED_SHARD_TOTAL"] = str(self.shard[1])
        t0 = time.monotonic()
        self.started_ms += int((t0 - self._claimed) * 1000)  # after jitter, by the server's clock
        result: Outcome
        live: LiveLog | None = None
        if self._cancel.is_set():  # cancelled during the jitter: never started
            result = Outcome(143, False, self.stop_reason, "", 0)
        else:
            live = live_log(r.rs, r.k.live(self.token))
            cmd = Command(
                s.command,
                env,
                stdin=s.stdin,
                timeout_s=s.timeout_ms / 1000 if s.timeout_ms else None,
                grace_s=s.grace_s,
                log_bytes=log_max_bytes(r.rs),
                on_output=live,
            )
            # Kept before the start: a cancel from another thread meanwhile is
            # applied as soon as the child exists.
            self.handler = HandlerRun(cmd)
            if self._cancel.is_set():
                result = Outcome(143, False, self.stop_reason, "", 0)
            else:
                result = self.handler.start().wait()
        if live is not None:
            live.close()
        if dog is not None:
            # A blocking watchdog (replace) is woken by cron-finish-6, then joined.
            dog.stop(join=not self._wakes)
        outcome = run_result(self.lost.is_set(), result.timed_out, result.ok)
        rec: dict[str, Any] = {
            "kind": "cron",
            "name": s.name,
            "fire_ms": self.fire,
            "started_ms": self.started_ms,
            "duration_ms": int((time.monotonic() - t0) * 1000),
            "result": outcome,
            "exit_code": result.exit_code,
            "host": r.host,
            "pid": r.pid,
            "attempt": 1,
            "token": self.token,
        }
        if self.shard is not None and not s.broadcast:
            rec["shard"], rec["shard_total"] = self.shard
        rec.update(self.extra)
        if outcome != "ok":
            rec["error"] = result.describe()
        (r.debug if outcome == "ok" else r.log)(
            f"cron {s.name}: tick {iso(self.fire)} {outcome}"
            + (f" ({rec.get('error')})" if outcome != "ok" else "")
            + f" in {rec['duration_ms']} ms"
        )
        self._finish(rec)
        if self.mark is not None:
            self.mark.end()  # after the record: --wait never sees neither
        store_log(r.rs, r.k, self.token, result)

    def _finish(self, rec: dict[str, Any]) -> None:
        r = self.r
        delay = 0.2
        deadline = time.monotonic() + 300
        while True:
            try:
                calls.cron_finish(
                    r.rs,
                    r.k,
                    owner=self.owner,
                    history_maxlen=r.rs.history_maxlen,
                    record=rec,
                    wake=self._wakes,
                )
                break
            except Exception as exc:  # noqa: BLE001
                if not isinstance(exc, TRANSIENT) or time.monotonic() > deadline:
                    r.log(f"cron {r.spec.name}: could not record tick {iso(self.fire)}: {exc}")
                    break
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        if self.dog is not None and self._wakes:
            self.dog.join(2)
