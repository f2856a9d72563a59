"""Keyspace-notification triggers: run a handler when a key expires
(``rsched run expired``; the seeds' "基于 Redis 键空间通知" recipe), made as safe as
that recipe can be.

**The reliable way to run something later is the sorted-set queue**
(``rsched add --in 30m`` + ``rsched run consumer``): tasks survive restarts and
disconnections, are leased, retried and dead-lettered. Keyspace events are
fire-and-forget Pub/Sub messages:

* an event published while no subscriber is connected (restart, network
  blip, a subscriber too slow for its output buffer) is **lost**;
* Redis publishes ``expired`` when it actually deletes the key: on access
  (lazy expiry) or when its background cycle samples it (active expiry). That
  is usually within ~100 ms of the TTL, but **may be late** (seconds, on a busy
  server with many keys with TTLs);
* the server must publish them: ``notify-keyspace-events`` must contain ``E``
  and ``x`` (or ``A``); ``CONFIG SET notify-keyspace-events Ex``.

What this module adds:

* **Once across subscribers.** Every subscriber of ``__keyevent@DB__:expired``
  receives every event. Each firing is claimed in ``expired-fire-4`` before the
  handler runs, so N ``run expired`` processes on one pattern run it once. A
  key armed with :func:`arm` is claimed by removing its sweep entry (exact, no
  window). A key set with PX by other code is claimed with ``SET claim NX PX
  window`` (default 10 s): the first subscriber wins; the window is also why
  **a second expiry of the same, un-armed key within the window is taken for a
  duplicate and not run**, and why a subscriber that receives an event more
  than a window late (stopped, swapped out) could run it a second time.
* **The backup sweep.** :func:`arm` sets the trigger key with PX *and* records
  its expiry (the key's own ``PEXPIRETIME``) in a sorted set, in one Lua call.
  A ``--backup-sweep`` subscriber also fires entries that are overdue by
  ``sweep_grace_ms`` whose key is gone: events lost while every subscriber was
  down or disconnected, and keys Redis had not yet expired (the sweep's
  ``PTTL`` makes Redis expire them then). Event and sweep claim through the
  same script, so each arming fires once. The sweep wakes at the next entry's
  expiry + grace, at most every 5 s, at least 200 ms apart, and right after
  each (re)subscription. Cancel an armed trigger with :func:`disarm`: a plain
  ``DEL`` looks to the sweep like an expiry whose event was lost.
* **Once per namespace, not per pattern.** The claim is per key name in the
  namespace: subscribers whose patterns overlap share each key, whichever
  claims first runs it. Give different handlers of the same keys different
  ``--namespace`` values (and arm with the one whose sweep should fire them).
* **After the claim it is at most once.** A subscriber killed after claiming
  and before its handler finished does not run it again; nothing retries a
  failed handler. Work that must happen belongs in the queue.

Handlers: a command (argv, never a shell) gets the key's name as its last
argument and in ``RSCHED_KEY``, plus ``RSCHED_PATTERN``, ``RSCHED_DB``,
``RSCHED_FIRED_BY`` (``event`` | ``sweep``), ``RSCHED_FIRED_AT`` and, for armed
keys, ``RSCHED_EXPIRE_AT`` (when it was due) and the value given to
:func:`arm` on stdin. A Python callable gets a :class:`Firing`.

Structure: one :class:`_Node` per primary holds a Pub/Sub subscription and a
sweeper; a single Redis has one. Keyevent notifications are local to the node
that expires the key, so on a cluster there must be one node per primary (see
:class:`ExpiredRunner`).
"""

from __future__ import annotations

import queue as queue_mod
import random
import re
import secrets
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis

from rsched import systemd
from rsched.errors import BadInput, ConfigError, RedisUnavailable
from rsched.keys import ExpiredKeys
from rsched.proc import Child, child_env, split_command
from rsched.scripts import Scripts, map_error
from rsched.timeutil import iso

if TYPE_CHECKING:  # pragma: no cover
    from rsched.client import Rsched

#: How long the claim of an un-armed key's firing lasts (see the module docstring).
DEFAULT_CLAIM_WINDOW_MS = 10_000
#: The sweep leaves an expiry this long to the event path before firing it itself.
DEFAULT_SWEEP_GRACE_MS = 1_000
#: Running handlers get this long to finish after SIGTERM before they are killed.
DEFAULT_GRACE_MS = 30_000
SWEEP_MAX_INTERVAL_S = 5.0
SWEEP_MIN_INTERVAL_S = 0.2
SWEEP_PAGE = 500
#: Due entries looked at per sweep (those of other patterns are skipped, not fired).
SWEEP_SCAN_BUDGET = 5_000
#: A subscription that does not answer PING within this is reconnected.
HEALTH_INTERVAL_S = 5.0
RECONNECT_MAX_S = 5.0
#: Events read and claimed in one pipelined batch at most.
CLAIM_BATCH = 256

