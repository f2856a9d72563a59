"""The ZSet consumer behind ``rsched run consumer``.

One main thread talks to Redis; ``concurrency`` worker threads run handlers;
one "waker" thread blocks on the queues' wake-up markers.

Each turn of the main loop:

1. settles finished runs: one ``ack-9`` per queue for the successes (a batch,
   never a round trip per task), ``fail-10`` for failures (retry after an
   exponential backoff with full jitter, or dead-letter), ``release-4`` for
   tasks given back at shutdown;
2. heartbeats every held task of a queue in one ``heartbeat-2`` call, every
   lease/3; a task whose lease was lost has its handler's process group
   killed and its result dropped (another consumer owns it now);
3. claims up to the free capacity in one ``claim-18`` call per queue (which
   also registers the consumer and reaps expired leases, by the server's
   clock), of the types it has handlers for;
4. when there is nothing to do, sleeps until the earliest of: the next due
   time, the next lease expiry (to reap it), the next heartbeat, the idle
   cadence (to stay registered and see leases other consumers took); the
   waker's ``BZPOPMIN`` on the wake keys cuts the sleep short when an earlier
   task is added.

Idle, a consumer sends two requests per idle cadence (10 s, or its shortest
lease when that is between 5 and 10 s): one ``claim-18`` and one ``BZPOPMIN``
that timed out, 7 commands counting those the script runs (INFO
commandstats), 0.7 a second. ``claim-18`` checks the type of every key
before any write but the registration; the consumer asks for the checks on
its first claim of each queue and after any error, so a namespace collision
still stops it with a clear message.

What runs a task is :mod:`rsched.consumer.handlers` (the configured table, type
-> handler; commands run by :mod:`rsched.runtime.handlers`); the queue options
and the whole consumer configuration, validated before any Redis I/O, are
:mod:`rsched.consumer.options`.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import os
import queue as queue_mod
import random
import secrets
import select
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import redis

from rsched.consumer.handlers import (
    Handler,
    HandlerTable,
    PythonHandler,
    Task,
    command_for,
    handler_table,
)
from rsched.consumer.options import ConsumerOptions, QueueOptions, consumer_options
from rsched.core import clients
from rsched.core.conn import is_cluster
from rsched.core.errors import map_error
from rsched.core.timeutil import iso
from rsched.core.transient import TRANSIENT
from rsched.lua import calls
from rsched.queue import queues as _partitions
from rsched.runtime import handlers as run_handlers
from rsched.runtime import pycall, systemd
from rsched.runtime.loop import LineLog, stop_signals

if TYPE_CHECKING:  # pragma: no cover
    from rsched.context import Context

#: Longest idle sleep: the consumer re-registers, and learns of leases other consumers
#: took, at least this often (also the waker's ``BZPOPMIN`` timeout).
IDLE_CAP_MS = 10_000
#: The idle cadence is the shortest lease when that is shorter than IDLE_CAP_MS (a lease
#: taken just after a claim is then seen before it can expire: reaped on time), but
#: never below this.
IDLE_MIN_MS = 5_000
#: How long a registration lasts without renewal (``rsched queues`` shows live consumers):
#: three idle cadences, as for cron runners.
REGISTRATION_TTL_MS = 30_000
#: Stale leases reaped per claim call.
REAP_LIMIT = 100
#: Due tasks of types this consumer does not run that one claim call parks at most.
PARK_LIMIT = 500
#: Most tasks a consumer with Python callables holds (claimed, not yet settled).
PY_HELD_MAX = 1024
#: A Python slot's prefetch aims at this much work per batch.
PY_BATCH_TARGET_S = 0.05
#: Redis outage backoff cap.
RECONNECT_MAX_S = 5.0
#: A cancelled task's command handler gets SIGTERM, then SIGKILL after the grace
#: (``--grace``), at most this long.
CANCEL_GRACE_MAX_S = 10.0


#: Compact JSON for history records (one encoder, not one per record).
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def backoff_delay_ms(
    attempt: int, base_ms: int, cap_ms: int, rnd: random.Random | None = None
) -> int:
    """Exponential backoff with full jitter: uniform in [0, min(cap, base * 2**(attempt-1))]."""
    exp = min(cap_ms, base_ms * (2 ** min(max(attempt - 1, 0), 40)))
    return int((rnd or random).uniform(0, exp))


class _Notifier:
    """A self-pipe: workers, the waker and signal handlers poke the main loop.

    Safe from a signal handler (only ``os.write``), unlike ``threading.Event``.
    """

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)

    def notify(self) -> None:
        try:
            os.write(self._w, b"x")
        except (BlockingIOError, OSError):
            pass

    def drain(self) -> None:
        try:
            while os.read(self._r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def wait(self, timeout_s: float) -> None:
        try:
            select.select([self._r], [], [], max(0.0, timeout_s))
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass


class _Held:
    """One task this consumer holds (queued locally, running, or awaiting settlement)."""

    __slots__ = (
        "task",
        "handler",
        "claim_mono",
        "claim_server_ms",
        "run",
        "started_mono",
        "cancelled",
        "result",
        "exit_code",
        "error",
        "duration_ms",
        "outcome",
        "progress",
    )

    def __init__(
        self, task: Task, handler: Handler | None, claim_mono: float, claim_server_ms: int
    ):
        self.task = task
        self.handler = handler
        self.claim_mono = claim_mono
        self.claim_server_ms = claim_server_ms
        #: what stops the handler: a command's run, a Python call's control
        self.run: run_handlers.HandlerRun | pycall.CallControl | None = None
        self.started_mono: float | None = None
        self.cancelled: str | None = None  # "lease lost" | "shutdown" | "cancelled"
        self.result: str | None = None  # ok | failed | timeout | unstarted
        self.exit_code: int | None = None
        self.error: str = ""
        self.duration_ms = 0
        #: a command's Outcome (its run log), None for a Python handler
        self.outcome: run_handlers.Outcome | None = None
        self.progress: run_handlers.ProgressWriter | None = None

    def kill(self, reason: str) -> None:
        self.cancelled = reason
        if self.run is not None:
            self.run.kill(reason)

    def cancel(self) -> bool:
        """``rsched cancel`` removed the task: tell a Python handler, SIGTERM a command's
        process group (the caller SIGKILLs it after the grace). True if a child runs."""
        self.cancelled = self.cancelled or "cancelled"
        self.task.cancel_event.set()
        return self.run is not None and self.run.terminate("cancelled")


def _rate_arg(opts: QueueOptions) -> str | None:
    """claim-18's rate argument: the queue's "N WINDOW_MS TEXT" (or "- - -"), then a
    line "N WINDOW_MS TYPE TEXT" per type."""
    rate, per_type = opts.rate_limit, opts.type_rate_limits
    if rate is None and not per_type:
        return None
    lines = ["- - -" if rate is None else f"{rate[0]} {rate[1]} {rate[2]}"]
    lines += [f"{n} {w} {t} {text}" for t, n, w, text in per_type]
    return "\n".join(lines)


def _progress_field(h: _Held) -> dict[str, Any]:
    """The run's last progress report for its history record ({} when none)."""
    last = h.progress.last if h.progress is not None else None
    if last is None:
        return {}
    return {
        "progress": {"fraction": last[0], "message": last[1], "at": iso(last[2]), "at_ms": last[2]}
    }


