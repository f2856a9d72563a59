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

Structure (``rsched/expired/``): :mod:`~rsched.expired.arming` (:func:`arm`,
:func:`disarm`), :mod:`~rsched.expired.options` (the runner's options, checked
once before any Redis I/O), :mod:`~rsched.expired.notify` (patterns and the
server's ``notify-keyspace-events``), :mod:`~rsched.expired.topology` (one
:class:`~rsched.expired.topology.Node` per primary, and the cluster's list of
primaries), :mod:`~rsched.expired.fire` (the claim of one firing, shared by
both paths), :mod:`~rsched.expired.subscribe` (the event path),
:mod:`~rsched.expired.sweep` (the backup sweep), and this module: the runner
that starts them and runs the handlers (:mod:`rsched.runtime.handlers`).
"""

from __future__ import annotations

import queue as queue_mod
import random
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from rsched.core import clients
from rsched.core.errors import BadInput, ConfigError, map_error
from rsched.core.keys import ExpiredKeys
from rsched.expired.arming import arm, disarm
from rsched.expired.model import Firing, Node, node_from
from rsched.expired.notify import check_notify, glob_regex, one_line
from rsched.expired.options import (
    DEFAULT_CLAIM_WINDOW_MS,
    DEFAULT_GRACE_MS,
    DEFAULT_SWEEP_GRACE_MS,
    ExpiredOptions,
    expired_options,
)
from rsched.expired.subscribe import SubscribeMixin
from rsched.expired.sweep import SweepMixin
from rsched.runtime import handlers as run_handlers
from rsched.runtime import systemd
from rsched.runtime.loop import LineLog, stop_signals

if TYPE_CHECKING:  # pragma: no cover
    from rsched.context import Context

__all__ = ["ExpiredRunner", "Firing", "Stats", "arm", "disarm"]


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


class ExpiredRunner(SubscribeMixin, SweepMixin):
    """Run ``handler`` once per expiry of a key matching ``pattern`` (a Redis glob).

    >>> ExpiredRunner(rs, "order:timeout:*", ["./close-order"], backup_sweep=True).run()

    ``db`` is the database whose keys are watched (default: the connection's);
    the claim and sweep keys live there too, so arm() must use that database.
    ``handler`` is a command (argv list or a string split like a shell, never
    run by one) or a Python callable ``fn(firing)``. ``run()`` blocks until
    SIGTERM/SIGINT or :meth:`stop`; running handlers then get ``grace_ms``.

    Redis Cluster (``rs.redis`` a cluster client): the runner subscribes on every
    primary, follows the list of primaries as it changes (failover, nodes added
    or removed) and sweeps each node's per-slot armed sets; ``db`` must be 0.
    ``nodes`` (single Redis only) subscribes through these clients instead of
    ``rs.redis``, one subscription each.
    """

    def __init__(
        self,
        rs: Context,
        pattern: str = "",
        handler: Any = None,
        *,
        options: ExpiredOptions | None = None,
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
        if options is None:
            options = expired_options(
                pattern,
                handler,
                db=db,
                backup_sweep=backup_sweep,
                concurrency=concurrency,
                timeout_ms=timeout_ms,
                claim_window_ms=claim_window_ms,
                sweep_grace_ms=sweep_grace_ms,
                grace_ms=grace_ms,
                set_notify=set_notify,
            )
        self.options = options
        db = options.db
        self.pattern = options.pattern
        self._match = glob_regex(self.pattern).fullmatch
        if callable(options.handler):
            self._fn: Callable[[Firing], Any] | None = options.handler
            self._argv: list[str] | None = None
        else:
            self._fn = None
            self._argv = list(options.handler)
        self.concurrency = options.concurrency
        self.timeout_ms = options.timeout_ms
        self.claim_window_ms = options.claim_window_ms
        self.sweep_grace_ms = options.sweep_grace_ms
        self.grace_ms = options.grace_ms
        self.backup_sweep = options.backup_sweep
        self.set_notify = options.set_notify
        from rsched.core.conn import is_cluster

        self.cluster = is_cluster(rs.redis)
        self._nodes_lock = threading.Lock()
        self._seeds = []
        if self.cluster:
            if db:
                raise BadInput("--db", f"{db!r}: Redis Cluster has database 0 only")
            if nodes:
                raise BadInput("nodes", "on Redis Cluster the runner finds the primaries itself")
            self.db = 0
            self._template, self._conn_class = clients.node_options(rs.redis)
            self.nodes = [self._new_node(p.host, int(p.port)) for p in rs.redis.get_primaries()]
            self._seeds = [
                (n.host, int(n.port)) for n in rs.redis.nodes_manager.startup_nodes.values()
            ]
        else:
            base_db = int(rs.redis.connection_pool.connection_kwargs.get("db", 0) or 0)
            self.db = base_db if db is None else db
            given = list(nodes) if nodes else [rs.redis]
            self.nodes = [node_from(c, self.db, f"node{i}") for i, c in enumerate(given)]
            for n in self.nodes:
                n.sets[-1] = 0.0  # the one armed set, looked at after the first subscription
        self.keys = ExpiredKeys.for_namespace(rs.namespace)
        self._slot_keys = {}
        self._topo_kick = threading.Event()
        self._redirect_nodes = {}
        self.channel = f"__keyevent@{self.db}__:expired"
        self.verbose = verbose
        self.quiet = quiet
        self._logger = LineLog("expired", verbose=verbose, quiet=quiet, sink=log)
        self._install_signals = install_signals
        ident = rs.identity()
        self.id = f"{ident['host']}:{ident['pid']}:{secrets.token_hex(3)}"
        self.stats = Stats()
        self._rnd = random.Random()
        self._stop = threading.Event()
        #: Stopped by SIGINT (Ctrl-C): ``run expired`` then exits 130, as documented.
        self.interrupted = False
        self._stop_reason = ""
        self._grace_deadline = 0.0
        self._wake = threading.Event()
        self._work = queue_mod.SimpleQueue()
        self._lock = threading.Lock()
        self._pending = 0  # queued + running firings
        self._running: dict[int, run_handlers.HandlerRun] = {}
        self._threads: list[threading.Thread] = []
        self._workers: list[threading.Thread] = []
        self._fatal: BaseException | None = None
        self._foreign_warned = False
        self._retired = []

    def stop(self, reason: str = "stop requested") -> None:
        """Stop listening; running handlers get ``grace_ms``. A second call kills them now."""
        if reason == "SIGINT":
            self.interrupted = True
        if self._stop.is_set():
            self._grace_deadline = time.monotonic()
        else:
            self._stop_reason = reason
            self._grace_deadline = time.monotonic() + self.grace_ms / 1000.0
            self._stop.set()
        self._wake.set()
        self._topo_kick.set()
        for n in list(self.nodes):
            n.halt.set()
            n.kick.set()

    def run(self) -> Stats:
        """Check the server's notify config, subscribe, fire until stopped."""
        if self.cluster:
            try:
                self._refresh_topology(start_threads=False)
            except redis.RedisError as exc:
                raise map_error(exc) from exc
        for n in self.nodes:
            try:
                check_notify(n.cmd, self.set_notify, self._node_log(n))
            except redis.RedisError as exc:
                raise map_error(exc) from exc
            except ConfigError as exc:
                if not self.cluster:
                    raise
                raise ConfigError(f"Redis Cluster primary {n.name}: {exc}") from None
        with stop_signals(self.stop, self._install_signals):
            try:
                self._start()
                self._main()
            except BaseException:
                self._kill_running("shutdown")
                raise
            finally:
                self._close()
        if self._fatal is not None:
            raise self._fatal
        s = self.stats
        self._log(
            "info",
            f"stopped: {s.fired} fired ({s.swept} by the sweep), {s.ok} ok, {s.failed} failed, "
            f"{s.duplicates} duplicates skipped" + (f", {s.dropped} not run" if s.dropped else ""),
        )
        return self.stats

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
            self._start_node(n)
        if self.cluster:
            t = threading.Thread(
                target=self._guard_topology, name="rsched-expired-topology", daemon=True
            )
            t.start()
            self._threads.append(t)

    def _start_node(self, n: Node) -> None:
        t = threading.Thread(
            target=self._guard, args=(self._listen, n), name=f"rsched-sub-{n.name}", daemon=True
        )
        t.start()
        n.threads.append(t)
        if self.backup_sweep:
            t = threading.Thread(
                target=self._guard,
                args=(self._sweep_loop, n),
                name=f"rsched-sweep-{n.name}",
                daemon=True,
            )
            t.start()
            n.threads.append(t)

    def _describe_handler(self) -> str:
        if self._argv is not None:
            return " ".join(self._argv)
        fn = self._fn
        return f"python:{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', fn)}"

    def _guard(self, target: Callable[[Node], None], node: Node) -> None:
        """A listener or sweeper that meets a non-transient error stops the runner."""
        try:
            target(node)
        except BaseException as exc:  # noqa: BLE001 - reported by run()
            err = map_error(exc) if isinstance(exc, Exception) else exc
            if self._fatal is None:
                self._fatal = err
            self._log("error", f"{one_line(err)}; stopping")
            self.stop("fatal error")

    def _close(self) -> None:
        self._stop.set()
        self._topo_kick.set()
        with self._nodes_lock:
            nodes = list(self.nodes) + list(self._retired) + list(self._redirect_nodes.values())
        for n in nodes:
            n.halt.set()
            n.kick.set()
        for _ in self._workers:
            self._work.put(None)
        for t in self._threads + [t for n in nodes for t in n.threads]:
            t.join(timeout=2.0)
        for n in nodes:
            try:
                n.cmd.connection_pool.disconnect()
            except Exception:  # noqa: BLE001
                pass
        systemd.stopping()

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
            c.kill(reason)
        if children or left > 0:
            self._log(
                "info",
                f"stopping now: killed {len(children)} running handler(s)"
                + (f"; {left} claimed firing(s) were not run" if left > 0 else ""),
            )

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
            done = run_handlers.call(self._fn, f, catch=Exception)
            if not done.ok:
                self._log("error", f"{f.key!r}: handler failed: {done.error}")
                return False
            self._log("debug", f"{f.key!r}: ok ({done.duration_ms}ms)")
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
        run = run_handlers.HandlerRun(
            run_handlers.Command(
                [*self._argv, f.key],  # the key is data: one argv entry, never a shell word
                env=env,
                stdin=f.value if f.value is not None else None,
                timeout_s=self.timeout_ms / 1000.0 if self.timeout_ms else None,
            )
        ).start()
        ident = id(run)
        with self._lock:
            self._running[ident] = run
        try:
            if self._stop.is_set() and time.monotonic() >= self._grace_deadline:
                run.stop("shutdown", grace_s=0)
            res = run.wait()
        finally:
            with self._lock:
                self._running.pop(ident, None)
        if res.ok:
            self._log("debug", f"{f.key!r}: ok ({res.duration_ms}ms)")
            return True
        self._log(
            "error",
            f"{f.key!r}: handler {'timed out' if res.timed_out else 'failed'}: {one_line(res.describe())}",
        )
        return False