NOTIFY_FIX = "CONFIG SET notify-keyspace-events Ex"

_TRANSIENT = (
    RedisUnavailable,
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.BusyLoadingError,
)


# --------------------------------------------------------------------------- helpers


def _b(text: str) -> bytes:
    """A key name as Redis holds it (key names are bytes; ours round-trip via surrogateescape)."""
    return text.encode("utf-8", "surrogateescape")


def _s(data: bytes | str) -> str:
    return data if isinstance(data, str) else data.decode("utf-8", "surrogateescape")


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A Redis glob (as in ``SCAN MATCH`` / ``PSUBSCRIBE``: ``*``, ``?``, ``[abc]``,
    ``[^a-z]``, ``\\`` escapes) as a compiled regular expression."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "\\" and i + 1 < n:
            i += 1
            out.append(re.escape(pattern[i]))
        elif c == "[":
            j = i + 1
            neg = j < n and pattern[j] == "^"
            if neg:
                j += 1
            items: list[str] = []
            while j < n and pattern[j] != "]":
                if pattern[j] == "\\" and j + 1 < n:
                    j += 1
                    items.append(re.escape(pattern[j]))
                elif pattern[j] == "-" and items and j + 1 < n and pattern[j + 1] != "]":
                    items.append("-")
                else:
                    items.append(re.escape(pattern[j]))
                j += 1
            if j >= n:  # no closing bracket: Redis matches up to the end, we take "[" literally
                out.append(re.escape(c))
            else:
                body = "".join(items)
                out.append(
                    f"[{'^' if neg else ''}{body}]" if body else ("[^\\s\\S]" if not neg else ".")
                )
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out), re.S)


def check_pattern(pattern: str, field: str = "--pattern") -> str:
    if not isinstance(pattern, str) or not pattern:
        raise BadInput(field, "is empty; give a glob of key names, like 'order:timeout:*'")
    if len(pattern) > 1024 or "\0" in pattern:
        raise BadInput(field, f"{pattern[:60]!r}… must be 1-1024 characters without NUL")
    try:
        glob_regex(pattern)
    except re.error as exc:
        raise BadInput(field, f"{pattern!r} is not a valid glob ({exc})") from None
    return pattern


def notify_flags_ok(value: str) -> bool:
    """Does ``notify-keyspace-events`` publish ``__keyevent@DB__:expired``?"""
    return "E" in value and ("x" in value or "A" in value)


def _with_expired_events(value: str) -> str:
    out = value
    if "E" not in out:
        out += "E"
    if "x" not in out and "A" not in out:
        out += "x"
    return out


def check_notify(
    client: redis.Redis, set_notify: bool = False, log: Callable[[str, str], None] | None = None
) -> str:
    """Refuse (:class:`ConfigError`) when the server does not publish expiry events;
    with ``set_notify`` turn them on (``CONFIG SET``: changes the server's config).

    Returns "ok", "set" or "unverified" (``CONFIG`` denied: a warning is logged)."""
    log = log or (lambda _level, _msg: None)
    try:
        got = client.config_get("notify-keyspace-events")
    except redis.ResponseError as exc:
        log(
            "warning",
            f"could not verify notify-keyspace-events (CONFIG GET refused: {_one_line(exc)}); "
            f"if expiry events are off nothing will fire ({NOTIFY_FIX})",
        )
        return "unverified"
    except redis.RedisError as exc:
        raise map_error(exc) from exc
    value = ""
    for k, v in dict(got).items():
        if _s(k or b"") == "notify-keyspace-events":
            value = _s(v or b"")
    if notify_flags_ok(value):
        return "ok"
    shown = repr(value) if value else "'' (off)"
    if not set_notify:
        merged = _with_expired_events(value)
        raise ConfigError(
            f"notify-keyspace-events is {shown}: the server does not publish key-expiry "
            f"events, so nothing would fire. Fix: redis-cli {NOTIFY_FIX}"
            + (
                f" (keeping your flags: CONFIG SET notify-keyspace-events {merged})"
                if value
                else ""
            )
            + ", and the same in redis.conf to survive a restart; or pass --set-notify"
        )
    new = _with_expired_events(value)
    try:
        client.config_set("notify-keyspace-events", new)
    except redis.ResponseError as exc:
        raise ConfigError(
            f"--set-notify: CONFIG SET notify-keyspace-events {new} was refused "
            f"({_one_line(exc)}); ask an administrator to run {NOTIFY_FIX}"
        ) from None
    except redis.RedisError as exc:
        raise map_error(exc) from exc
    log(
        "info",
        f"set notify-keyspace-events {new} (was {shown}) on the server: a runtime change, "
        "lost on restart unless redis.conf says the same (or CONFIG REWRITE)",
    )
    return "set"