class _QueueState:
    __slots__ = (
        "name",
        "keys",
        "opts",
        "next_due",
        "next_lease",
        "paused",
        "throttled",
        "last_claim",
        "offset_ms",
        "checked",
    )

    def __init__(self, name: str, keys: Any, opts: QueueOptions):
        self.name = name
        self.keys = keys
        self.opts = opts
        self.next_due = -1  # server ms, -1 none
        self.next_lease = -1
        self.paused = False
        self.throttled = False  # the rate limit holds due tasks back until next_due
        self.last_claim = -1e18  # monotonic seconds
        self.offset_ms = 0.0  # server ms - local monotonic ms
        self.checked = False  # claim-18 checked key types since start / the last error


class Stats:
    def __init__(self) -> None:
        self.claimed = self.ok = self.failed = self.retried = self.dead = 0
        self.lost = self.refused = self.released = self.cancelled = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


# --------------------------------------------------------------------------- consumer


class Consumer:
    """Claim due tasks from ``queues`` and run them with ``handlers``.

    >>> c = rs.consumer(queues=["default"], handlers={"order.close": ["./close-order"]})
    >>> c.run()          # blocks; SIGTERM / SIGINT / c.stop() end it gracefully

    ``lease_ms``, ``max_attempts`` (the default for tasks added without one),
    ``timeout_ms``, ``backoff_ms``, ``backoff_max_ms``, ``concurrency`` and
    ``grace_ms`` default to the ``[queues.Q]`` section of the config file,
    then to built-in defaults (:func:`rsched.consumer.options.consumer_options`;
    or give ``options``, built by it, instead of them and ``queues``). ``burst``
    returns once nothing is due and nothing is running.
    """

    def __init__(
        self,
        rs: Context,
        queues: Sequence[str] = ("default",),
        handlers: Mapping[str, Any] | HandlerTable | None = None,
        concurrency: int | None = None,
        lease_ms: Any = None,
        max_attempts: Any = None,
        backoff_ms: Any = None,
        backoff_max_ms: Any = None,
        timeout_ms: Any = None,
        grace_ms: Any = None,
        burst: bool = False,
        *,
        partitions: int | None = None,
        rate_limit: Any = None,
        type_rate_limits: Any = None,
        options: ConsumerOptions | None = None,
        log: Callable[[str], None] | None = None,
        verbose: int = 0,
        quiet: bool = False,
        install_signals: bool | None = None,
    ):
        self.rs = rs
        self.handlers = handler_table(handlers)
        if options is None:
            options = consumer_options(
                rs.settings,
                queues,
                concurrency=concurrency,
                lease_ms=lease_ms,
                max_attempts=max_attempts,
                backoff_ms=backoff_ms,
                backoff_max_ms=backoff_max_ms,
                timeout_ms=timeout_ms,
                grace_ms=grace_ms,
                partitions=partitions,
                rate_limit=rate_limit,
                type_rate_limits=type_rate_limits,
            )
        self.options = options
        self.concurrency = options.concurrency
        self.grace_ms = options.grace_ms
        self.queues: list[_QueueState] = []
        stored: dict[str, list[str]] = {}
        for q in options.queues:  # a partitioned queue: every partition, each a queue of its own
            stored[q] = _partitions.names(rs, q, options.partitions)
        for q in options.queues:
            for name in stored[q]:
                self.queues.append(_QueueState(name, rs.keys.queue(name), options.per_queue[q]))
        self._by_name = {qs.name: qs for qs in self.queues}
        self.burst = bool(burst)
        self.verbose = verbose
        self.quiet = quiet
        self._logger = LineLog("consumer", verbose=verbose, quiet=quiet, sink=log)
        self._install_signals = install_signals
        ident = rs.identity()
        self.host = str(ident["host"])
        self.pid = int(ident["pid"])
        self.id = f"{self.host}:{self.pid}:{secrets.token_hex(3)}"
        self.stats = Stats()
        min_lease = min(qs.opts.lease_ms for qs in self.queues)
        self._hb_interval_s = min_lease / 3000.0
        self._idle_s = min(IDLE_CAP_MS, max(IDLE_MIN_MS, min_lease)) / 1000.0
        self._commands = self.handlers.has_commands
        # What claim-18 gets: the types we run (registered for `rsched queues`) and as
        # Lua patterns (none: every type, a `*` handler).
        self._handles_json = json.dumps(self.handlers.globs(), separators=(",", ":"))
        self._type_patterns = self.handlers.lua_patterns()
        # EWMA of a Python handler's run time; starts at one task per batch, grows when fast
        self._py_avg_s = PY_BATCH_TARGET_S
        self._rnd = random.Random()

        self._notifier = _Notifier()
        self._held: dict[tuple[str, str], _Held] = {}
        self._results: collections.deque[_Held] = collections.deque()
        self._unsettled: list[_Held] = []
        self._work: queue_mod.SimpleQueue[list[_Held] | None] = queue_mod.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._stopping = False
        #: Stopped by SIGINT (Ctrl-C): ``run consumer`` then exits 130, as documented.
        self.interrupted = False
        self._stop_reason = ""
        self._stop_logged = False
        self._grace_deadline = 0.0
        self._closed = False
        self._next_hb = 0.0
        self._rr = random.randrange(len(self.queues))  # consumers start on different partitions
        self._waker_client: Any = None  # redis.Redis, or a RedisCluster
        self._waker: threading.Thread | None = None
        self._waker_armed = threading.Event()
        self._popped = False
        # Cancellations heard on the queues' cancel channels: (queue, token), and the
        # SIGKILLs due at the end of their grace: (monotonic deadline, held task).
        self._cancels: collections.deque[tuple[str, str]] = collections.deque()
        self._kill_at: list[tuple[float, _Held]] = []
        self._cancel_grace_s = min(self.grace_ms / 1000.0, CANCEL_GRACE_MAX_S)
        self._listener: threading.Thread | None = None
        self._pubsub: Any = None
        self._listening = True  # the cancel listener runs until _close (through the grace)
        self._ready_sent = False
        wd = systemd.watchdog_interval_s()
        self._wd_every_s = wd / 2 if wd else None
        self._next_wd = 0.0

    # ------------------------------------------------------------------ public

    def stop(self, reason: str = "stop requested") -> None:
        """Stop claiming; running handlers get ``grace_ms`` to finish. Safe from a
        signal handler. A second call skips what is left of the grace period."""
        if reason == "SIGINT":
            self.interrupted = True
        if self._stopping:
            self._grace_deadline = time.monotonic()
        else:
            self._stop_reason = reason
            self._grace_deadline = time.monotonic() + self.grace_ms / 1000.0
            self._stopping = True
        self._notifier.notify()

    def run(self) -> Stats:
        """Consume until stopped (or, with ``burst``, until nothing is due or running)."""
        with stop_signals(self.stop, self._install_signals):
            return self._run()

    def _run(self) -> Stats:
        self._start_threads()
        self._log(
            "info",
            f"consumer {self.id} started: queues {', '.join(q.name for q in self.queues)}; "
            f"handlers {self.handlers.describe()}; concurrency {self.concurrency}",
        )
        delay = 0.1
        try:
            while True:
                try:
                    if self._turn():
                        break
                    delay = 0.1
                except TRANSIENT as exc:
                    for qs in self.queues:  # a restart or failover: check key types again
                        qs.checked = False
                    wait_s = self._rnd.uniform(delay / 2, delay)
                    self._log("error", f"{_one_line(map_error(exc))}; retrying in {wait_s:.1f}s")
                    delay = min(RECONNECT_MAX_S, delay * 2)
                    if self._stopping and time.monotonic() >= self._grace_deadline:
                        self._abandon()
                        break
                    self._watchdog(time.monotonic())
                    self._notifier.wait(min(wait_s, self._wd_every_s or wait_s))
                    self._notifier.drain()
        except BaseException:
            # A fatal error (or KeyboardInterrupt without our signal handlers): leave no
            # handler running and give held tasks back if Redis lets us.
            try:
                self._abandon()
            except Exception:  # noqa: BLE001 - the original error is the one to report
                for h in self._held.values():
                    h.kill("shutdown")
            raise
        finally:
            self._close()
            self._unregister()
        s = self.stats
        self._log(
            "info",
            f"consumer {self.id} stopped: {s.ok} ok, {s.failed} failed ({s.dead} dead), "
            f"{s.lost} lost, {s.cancelled} cancelled, {s.released} released",
        )
        return self.stats

    # ------------------------------------------------------------------ logging

    def _log(self, level: str, message: str) -> None:
        self._logger(level, message)

    # ------------------------------------------------------------------ threads

    def _start_threads(self) -> None:
        for i in range(self.concurrency):
            t = threading.Thread(target=self._worker, name=f"rsched-worker-{i}", daemon=True)
            t.start()
            self._workers.append(t)
        keys = [qs.keys.wake for qs in self.queues]
        block_s = self._idle_s + 10.0  # longer than any block
        self._waker_client = clients.clone(self.rs.redis, socket_timeout=block_s, max_connections=2)
        if is_cluster(self.rs.redis):
            # A multi-key BZPOPMIN must stay in one slot: one listener per slot
            # (per queue partition), all on one cluster client of their own.
            by_slot: dict[int, list[str]] = {}
            for k in keys:
                by_slot.setdefault(self._waker_client.keyslot(k), []).append(k)
            groups = list(by_slot.values())
        else:
            groups = [keys]
        for i, group in enumerate(groups):
            name = "rsched-waker" if len(groups) == 1 else f"rsched-waker-{i}"
            t = threading.Thread(target=self._wake_loop, args=(group,), name=name, daemon=True)
            t.start()
            self._waker = self._waker or t
        self._listener = threading.Thread(
            target=self._cancel_loop, name="rsched-cancels", daemon=True
        )
        self._listener.start()

    def _cancel_loop(self) -> None:
        """Listen on the queues' cancel channels (``rsched cancel`` of a running task
        publishes its claim token); hand each to the main loop. A message missed while
        disconnected is not lost work: the task is gone, so the next heartbeat finds
        its lease lost and kills the handler (later, and logged as a lost lease)."""
        channels = {qs.keys.cancel_channel: qs.name for qs in self.queues}
        delay = 0.1
        while self._listening:
            try:
                ps = self._pubsub = self.rs.redis.pubsub(ignore_subscribe_messages=True)
                ps.subscribe(*channels)
                delay = 0.1
                while self._listening:
                    msg = ps.get_message(timeout=1.0)
                    if msg and msg.get("type") == "message":
                        ch, data = msg["channel"], msg["data"]
                        ch = ch.decode() if isinstance(ch, bytes) else ch
                        data = data.decode() if isinstance(data, bytes) else data
                        if ch in channels:
                            self._cancels.append((channels[ch], str(data)))
                            self._notifier.notify()
            except redis.exceptions.NoPermissionError as exc:
                self._log(
                    "error",
                    f"cannot listen for cancellations ({_one_line(exc)}): a running task that "
                    "is cancelled has its handler stopped at the next heartbeat instead; grant "
                    f"+subscribe and &{self.rs.keys.ns}:* (see the least-privilege ACL user in rsched-operations(7))",
                )
                break
            except Exception as exc:  # noqa: BLE001 - the listener never dies
                if not self._listening:
                    break
                if not isinstance(exc, redis.RedisError):
                    self._log("error", f"cancel listener: {_one_line(exc)}; retrying")
                time.sleep(self._rnd.uniform(delay / 2, delay))
                delay = min(RECONNECT_MAX_S, delay * 2)
            finally:
                try:
                    if self._pubsub is not None:
                        self._pubsub.close()
                except Exception:  # noqa: BLE001
                    pass

    def _take_cancels(self, now: float) -> None:
        """Stop the handlers of tasks cancelled while they run; SIGKILL those whose
        grace ran out."""
        while self._cancels:
            qname, token = self._cancels.popleft()
            h = self._held.get((qname, token))
            if h is None or h.cancelled:
                continue
            running = h.cancel()
            self._log(
                "info",
                f"cancelled {h.task.member} in {qname} (token {token}): "
                + (
                    f"stopping its handler (SIGTERM, SIGKILL after {self._cancel_grace_s:g}s)"
                    if running
                    else "it will not run"
                    if h.started_mono is None
                    else "its result will not count"
                ),
            )
            if running:
                self._kill_at.append((now + self._cancel_grace_s, h))
        if self._kill_at:
            due = [(t, h) for t, h in self._kill_at if t <= now]
            for _, h in due:
                if h.run is not None:
                    h.run.kill("cancelled")
            self._kill_at = [(t, h) for t, h in self._kill_at if t > now and h.result is None]

    def _stop_waker(self) -> None:
        """No more BZPOPMIN: a stopping consumer must not swallow a wake-up (such as the one
        its own release pushes) meant for a consumer that can take the work."""
        self._closed = True
        self._waker_armed.set()
        if self._waker_client is not None:  # shuts the socket down under a blocked BZPOPMIN
            clients.close(self._waker_client)

    def _close(self) -> None:
        self._stop_waker()
        self._listening = False
        if self._listener is not None:
            self._listener.join(timeout=2.0)
        for _ in self._workers:
            self._work.put(None)
        systemd.stopping()

    def _unregister(self) -> None:
        """Leave every queue's consumers registry at exit, so that ``rsched queues`` stops
        counting this consumer at once (best effort: if Redis is unreachable the entry
        expires after REGISTRATION_TTL_MS, as a killed consumer's does)."""
        try:
            pipe = self.rs.redis.pipeline(transaction=False)
            for qs in self.queues:
                pipe.zrem(qs.keys.consumers, self.id)
                pipe.hdel(qs.keys.handles, self.id)
            pipe.execute()
        except Exception as exc:  # noqa: BLE001
            self._log("debug", f"could not unregister ({_one_line(exc)}); the entry expires")

    def _wake_loop(self, keys: list[str]) -> None:
        """Block on the wake markers ``keys`` (every watched queue, or on a cluster
        those of one slot); poke the main loop when one pops."""
        assert self._waker_client is not None
        delay = 0.1
        while not self._closed:
            self._waker_armed.wait()
            if self._closed:
                break
            try:
                popped = self._waker_client.bzpopmin(keys, timeout=self._idle_s)
                delay = 0.1
            except Exception as exc:  # noqa: BLE001 - the listener never dies
                if self._closed:
                    # _stop_waker() shut the socket under us; redis-py's pure-Python
                    # parser may then fail with anything (AttributeError seen).
                    break
                if not isinstance(exc, redis.RedisError):
                    self._log("error", f"wake-up listener: {_one_line(exc)}; retrying")
                time.sleep(self._rnd.uniform(delay / 2, delay))
                delay = min(RECONNECT_MAX_S, delay * 2)
                continue
            if popped and self._closed:
                # Popped as the stop came (a BZPOPMIN sent just after _stop_waker() shut
                # the socket reconnects): the wake-up is another consumer's; give it back.
                with contextlib.suppress(Exception):
                    self.rs.redis.zadd(popped[0], {popped[1]: popped[2]})
                break
            if popped:
                # Listen again only when the main loop re-arms (it has room for work).
                self._waker_armed.clear()
                self._popped = True
                self._notifier.notify()

    def _worker(self) -> None:
        while True:
            chunk = self._work.get()
            if chunk is None:
                return
            for h in chunk:
                if self._stopping or h.cancelled:
                    h.result = "unstarted"
                else:
                    try:
                        self._execute(h)
                    except BaseException as exc:  # noqa: BLE001 - a worker never dies
                        h.result, h.error = "failed", f"rsched could not run the handler: {exc!r}"
                    if h.progress is not None:
                        h.progress.close()  # the last report written before the ack
                self._results.append(h)
                if self._commands:
                    self._notifier.notify()
            if not self._commands:
                self._notifier.notify()

    def _execute(self, h: _Held) -> None:
        task = h.task
        h.started_mono = time.monotonic()
        handler = h.handler
        if handler is None:
            h.result, h.error = "failed", f"no handler for {task.type}"
            return
        if isinstance(handler, PythonHandler):
            limit = handler.timeout_ms or self._by_name[task.queue].opts.timeout_ms
            ctl = h.run = pycall.CallControl()  # lease lost, cancel, shutdown stop it
            if h.cancelled:
                ctl.kill(h.cancelled)
            done = pycall.run_call(handler.fn, task, limit / 1000 if limit else None, ctl)
            if done.ok:
                h.result = "ok"
            else:
                h.result = "timeout" if done.timed_out else "failed"
                h.error = done.error[-4000:]
            h.duration_ms = done.duration_ms
            self._py_avg_s = self._py_avg_s * 0.9 + done.duration_s * 0.1
            return
        opts = self._by_name[task.queue].opts
        live = run_handlers.live_log(self.rs, self._by_name[task.queue].keys.live(task.token))
        cmd = command_for(
            task,
            handler,
            opts.timeout_ms,
            log_bytes=run_handlers.log_max_bytes(self.rs),
            on_output=live,
            on_progress=h.progress,
        )
        run = h.run = run_handlers.HandlerRun(cmd)
        run.start()
        if h.cancelled:  # lost / shut down while starting
            h.kill(h.cancelled)
        res = run.wait()
        live.close()
        h.outcome = res
        h.duration_ms = res.duration_ms
        h.exit_code = res.exit_code
        h.result = res.result
        h.error = res.error

    # ------------------------------------------------------------------ the loop

    def _watchdog(self, now: float) -> None:
        """systemd WATCHDOG=1 (Type=notify units with WatchdogSec=): the loop is turning."""
        if self._wd_every_s is not None and now >= self._next_wd:
            systemd.watchdog()
            self._next_wd = now + self._wd_every_s

    def _turn(self) -> bool:
        """One turn of the main loop; True when the consumer should exit."""
        self._notifier.drain()
        now = time.monotonic()
        self._watchdog(now)
        self._take_cancels(now)
        settled = self._settle()
        if self._stopping:
            if not self._stop_logged:
                self._stop_logged = True
                self._stop_waker()
                systemd.stopping()
                running = sum(
                    1
                    for h in self._held.values()
                    if h.started_mono is not None and h.result is None
                )
                self._log(
                    "info",
                    f"stopping ({self._stop_reason}): no new claims; "
                    f"{running} running, waiting up to {self.grace_ms / 1000:g}s",
                )
            if not self._held:
                return True
            if now >= self._grace_deadline:
                self._abandon()
                return True
        if self._held and now >= self._next_hb:
            self._heartbeat()
        claimed_full = False
        all_idle = True
        if not self._stopping:
            claimed_full, all_idle = self._claim_all(now)
            if self._popped:
                self._popped = False
                self._pass_on_wakeup()
        if self.burst and all_idle and not self._held and not self._results and not self._unsettled:
            return True
        if settled or claimed_full:
            return False
        self._sleep(time.monotonic())
        return False

    def _capacity(self) -> tuple[int, int]:
        """(tasks this consumer may hold, tasks a worker takes at once)."""
        if self._commands:
            return self.concurrency, 1
        per_slot = int(PY_BATCH_TARGET_S / max(self._py_avg_s, 1e-7))
        # Two batches per slot (one running, one ready), at most PY_HELD_MAX held in all:
        # a crash re-runs at most that many tasks.
        per_slot = max(1, min(per_slot, PY_HELD_MAX // (2 * self.concurrency)))
        return self.concurrency * per_slot * 2, per_slot

    def _claim_all(self, now: float) -> tuple[bool, bool]:
        """Claim from every queue (round robin) while there is room.

        Returns (filled the room, so more may be due; nothing due anywhere)."""
        capacity, per_slot = self._capacity()
        n = len(self.queues)
        self._rr = (self._rr + 1) % n
        claimed_full = False
        all_idle = True
        for i in range(n):
            qs = self.queues[(self._rr + i) % n]
            free = capacity - len(self._held)
            server_est = qs.offset_ms + now * 1000
            reap_due = qs.next_lease != -1 and qs.next_lease <= server_est
            if free <= 0 and not reap_due and now - qs.last_claim < self._idle_s:
                all_idle = False
                continue
            got = self._claim(qs, max(free, 0), per_slot)
            if free > 0 and got >= free:
                claimed_full = True
            server_now = qs.offset_ms + time.monotonic() * 1000
            if not qs.paused and qs.next_due != -1 and (qs.next_due <= server_now or qs.throttled):
                all_idle = False
        return claimed_full, all_idle

    def _claim(self, qs: _QueueState, n: int, per_slot: int) -> int:
        t0 = time.monotonic()
        out = calls.claim(
            self.rs,
            qs.keys,
            max_tasks=n,
            lease_ms=qs.opts.lease_ms,
            consumer=self.id,
            registration_ttl_ms=REGISTRATION_TTL_MS,
            reap_limit=REAP_LIMIT,
            history_maxlen=self.rs.history_maxlen,
            queue=qs.name,
            default_max_attempts=qs.opts.max_attempts,
            check=not qs.checked,
            handles_json=self._handles_json,
            park_limit=PARK_LIMIT,
            type_patterns=self._type_patterns,
            rate=_rate_arg(qs.opts),
        )
        qs.checked = True
        t1 = time.monotonic()
        mid = (t0 + t1) / 2
        server_now = out.now_ms
        qs.offset_ms = server_now - mid * 1000
        qs.next_due = out.next_due_ms
        qs.next_lease = out.next_lease_ms
        was_paused = qs.paused
        qs.paused, qs.throttled = out.paused, out.throttled
        qs.last_claim = t1
        if qs.paused != was_paused:
            self._log("info", f"queue {qs.name} is {'paused' if qs.paused else 'resumed'}")
        if out.reaped_due or out.reaped_dead:
            self._log(
                "info",
                f"queue {qs.name}: reaped expired leases: {out.reaped_due} back to due, "
                f"{out.reaped_dead} dead",
            )
        if not self._ready_sent:
            self._ready_sent = True
            systemd.ready(f"consuming {', '.join(q.name for q in self.queues)}")
        got = len(out)
        if not got:
            return 0
        if not self._held:
            self._next_hb = t1 + self._hb_interval_s
        chunk: list[_Held] = []
        debug = self.verbose and not self.quiet
        for m, payload, attempt, maxa, token, due, last_error in out.tasks():
            t, _, tid = m.partition(" ")
            try:
                value = json.loads(payload) if payload else None
            except ValueError:
                value = payload
            task = Task(
                t,
                tid,
                qs.name,
                value,
                int(attempt),
                int(maxa),
                int(due),
                str(token),
                payload or "null",
                last_error or None,
            )
            h = _Held(task, self.handlers.get(t), mid, server_now)
            task.reporter = h.progress = run_handlers.ProgressWriter(
                functools.partial(calls.progress, self.rs, qs.keys, m, task.token)
            )
            self._held[(qs.name, task.token)] = h
            if debug:
                self._log(
                    "debug",
                    f"claimed {m} from {qs.name} (attempt {task.attempt} of {task.max_attempts}, "
                    f"due {task.due_at}, {server_now - task.due_ms}ms late)",
                )
            chunk.append(h)
            if len(chunk) >= per_slot:
                self._work.put(chunk)
                chunk = []
        if chunk:
            self._work.put(chunk)
        self.stats.claimed += got
        return got

    def _pass_on_wakeup(self) -> None:
        """The waker took a wake-up marker while this consumer filled up: a task due
        soon would wait for our free slot or another consumer's idle timer. Put the
        marker back for a consumer with room (a full consumer does not listen, so
        this cannot bounce between full consumers for long)."""
        capacity, _ = self._capacity()
        if capacity - len(self._held) > 0:
            return
        due = [qs for qs in self.queues if not qs.paused and qs.next_due != -1]
        if not due:
            return
        qs = min(due, key=lambda q: q.next_due)
        self.rs.redis.zadd(qs.keys.wake, {"w": qs.next_due})

    def _sleep(self, now: float) -> None:
        capacity, _ = self._capacity()
        free = capacity - len(self._held)
        deadlines = [now + self._idle_s]
        if self._wd_every_s is not None:
            deadlines.append(self._next_wd)
        if self._stopping:
            deadlines.append(self._grace_deadline)
        else:
            for qs in self.queues:
                deadlines.append(qs.last_claim + self._idle_s)
                if free > 0 and not qs.paused and qs.next_due != -1:
                    deadlines.append((qs.next_due - qs.offset_ms + 1) / 1000.0)
                if qs.next_lease != -1:
                    deadlines.append((qs.next_lease - qs.offset_ms + 1) / 1000.0)
        if self._held:
            deadlines.append(self._next_hb)
        deadlines.extend(t for t, _ in self._kill_at)
        timeout = min(deadlines) - now
        if timeout <= 0:
            return
        if free > 0 and not self._stopping:
            self._waker_armed.set()
        else:
            self._waker_armed.clear()
        self._notifier.wait(timeout)

    # ------------------------------------------------------------------ heartbeats

    def _heartbeat(self) -> None:
        by_queue: dict[str, list[_Held]] = {}
        for h in self._held.values():
            if not h.cancelled:
                by_queue.setdefault(h.task.queue, []).append(h)
        for qname, hs in by_queue.items():
            qs = self._by_name[qname]
            runs = [(h.task.member, h.task.token) for h in hs]
            res = calls.heartbeat(self.rs, qs.keys, qs.opts.lease_ms, runs)
            for h, ok in zip(hs, res, strict=True):
                if not ok:
                    self._log(
                        "error",
                        f"lease lost for {h.task.member} in {qname} (token {h.task.token}): "
                        "another consumer may run it, or it was cancelled; killing its handler, "
                        "its result will not count",
                    )
                    h.kill("lease lost")
        self._next_hb = time.monotonic() + self._hb_interval_s

    # ------------------------------------------------------------------ settling

    def _history(self, h: _Held, result: str, error: str | None) -> str:
        t = h.task
        started_mono = h.started_mono if h.started_mono is not None else h.claim_mono
        started = int(h.claim_server_ms + (started_mono - h.claim_mono) * 1000)
        return _COMPACT(
            {
                "kind": "task",
                "name": None,
                "queue": t.queue,
                "type": t.type,
                "id": t.id,
                "fire_ms": t.due_ms,
                "started_ms": started,
                "finished_ms": started + h.duration_ms,
                "duration_ms": h.duration_ms,
                "result": result,
                "exit_code": h.exit_code,
                "host": self.host,
                "pid": self.pid,
                "attempt": t.attempt,
                "token": t.token,
                "error": error,
                "claimed_ms": h.claim_server_ms,
                "claimed_at": iso(h.claim_server_ms),
                **_progress_field(h),
            }
        )

    def _settle(self) -> bool:
        """Ack / fail / release what the workers finished. True when anything was settled."""
        results = self._results
        while results:
            self._unsettled.append(results.popleft())
        if not self._unsettled:
            return False
        acks: dict[str, list[_Held]] = {}
        fails: list[_Held] = []
        releases: dict[str, list[_Held]] = {}
        done: set[int] = set()
        for h in self._unsettled:
            if h.cancelled == "lease lost":
                self.stats.lost += 1
                self._forget(h)
                done.add(id(h))
            elif h.cancelled == "cancelled":
                # rsched cancel removed the task and recorded the run `cancelled`
                self.stats.cancelled += 1
                self._forget(h)
                done.add(id(h))
                if h.started_mono is not None:
                    how = f"exit status {h.exit_code}" if h.exit_code is not None else "returned"
                    self._log(
                        "info",
                        f"cancelled {h.task.member} in {h.task.queue}: its handler stopped "
                        f"({how} after {h.duration_ms}ms)",
                    )
            elif h.cancelled or h.result == "unstarted":
                releases.setdefault(h.task.queue, []).append(h)
            elif h.result == "ok":
                acks.setdefault(h.task.queue, []).append(h)
            else:
                fails.append(h)
        try:
            for qname, hs in acks.items():
                self._ack(self._by_name[qname], hs)
                done.update(id(h) for h in hs)
            if fails:
                self._fail(fails)
                done.update(id(h) for h in fails)
            for qname, hs in releases.items():
                self._release(self._by_name[qname], hs)
                done.update(id(h) for h in hs)
        finally:
            self._unsettled = [h for h in self._unsettled if id(h) not in done]
        return True

    def _forget(self, h: _Held) -> None:
        self._held.pop((h.task.queue, h.task.token), None)

    def _ack(self, qs: _QueueState, hs: list[_Held]) -> None:
        runs = [(h.task.member, h.task.token, self._history(h, "ok", None)) for h in hs]
        res = calls.ack(self.rs, qs.keys, self.rs.history_maxlen, runs)
        self._store_logs([h for h, ok in zip(hs, res, strict=True) if ok])
        debug = self.verbose and not self.quiet
        for h, ok in zip(hs, res, strict=True):
            self._forget(h)
            if ok:
                self.stats.ok += 1
                if debug:
                    self._log(
                        "debug",
                        f"ok {h.task.member} in {qs.name} (attempt {h.task.attempt}, {h.duration_ms}ms)",
                    )
            else:
                self.stats.refused += 1
                self._log(
                    "error",
                    f"ack refused for {h.task.member} in {qs.name} (token {h.task.token}): "
                    "its lease expired and it was reaped or claimed again; this run does not count",
                )

    def _store_logs(self, hs: list[_Held]) -> None:
        """The run logs of settled runs (log-put-3), one pipeline, right after their
        records; runs that wrote nothing cost nothing. A failure loses only the logs."""
        todo = [h for h in hs if h.outcome is not None and h.outcome.has_log]
        if not todo:
            return
        try:
            pipe = self.rs.redis.pipeline(transaction=False)
            for h in todo:
                assert h.outcome is not None
                calls.log_put(
                    self.rs,
                    self._by_name[h.task.queue].keys,
                    token=h.task.token,
                    log=h.outcome.log_json(),
                    history_maxlen=self.rs.history_maxlen,
                    client=pipe,
                )
            pipe.execute(raise_on_error=False)
        except Exception as exc:  # noqa: BLE001 - the records are written; logs are extra
            self._log("error", f"could not keep {len(todo)} run log(s): {map_error(exc)}")

    def _fail(self, hs: list[_Held]) -> None:
        todo: list[tuple[_Held, int, dict[str, Any]]] = []
        for h in hs:
            t = h.task
            qs = self._by_name[t.queue]
            delay = backoff_delay_ms(
                t.attempt, qs.opts.backoff_ms, qs.opts.backoff_max_ms, self._rnd
            )
            result = "timeout" if h.result == "timeout" else "failed"
            todo.append(
                (
                    h,
                    delay,
                    {
                        "q": qs.keys,
                        "history_maxlen": self.rs.history_maxlen,
                        "member": t.member,
                        "token": t.token,
                        "error": h.error,
                        "backoff_ms": delay,
                        "history": self._history(h, result, h.error),
                        "result": result,
                        "default_max_attempts": qs.opts.max_attempts,
                    },
                )
            )
        if len(todo) == 1:
            outs: list[Any] = [calls.fail(self.rs, **todo[0][2])]
        else:
            pipe = self.rs.redis.pipeline(transaction=False)
            for _, _, kw in todo:
                calls.fail(self.rs, **kw, client=pipe)
            try:
                replies = pipe.execute(raise_on_error=False)
            except redis.RedisError as exc:
                raise map_error(exc) from exc
            for o in replies:
                if isinstance(o, Exception):
                    raise map_error(o)
            outs = [calls.fail_reply(o) for o in replies]
        self._store_logs(
            [h for (h, _, _), out in zip(todo, outs, strict=True) if out[0] != "stale"]
        )
        for (h, delay, _), out in zip(todo, outs, strict=True):
            self._forget(h)
            what = out[0]
            t = h.task
            err = _one_line(h.error)
            if what == "retry":
                self.stats.failed += 1
                self.stats.retried += 1
                self._log(
                    "debug",
                    f"failed {t.member} in {t.queue} (attempt {t.attempt} of {t.max_attempts}): "
                    f"{err}; retry in {delay}ms",
                )
            elif what == "dead":
                self.stats.failed += 1
                self.stats.dead += 1
                self._log(
                    "debug",
                    f"dead {t.member} in {t.queue} after attempt {t.attempt} of {t.max_attempts}: {err}",
                )
            else:
                self.stats.refused += 1
                self._log(
                    "error",
                    f"failure report refused for {t.member} in {t.queue} (token {t.token}): "
                    "its lease expired and it was reaped or claimed again",
                )

    def _release(self, qs: _QueueState, hs: list[_Held]) -> None:
        n = calls.release(self.rs, qs.keys, [(h.task.member, h.task.token) for h in hs])
        for h in hs:
            self._forget(h)
        self.stats.released += n
        if n:
            self._log("info", f"released {n} unfinished task(s) of {qs.name} back to due")

    def _abandon(self) -> None:
        """End of the grace period: kill what still runs, give every held task back."""
        try:
            self._settle()
        except Exception:  # noqa: BLE001 - what could not be settled is released below
            pass
        left = list(self._held.values())
        if not left:
            return
        for h in left:
            h.kill("shutdown")
        running = sum(1 for h in left if h.run is not None or h.started_mono is not None)
        self._log("info", f"stopping now: killed {running} unfinished handler(s)")
        by_queue: dict[str, list[_Held]] = {}
        for h in left:
            by_queue.setdefault(h.task.queue, []).append(h)
        for qname, hs in by_queue.items():
            try:
                self._release(self._by_name[qname], hs)
            except Exception as exc:  # noqa: BLE001 - best effort; the lease is the backstop
                self._log(
                    "error",
                    f"could not release {len(hs)} task(s) of {qname} ({_one_line(exc)}); "
                    "they return to due when their lease expires",
                )
        self._results.clear()
        self._unsettled.clear()


def _one_line(text: Any) -> str:
    s = str(text).strip()
    return " | ".join(line.strip() for line in s.splitlines() if line.strip())[:500]