def _one_line(text: Any) -> str:
    s = str(text).strip()
    return " | ".join(line.strip() for line in s.splitlines() if line.strip())[:500]


def _ttl_ms(value: Any, field: str = "ttl_ms") -> int:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise BadInput(field, f"{value!r} is not a positive number of milliseconds")
    if isinstance(value, str):
        from rsched.timeutil import parse_duration

        return parse_duration(value, field)
    if value <= 0:
        raise BadInput(field, f"{value!r} is not a positive number of milliseconds")
    return int(value)


def _check_key(key: str | bytes, field: str = "key") -> bytes:
    raw = key if isinstance(key, bytes) else _b(str(key))
    if not raw:
        raise BadInput(field, "is empty")
    return raw


# --------------------------------------------------------------------------- library


def arm(rs: Rsched, key: str | bytes, ttl_ms: int | str, value: str | bytes = "1") -> int:
    """Set trigger ``key`` to ``value`` with a TTL *and* record it for the backup
    sweep, in one Lua call (the entry's time is the key's own expiry). Returns
    the expiry, in ms since the epoch by the server's clock.

    >>> arm(rs, "order:timeout:1001", 30 * 60_000, value='{"order": 1001}')

    Arming a key again replaces its expiry. ``value`` reaches the handler on
    stdin. Cancel with :func:`disarm`, not ``DEL``.
    """
    raw = _check_key(key)
    ttl = _ttl_ms(ttl_ms)
    ek = ExpiredKeys.for_namespace(rs.namespace)
    out = rs.scripts("expired-arm-3", [raw, ek.armed, ek.values], [ttl, value])  # type: ignore[list-item]
    return int(out[0])


def disarm(rs: Rsched, key: str | bytes) -> bool:
    """Cancel a trigger: delete the key and its sweep entry together. True when it was armed."""
    raw = _check_key(key)
    ek = ExpiredKeys.for_namespace(rs.namespace)
    out = rs.scripts("expired-disarm-3", [raw, ek.armed, ek.values], [])  # type: ignore[list-item]
    return bool(int(out[1]))


@dataclass(slots=True)
class Firing:
    """One claimed expiry, as a Python handler gets it."""

    key: str  # surrogate-escaped if the name is not UTF-8
    source: str  # "event" | "sweep"
    fired_ms: int  # server clock at the claim
    expire_ms: int | None  # when the armed key was due (None: not armed)
    value: bytes | None  # what arm() stored (None: not armed)

    @property
    def expire_at(self) -> str | None:
        return iso(self.expire_ms)

    @property
    def fired_at(self) -> str:
        return iso(self.fired_ms) or ""


@dataclass
class Stats:
    fired: int = 0  # claimed by this process (event + sweep)
    swept: int = 0  # of which by the sweep
    ok: int = 0
    failed: int = 0
    duplicates: int = 0  # events another process (or the sweep) had fired
    dropped: int = 0  # claimed but not run (stopped first; NUL in the key name)

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


# --------------------------------------------------------------------------- nodes


@dataclass
class _Node:
    """One primary: a subscription to its expiry events and (optionally) a sweeper.

    A single Redis has one. ``cmd`` runs the claim scripts; it must be the node
    that holds the trigger keys (keyevent messages are published by the node
    that expires the key, and only there)."""

    name: str
    kwargs: dict[str, Any]  # connection kwargs (decode_responses off: key names are bytes)
    connection_class: Any
    cmd: redis.Redis = field(init=False)
    scripts: Scripts = field(init=False)
    kick: threading.Event = field(default_factory=threading.Event)
    subscribed: bool = False
    ever_subscribed: bool = False
    sweep_next_ms: int = -1

    def __post_init__(self) -> None:
        self.cmd = self.client()
        self.scripts = Scripts(self.cmd)

    def client(self, **over: Any) -> redis.Redis:
        kw = {**self.kwargs, **over}
        return redis.Redis(
            connection_pool=redis.ConnectionPool(connection_class=self.connection_class, **kw)
        )


def _node_from(client: redis.Redis, db: int | None, name: str) -> _Node:
    pool = client.connection_pool
    kwargs = dict(pool.connection_kwargs)
    kwargs["decode_responses"] = False
    if db is not None:
        kwargs["db"] = db
    kwargs.pop("client_name", None)
    return _Node(name, kwargs, pool.connection_class)


# --------------------------------------------------------------------------- runner


class ExpiredRunner:
    """Run ``handler`` once per expiry of a key matching ``pattern`` (a Redis glob).

    >>> ExpiredRunner(rs, "order:timeout:*", ["./close-order"], backup_sweep=True).run()

    ``db`` is the database whose keys are watched (default: the connection's);
    the claim and sweep keys live there too, so arm() must use that database.
    ``handler`` is a command (argv list or a string split like a shell, never
    run by one) or a Python callable ``fn(firing)``. ``run()`` blocks until
    SIGTERM/SIGINT or :meth:`stop`; running handlers then get ``grace_ms``.

    Cluster: pass ``nodes`` (one client per primary) to subscribe on each; the
    key layout of :class:`~rsched.keys.ExpiredKeys` is single-Redis for now.
    """

    def __init__(
        self,
        rs: Rsched,
        pattern: str,
        handler: Any,
        *,
        db: int | None = None,
        backup_sweep: bool = False,
        concurrency: int = 1,
        timeout_ms: int | None = None,
        claim_window_ms: int = DEFAULT_CLAIM_WINDOW_MS,
        sweep_grace_ms: int = DEFAULT_SWEEP_GRACE_MS,
        grace_ms: int = DEFAULT_GRACE_MS,
        set_notify: bool = False,
        nodes: Sequence[redis.Redis] | None = None,
        log: Callable[[str], None] | None = None,
        verbose: int = 0,
        quiet: bool = False,
        install_signals: bool | None = None,
    ):
        self.rs = rs
        self.pattern = check_pattern(pattern)
        self._match = glob_regex(self.pattern).fullmatch
        if callable(handler) and not isinstance(handler, str | list | tuple):
            self._fn: Callable[[Firing], Any] | None = handler
            self._argv: list[str] | None = None
        else:
            self._fn = None
            self._argv = split_command(handler, "--handler")
        if (
            not isinstance(concurrency, int)
            or isinstance(concurrency, bool)
            or not (1 <= concurrency <= 1024)
        ):
            raise BadInput("--concurrency", f"{concurrency!r} is not a whole number from 1 to 1024")
        self.concurrency = concurrency
        self.timeout_ms = timeout_ms
        self.claim_window_ms = int(claim_window_ms)
        if self.claim_window_ms < 100:
            raise BadInput(
                "--claim-window", f"{claim_window_ms}ms is too short; give at least 100ms"
            )
        self.sweep_grace_ms = int(sweep_grace_ms)
        self.grace_ms = int(grace_ms)
        self.backup_sweep = bool(backup_sweep)
        self.set_notify = bool(set_notify)
        if db is not None and (isinstance(db, bool) or not isinstance(db, int) or db < 0):
            raise BadInput("--db", f"{db!r} is not a database number (0 or more)")
        from rsched.conn import is_cluster

        if is_cluster(rs.redis):
            raise ConfigError(
                "run expired does not work on Redis Cluster yet: its claim and sweep keys "
                "would have to share each trigger key's slot; use the task queue "
                "(rsched add --in / run consumer), which does"
            )
        base_db = int(rs.redis.connection_pool.connection_kwargs.get("db", 0) or 0)
        self.db = base_db if db is None else db
        clients = list(nodes) if nodes else [rs.redis]
        self.nodes = [_node_from(c, self.db, f"node{i}") for i, c in enumerate(clients)]
        self.keys = ExpiredKeys.for_namespace(rs.namespace)
        self.channel = f"__keyevent@{self.db}__:expired"
        self.verbose = verbose
        self.quiet = quiet
        self._log_fn = log
        self._install_signals = install_signals
        ident = rs.identity()
        self.id = f"{ident['host']}:{ident['pid']}:{secrets.token_hex(3)}"
        self.stats = Stats()
        self._rnd = random.Random()
        self._stop = threading.Event()
        self._stop_reason = ""
        self._grace_deadline = 0.0
        self._wake = threading.Event()
        self._work: queue_mod.SimpleQueue[Firing | None] = queue_mod.SimpleQueue()
        self._lock = threading.Lock()
        self._pending = 0  # queued + running firings
        self._running: dict[int, Child] = {}
        self._threads: list[threading.Thread] = []
        self._workers: list[threading.Thread] = []
        self._fatal: BaseException | None = None
        self._foreign_warned = False

    # ------------------------------------------------------------------ public

    def stop(self, reason: str = "stop requested") -> None:
        """Stop listening; running handlers get ``grace_ms``. A second call kills them now."""
        if self._stop.is_set():
            self._grace_deadline = time.monotonic()
        else:
            self._stop_reason = reason
            self._grace_deadline = time.monotonic() + self.grace_ms / 1000.0
            self._stop.set()
        self._wake.set()
        for n in self.nodes:
            n.kick.set()

    def run(self) -> Stats:
        """Check the server's notify config, subscribe, fire until stopped."""
        for n in self.nodes:
            try:
                check_notify(n.cmd, self.set_notify, self._log)
            except redis.RedisError as exc:
                raise map_error(exc) from exc
        old = self._signals_on()
        try:
            self._start()
            self._main()
        except BaseException:
            self._kill_running("shutdown")
            raise
        finally:
            self._close()
            self._signals_off(old)
        if self._fatal is not None:
            raise self._fatal
        s = self.stats
        self._log(
            "info",
            f"stopped: {s.fired} fired ({s.swept} by the sweep), {s.ok} ok, {s.failed} failed, "
            f"{s.duplicates} duplicates skipped" + (f", {s.dropped} not run" if s.dropped else ""),
        )
        return self.stats

    # ------------------------------------------------------------------ logging

    def _log(self, level: str, message: str) -> None:
        if level == "debug" and (not self.verbose or self.quiet):
            return
        if level == "info" and self.quiet:
            return
        prefix = {"error": "error: ", "warning": "warning: "}.get(level, "")
        line = f"rsched expired: {prefix}{message}"
        if self._log_fn is not None:
            self._log_fn(line)
            return
        try:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        except (OSError, ValueError, RuntimeError):
            pass

    # ------------------------------------------------------------------ signals & threads

    def _signals_on(self) -> dict[int, Any]:
        install = self._install_signals
        if install is None:
            install = threading.current_thread() is threading.main_thread()
        old: dict[int, Any] = {}
        if install:
            for sig in (signal.SIGTERM, signal.SIGINT):
                old[sig] = signal.signal(sig, self._on_signal)
        return old

    def _signals_off(self, old: dict[int, Any]) -> None:
        for sig, h in old.items():
            signal.signal(sig, h)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.stop(signal.Signals(signum).name)

    def _start(self) -> None:
        self._log(
            "info",
            f"{self.id}: watching {self.channel} for keys matching {self.pattern!r}"
            + (", with the backup sweep" if self.backup_sweep else "")
            + f"; handler {self._describe_handler()}; concurrency {self.concurrency}",
        )
        for i in range(self.concurrency):
            t = threading.Thread(
                target=self._worker, name=f"rsched-expired-worker-{i}", daemon=True
            )
            t.start()
            self._workers.append(t)
        for n in self.nodes:
            t = threading.Thread(
                target=self._guard, args=(self._listen, n), name=f"rsched-sub-{n.name}", daemon=True
            )
            t.start()
            self._threads.append(t)
            if self.backup_sweep:
                t = threading.Thread(
                    target=self._guard,
                    args=(self._sweep_loop, n),
                    name=f"rsched-sweep-{n.name}",
                    daemon=True,
                )
                t.start()
                self._threads.append(t)

    def _describe_handler(self) -> str:
        if self._argv is not None:
            return " ".join(self._argv)
        fn = self._fn
        return f"python:{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', fn)}"

    def _guard(self, target: Callable[[_Node], None], node: _Node) -> None:
        """A listener or sweeper that meets a non-transient error stops the runner."""
        try:
            target(node)
        except BaseException as exc:  # noqa: BLE001 - reported by run()
            err = map_error(exc) if isinstance(exc, Exception) else exc
            if self._fatal is None:
                self._fatal = err
            self._log("error", f"{_one_line(err)}; stopping")
            self.stop("fatal error")

    def _close(self) -> None:
        self._stop.set()
        for n in self.nodes:
            n.kick.set()
        for _ in self._workers:
            self._work.put(None)
        for t in self._threads:
            t.join(timeout=2.0)
        for n in self.nodes:
            try:
                n.cmd.connection_pool.disconnect()
            except Exception:  # noqa: BLE001
                pass
        systemd.stopping()

    # ------------------------------------------------------------------ the main thread

    def _main(self) -> None:
        ready_sent = False
        wd = systemd.watchdog_interval_s()
        wd_every = wd / 2 if wd else None
        next_wd = 0.0
        stop_logged = False
        while True:
            now = time.monotonic()
            if wd_every is not None and now >= next_wd:
                systemd.watchdog()
                next_wd = now + wd_every
            if not ready_sent and all(n.subscribed for n in self.nodes):
                ready_sent = True
                systemd.ready(f"watching {self.channel} for {self.pattern}")
            if self._stop.is_set():
                if not stop_logged:
                    stop_logged = True
                    systemd.stopping()
                    with self._lock:
                        pending = self._pending
                    if self._fatal is None:
                        self._log(
                            "info",
                            f"stopping ({self._stop_reason}): no new events; "
                            f"{pending} handler(s) running or queued, waiting up to "
                            f"{self.grace_ms / 1000:g}s",
                        )
                with self._lock:
                    pending = self._pending
                if pending == 0:
                    return
                if now >= self._grace_deadline or self._fatal is not None:
                    self._kill_running("shutdown")
                    return
            timeout = 1.0
            if wd_every is not None:
                timeout = min(timeout, max(0.0, next_wd - now))
            if self._stop.is_set():
                timeout = min(timeout, 0.05)
            self._wake.wait(timeout)
            self._wake.clear()

    def _kill_running(self, reason: str) -> None:
        with self._lock:
            children = list(self._running.values())
            left = self._pending - len(children)
        for c in children:
            c.killed = c.killed or reason
            c.signal_group(signal.SIGKILL)
        if children or left > 0:
            self._log(
                "info",
                f"stopping now: killed {len(children)} running handler(s)"
                + (f"; {left} claimed firing(s) were not run" if left > 0 else ""),
            )

    # ------------------------------------------------------------------ subscriptions

    def _listen(self, node: _Node) -> None:
        delay = 0.1
        pattern = _b(self.channel)
        while not self._stop.is_set():
            # socket_timeout: never block a read for long (a frozen server is caught by PING)
            client = node.client(socket_timeout=HEALTH_INTERVAL_S * 2)
            ps = client.pubsub()
            try:
                ps.psubscribe(pattern)
                deadline = time.monotonic() + HEALTH_INTERVAL_S * 2
                while True:
                    msg = ps.get_message(timeout=0.2)
                    if msg is not None and msg.get("type") == "psubscribe":
                        break
                    if time.monotonic() > deadline:
                        raise redis.TimeoutError("no reply to PSUBSCRIBE")
                    if self._stop.is_set():
                        return
                if node.ever_subscribed:
                    # The server may have restarted without our notify setting.
                    try:
                        check_notify(node.cmd, self.set_notify, self._log)
                    except ConfigError as exc:
                        self._log("error", f"{exc} (still subscribed; the sweep still runs)")
                    self._log(
                        "info",
                        f"{node.name}: subscribed again to {self.channel}"
                        + (
                            "; sweeping what expired meanwhile"
                            if self.backup_sweep
                            else "; expiries while disconnected were lost "
                            "(arm() + --backup-sweep recovers them)"
                        ),
                    )
                else:
                    self._log("debug", f"{node.name}: subscribed to {self.channel}")
                node.subscribed = node.ever_subscribed = True
                node.kick.set()  # sweep now: anything that expired before we listened
                self._wake.set()
                delay = 0.1
                self._pump(node, ps)
            except _TRANSIENT as exc:
                node.subscribed = False
                if self._stop.is_set():
                    return
                wait_s = self._rnd.uniform(delay / 2, delay)
                self._log(
                    "error", f"{node.name}: {_one_line(map_error(exc))}; retrying in {wait_s:.1f}s"
                )
                delay = min(RECONNECT_MAX_S, delay * 2)
                self._stop.wait(wait_s)
            finally:
                node.subscribed = False
                try:
                    ps.close()
                    client.connection_pool.disconnect()
                except Exception:  # noqa: BLE001
                    pass

    def _pump(self, node: _Node, ps: Any) -> None:
        """Read events until stopped; claim matching keys in pipelined batches."""
        last_pong = time.monotonic()
        next_ping = last_pong + HEALTH_INTERVAL_S
        while not self._stop.is_set():
            msg = ps.get_message(timeout=0.2)
            batch: list[bytes] = []
            while msg is not None:
                kind = msg.get("type")
                if kind == "pmessage":
                    raw = msg["data"]
                    if isinstance(raw, str):
                        raw = _b(raw)
                    if self._match(_s(raw)):
                        batch.append(raw)
                elif kind == "pong":
                    last_pong = time.monotonic()
                if len(batch) >= CLAIM_BATCH:
                    break
                msg = ps.get_message(timeout=0)
            if batch:
                self._claim_events(node, batch)
            now = time.monotonic()
            if now >= next_ping:
                ps.ping()
                next_ping = now + HEALTH_INTERVAL_S
            if now - last_pong > HEALTH_INTERVAL_S * 2 + 1:
                raise redis.TimeoutError(
                    f"the subscription did not answer PING for {now - last_pong:.0f}s"
                )

    def _fire_args(self, mode: str) -> list[Any]:
        return [mode, self.claim_window_ms, self.sweep_grace_ms, self.id]

    def _fire_keys(self, raw: bytes) -> list[Any]:
        return [raw, self.keys.armed, self.keys.values, _b(self.keys.claim(_s(raw)))]

    def _claim_events(self, node: _Node, batch: list[bytes]) -> None:
        """Claim a batch of expired keys. A claim that cannot reach Redis is retried
        for up to half the claim window, then given up (the sweep recovers armed keys)."""
        t0 = time.monotonic()
        delay = 0.05
        while True:
            try:
                outs = self._run_fire(node, [(raw, "event") for raw in batch])
                break
            except _TRANSIENT as exc:
                if self._stop.is_set() or time.monotonic() - t0 > self.claim_window_ms / 2000.0:
                    self._log(
                        "error",
                        f"could not claim {len(batch)} expired key(s) ({_one_line(map_error(exc))}); "
                        "another subscriber may have run them"
                        + ("; the sweep fires armed ones" if self.backup_sweep else ""),
                    )
                    raise
                time.sleep(self._rnd.uniform(delay / 2, delay))
                delay = min(1.0, delay * 2)
        for raw, out in zip(batch, outs, strict=True):
            self._after_fire(raw, out, "event")

    def _run_fire(self, node: _Node, items: list[tuple[bytes, str]]) -> list[Any]:
        if len(items) == 1:
            raw, mode = items[0]
            return [node.scripts("expired-fire-4", self._fire_keys(raw), self._fire_args(mode))]
        pipe = node.cmd.pipeline(transaction=False)
        for raw, mode in items:
            node.scripts("expired-fire-4", self._fire_keys(raw), self._fire_args(mode), client=pipe)
        try:
            outs = pipe.execute(raise_on_error=False)
        except redis.RedisError as exc:
            raise map_error(exc) from exc
        for o in outs:
            if isinstance(o, Exception):
                raise map_error(o)
        return list(outs)

    def _after_fire(self, raw: bytes, out: list[Any], mode: str) -> None:
        status = _s(out[0])
        key = _s(raw)
        if status == "fire":
            expire = int(out[2])
            firing = Firing(
                key,
                mode,
                int(out[1]),
                expire if expire >= 0 else None,
                out[3] if isinstance(out[3], bytes) else None,
            )
            with self._lock:
                self.stats.fired += 1
                if mode == "sweep":
                    self.stats.swept += 1
                self._pending += 1
            late = f", {int(out[1]) - expire}ms after its expiry" if expire >= 0 else ""
            self._log("debug", f"fire {key!r} (by {mode}{late})")
            self._work.put(firing)
        elif status in ("dup", "stale"):
            self.stats.duplicates += 1
            self._log("debug", f"skip {key!r}: {status}")
        elif status == "extended":
            self._log("debug", f"sweep: {key!r} still exists; its entry follows its new TTL")
        elif status == "persistent":
            self._log(
                "info",
                f"sweep: {key!r} was armed but now exists without a TTL (overwritten without PX?); "
                "it will never expire: dropped from the sweep",
            )

    # ------------------------------------------------------------------ the backup sweep

    def _sweep_loop(self, node: _Node) -> None:
        delay = 0.1
        timeout: float | None = None  # the first sweep waits for the first subscription
        last = -1e18
        while not self._stop.is_set():
            node.kick.wait(timeout)
            node.kick.clear()
            if self._stop.is_set():
                return
            if not node.subscribed:
                timeout = None if not node.ever_subscribed else SWEEP_MAX_INTERVAL_S
                continue
            gap = last + SWEEP_MIN_INTERVAL_S - time.monotonic()
            if gap > 0:
                self._stop.wait(gap)
            try:
                next_ms, now_ms = self._sweep(node)
                delay = 0.1
            except _TRANSIENT as exc:
                wait_s = self._rnd.uniform(delay / 2, delay)
                self._log("error", f"sweep: {_one_line(map_error(exc))}; retrying in {wait_s:.1f}s")
                delay = min(RECONNECT_MAX_S, delay * 2)
                timeout = wait_s
                continue
            last = time.monotonic()
            timeout = SWEEP_MAX_INTERVAL_S
            if next_ms != -1:
                timeout = min(timeout, (next_ms + self.sweep_grace_ms - now_ms + 1) / 1000.0)
            timeout = max(timeout, SWEEP_MIN_INTERVAL_S)

    def _sweep(self, node: _Node) -> tuple[int, int]:
        """Fire the overdue entries of our pattern. Returns (next expiry or -1, server now)."""
        offset = 0
        scanned = 0
        foreign_oldest: int | None = None
        now_ms = next_ms = -1
        while scanned < SWEEP_SCAN_BUDGET and not self._stop.is_set():
            try:
                out = node.scripts(
                    "expired-due-1",
                    [self.keys.armed],
                    [self.sweep_grace_ms, offset, SWEEP_PAGE],
                )
            except redis.RedisError as exc:
                raise map_error(exc) from exc
            now_ms, next_ms = int(out[0]), int(out[1])
            entries = [(bytes(out[i]), int(out[i + 1])) for i in range(2, len(out), 2)]
            scanned += len(entries)
            mine = [raw for raw, _ in entries if self._match(_s(raw))]
            for raw, score in entries:
                if not self._match(_s(raw)):
                    foreign_oldest = score if foreign_oldest is None else min(foreign_oldest, score)
            offset += len(entries) - len(mine)
            for i in range(0, len(mine), CLAIM_BATCH):
                chunk = mine[i : i + CLAIM_BATCH]
                outs = self._run_fire(node, [(raw, "sweep") for raw in chunk])
                for raw, o in zip(chunk, outs, strict=True):
                    self._after_fire(raw, o, "sweep")
            if len(entries) < SWEEP_PAGE:
                break
        if (
            foreign_oldest is not None
            and not self._foreign_warned
            and now_ms - foreign_oldest > 60_000
        ):
            self._foreign_warned = True
            self._log(
                "warning",
                "the backup-sweep set holds armed keys that do not match "
                f"{self.pattern!r} and have been overdue for over a minute: is a "
                "`run expired --backup-sweep` running for their pattern?",
            )
        return next_ms, now_ms

    # ------------------------------------------------------------------ handlers

    def _worker(self) -> None:
        while True:
            firing = self._work.get()
            if firing is None:
                return
            try:
                if self._stop.is_set() and time.monotonic() >= self._grace_deadline:
                    ok = None
                else:
                    ok = self._execute(firing)
            except BaseException as exc:  # noqa: BLE001 - a worker never dies
                self._log("error", f"{firing.key!r}: rsched could not run the handler: {exc!r}")
                ok = False
            with self._lock:
                self._pending -= 1
                if ok is None:
                    self.stats.dropped += 1
                elif ok:
                    self.stats.ok += 1
                else:
                    self.stats.failed += 1
            self._wake.set()

    def _execute(self, f: Firing) -> bool | None:
        if self._fn is not None:
            t0 = time.monotonic()
            try:
                self._fn(f)
            except Exception as exc:  # noqa: BLE001 - the handler's failure is logged
                tail = "".join(traceback.format_exception(exc)[-3:]).strip()
                self._log(
                    "error", f"{f.key!r}: handler failed: {type(exc).__name__}: {exc}\n{tail}"
                )
                return False
            self._log("debug", f"{f.key!r}: ok ({int((time.monotonic() - t0) * 1000)}ms)")
            return True
        assert self._argv is not None
        if "\0" in f.key:
            self._log(
                "error", f"{f.key!r}: a key name with a NUL byte cannot be an argument; not run"
            )
            return None
        env = {
            "RSCHED_KEY": f.key,
            "RSCHED_PATTERN": self.pattern,
            "RSCHED_DB": str(self.db),
            "RSCHED_FIRED_BY": f.source,
            "RSCHED_FIRED_AT": f.fired_at,
        }
        if f.expire_ms is not None:
            env["RSCHED_EXPIRE_AT"] = f.expire_at or ""
        child = Child(
            [*self._argv, f.key],  # the key is data: one argv entry, never a shell word
            env=child_env(env),
            stdin_data=f.value if f.value is not None else None,
        )
        ident = id(child)
        with self._lock:
            self._running[ident] = child
        try:
            if self._stop.is_set() and time.monotonic() >= self._grace_deadline:
                child.stop("shutdown", grace_s=0)
            res = child.wait(self.timeout_ms / 1000.0 if self.timeout_ms else None)
        finally:
            with self._lock:
                self._running.pop(ident, None)
        if res.ok:
            self._log("debug", f"{f.key!r}: ok ({res.duration_ms}ms)")
            return True
        self._log(
            "error",
            f"{f.key!r}: handler {'timed out' if res.timed_out else 'failed'}: {_one_line(res.describe())}",
        )
        return False
