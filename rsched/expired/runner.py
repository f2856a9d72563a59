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
sweeper; a single Redis has one.

**Redis Cluster.** A script may only touch keys of one slot, and the claim
touches the user's trigger key (any name, any slot) with the armed set, values
and claim keys: on a cluster those live in the trigger key's slot, one set per
slot in use (``{ns}:x:{TAG}:armed``, TAG a short string hashing to that slot;
see :class:`~rsched.core.keys.ExpiredKeys`). Keyevent messages are published only by
the node that expires the key, so the runner subscribes on every primary and
claims each event on the node it came from (a slot that moved meanwhile is
followed: MOVED/ASK). It asks for the list of primaries (``CLUSTER SLOTS``)
every 5 s and soon after any connection error: a promoted replica gets a
subscription and a sweeper (and its ``notify-keyspace-events`` is checked, or
set with ``--set-notify``), a node that is no longer a primary has its threads
stopped, and armed sets of slots that moved go to their new node's sweeper.

The sweep cannot look at all 16384 slots every few seconds. Each node's
sweeper knows the armed sets of its slots from ``SCAN MATCH {ns}:x:{*}:armed
TYPE zset`` on that node (never KEYS; 1,000 keys a call) when it
(re)subscribes and every 60 s, and from the slot of every event it sees; it
forgets a set it finds empty. It looks at a known set when the set's next
entry is due (+ grace), and otherwise every max(5 s, 1 s per known set of the
node), at most 60 s apart, all due sets in one pipelined round trip. An idle
runner costs each primary about 0.2 commands/s with nothing armed (PING; plus
``CLUSTER SLOTS`` every 5 s on one node) and about one a second with armed
sets (measured: 0.8-1.0/s with ~20 sets per node). The trade-off: everything
is looked at at once after a (re)subscription, which is what follows a lost
event; but a key that Redis is late to expire (its event not yet published)
in a slot the sweeper does not know yet, or whose set's next entry was later,
is caught by its event when Redis gets to it, by the next SCAN (<= 60 s) or
the set's recheck (<= 60 s), not within the grace. A node's SCAN walks its
whole keyspace once a minute (1,000 keys a call: a node with 1M keys costs
~17 SCAN calls/s).
"""

from __future__ import annotations

import queue as queue_mod
import random
import re
import secrets
import signal
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis

from rsched.core.errors import BadInput, ConfigError, RedisUnavailable, map_error
from rsched.core.keys import ExpiredKeys, key_slot
from rsched.core.timeutil import iso
from rsched.core.transient import TRANSIENT
from rsched.lua.loader import Scripts
from rsched.runtime import systemd
from rsched.runtime.loop import LineLog, stop_signals
from rsched.runtime.proc import Child, child_env, split_command

if TYPE_CHECKING:  # pragma: no cover
    from rsched.context import Context

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
#: Cluster: how often the list of primaries is refreshed (and at once after a
#: connection error, at most every TOPOLOGY_MIN_GAP_S).
TOPOLOGY_INTERVAL_S = 5.0
TOPOLOGY_MIN_GAP_S = 0.5
#: Cluster: how often each node is scanned (SCAN MATCH ... TYPE zset) for the
#: armed sets of its slots, besides after every (re)subscription.
DISCOVER_INTERVAL_S = 60.0
DISCOVER_SCAN_COUNT = 1_000
#: Cluster: a known armed set whose next entry is not due is looked at again
#: every max(5 s, 1 s per known set of the node), at most this far apart
#: (so the rechecks of a node cost about one command per second at most,
#: until it holds more than 60 sets).
SLOT_RECHECK_MAX_S = 60.0
#: Cluster: armed sets swept in one pipelined round trip at most.
SWEEP_PIPELINE = 256

NOTIFY_FIX = "CONFIG SET notify-keyspace-events Ex"

#: The key's slot is served by another node (MOVED) or moving there (ASK).
_REDIRECT = redis.exceptions.AskError
#: Connection options of a cluster client's node that belong to the cluster client.
_CLUSTER_ONLY_KWARGS = (
    "redis_connect_func",
    "oss_cluster_maint_notifications_handler",
    "maint_notifications_config",
    "himport_registry",
    "retry",
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
        from rsched.core.timeutil import parse_duration

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


def _keys_for(rs: Context, raw: bytes) -> ExpiredKeys:
    from rsched.core.conn import is_cluster

    return ExpiredKeys.for_key(rs.namespace, raw, is_cluster(rs.redis))


def arm(rs: Context, key: str | bytes, ttl_ms: int | str, value: str | bytes = "1") -> int:
    """Set trigger ``key`` to ``value`` with a TTL *and* record it for the backup
    sweep, in one Lua call (the entry's time is the key's own expiry). Returns
    the expiry, in ms since the epoch by the server's clock.

    >>> arm(rs, "order:timeout:1001", 30 * 60_000, value='{"order": 1001}')

    Arming a key again replaces its expiry. ``value`` reaches the handler on
    stdin. Cancel with :func:`disarm`, not ``DEL``. On Redis Cluster the sweep
    entry goes to the armed set of the key's own slot (on the key's node).
    """
    raw = _check_key(key)
    ttl = _ttl_ms(ttl_ms)
    ek = _keys_for(rs, raw)
    out = rs.scripts("expired-arm-3", [raw, ek.armed, ek.values], [ttl, value])  # type: ignore[list-item]
    return int(out[0])


def disarm(rs: Context, key: str | bytes) -> bool:
    """Cancel a trigger: delete the key and its sweep entry together. True when it was armed."""
    raw = _check_key(key)
    ek = _keys_for(rs, raw)
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
    that expires the key, and only there). On a cluster the runner adds one for
    each new primary and retires (``halt``) the ones that are no longer primaries.
    """

    name: str
    kwargs: dict[str, Any]  # connection kwargs (decode_responses off: key names are bytes)
    connection_class: Any
    late: bool = False  # added after start (a promoted replica): check its notify config
    cmd: redis.Redis = field(init=False)
    scripts: Scripts = field(init=False)
    kick: threading.Event = field(default_factory=threading.Event)
    #: set when the runner stops or the node is no longer a primary: its threads end
    halt: threading.Event = field(default_factory=threading.Event)
    subscribed: bool = False
    ever_subscribed: bool = False
    #: slot ranges it serves (cluster; from CLUSTER SLOTS)
    ranges: list[tuple[int, int]] = field(default_factory=list)
    #: known armed sets: slot (-1: the single-Redis set) -> when to look at it next (monotonic)
    sets: dict[int, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    rediscover: bool = True  # cluster: SCAN for armed sets before the next sweep
    next_discover: float = 0.0
    threads: list[threading.Thread] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cmd = self.client()
        self.scripts = Scripts(self.cmd)

    def client(self, **over: Any) -> redis.Redis:
        kw = {**self.kwargs, **over}
        return redis.Redis(
            connection_pool=redis.ConnectionPool(connection_class=self.connection_class, **kw)
        )

    def owns(self, slot: int) -> bool:
        return any(lo <= slot <= hi for lo, hi in self.ranges)

    def learn(self, slot: int, at: float) -> bool:
        """Know armed set ``slot`` (look at it by ``at``). True if it was new."""
        with self.lock:
            old = self.sets.get(slot)
            if old is None or old > at:
                self.sets[slot] = at
            return old is None


def _node_from(client: redis.Redis, db: int | None, name: str) -> _Node:
    pool = client.connection_pool
    kwargs = dict(pool.connection_kwargs)
    kwargs["decode_responses"] = False
    if db is not None:
        kwargs["db"] = db
    kwargs.pop("client_name", None)
    return _Node(name, kwargs, pool.connection_class)


def _cluster_template(cluster: Any) -> tuple[dict[str, Any], Any]:
    """Plain-client connection options (and class: TLS or not) for the nodes of
    redis-py cluster client ``cluster``, without its cluster hooks and retries."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    primaries = cluster.get_primaries()
    if not primaries:
        raise RedisUnavailable("the cluster client knows no primary node")
    pool = primaries[0].redis_connection.connection_pool
    kw = {
        k: v
        for k, v in pool.connection_kwargs.items()
        if k not in _CLUSTER_ONLY_KWARGS and not k.startswith(("orig_", "_"))
    }
    kw.pop("client_name", None)
    kw.pop("host", None)
    kw.pop("port", None)
    kw.update(decode_responses=False, db=0, retry=Retry(NoBackoff(), 0))
    return kw, pool.connection_class


def _parse_cluster_slots(
    reply: Any, asked_host: str
) -> dict[tuple[str, int], list[tuple[int, int]]]:
    """``CLUSTER SLOTS`` -> {(host, port) of each primary: its slot ranges}."""
    out: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for entry in reply or []:
        lo, hi, primary = int(entry[0]), int(entry[1]), entry[2]
        host = _s(primary[0] or b"")
        if host == "?":  # an endpoint the node does not know
            continue
        addr = (host or asked_host, int(primary[1]))
        out.setdefault(addr, []).append((lo, hi))
    return out


# --------------------------------------------------------------------------- runner


class ExpiredRunner:
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
        from rsched.core.conn import is_cluster

        self.cluster = is_cluster(rs.redis)
        self._nodes_lock = threading.Lock()
        self._seeds: list[tuple[str, int]] = []
        if self.cluster:
            if db:
                raise BadInput("--db", f"{db!r}: Redis Cluster has database 0 only")
            if nodes:
                raise BadInput("nodes", "on Redis Cluster the runner finds the primaries itself")
            self.db = 0
            self._template, self._conn_class = _cluster_template(rs.redis)
            self.nodes = [self._new_node(p.host, int(p.port)) for p in rs.redis.get_primaries()]
            self._seeds = [
                (n.host, int(n.port)) for n in rs.redis.nodes_manager.startup_nodes.values()
            ]
        else:
            base_db = int(rs.redis.connection_pool.connection_kwargs.get("db", 0) or 0)
            self.db = base_db if db is None else db
            clients = list(nodes) if nodes else [rs.redis]
            self.nodes = [_node_from(c, self.db, f"node{i}") for i, c in enumerate(clients)]
            for n in self.nodes:
                n.sets[-1] = 0.0  # the one armed set, looked at after the first subscription
        self.keys = ExpiredKeys.for_namespace(rs.namespace)
        self._slot_keys: dict[int, ExpiredKeys] = {}
        self._topo_kick = threading.Event()
        self._redirect_nodes: dict[tuple[str, int], _Node] = {}
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
        self._work: queue_mod.SimpleQueue[Firing | None] = queue_mod.SimpleQueue()
        self._lock = threading.Lock()
        self._pending = 0  # queued + running firings
        self._running: dict[int, Child] = {}
        self._threads: list[threading.Thread] = []
        self._workers: list[threading.Thread] = []
        self._fatal: BaseException | None = None
        self._foreign_warned = False
        self._retired: list[_Node] = []

    # ------------------------------------------------------------------ public

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

    # ------------------------------------------------------------------ logging

    def _log(self, level: str, message: str) -> None:
        self._logger(level, message)

    def _node_log(self, node: _Node) -> Callable[[str, str], None]:
        """Log lines about one node: named on a cluster."""
        if not self.cluster:
            return self._log
        return lambda level, message: self._log(level, f"{node.name}: {message}")

    # ------------------------------------------------------------------ threads

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

    def _start_node(self, n: _Node) -> None:
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
        while not node.halt.is_set():
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
                    if node.halt.is_set():
                        return
                if node.ever_subscribed or node.late:
                    # The server may have restarted without our notify setting; a
                    # promoted replica may never have had it.
                    try:
                        check_notify(node.cmd, self.set_notify, self._node_log(node))
                    except ConfigError as exc:
                        self._log(
                            "error", f"{node.name}: {exc} (still subscribed; the sweep still runs)"
                        )
                if node.ever_subscribed:
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
                    self._log(
                        "info" if node.late else "debug",
                        f"{node.name}: subscribed to {self.channel}",
                    )
                node.subscribed = node.ever_subscribed = True
                node.rediscover = True  # look for armed sets again (cluster)
                with node.lock:  # and sweep every known one now
                    for slot in node.sets:
                        node.sets[slot] = 0.0
                node.kick.set()  # sweep now: anything that expired before we listened
                self._wake.set()
                delay = 0.1
                self._pump(node, ps)
            except TRANSIENT as exc:
                node.subscribed = False
                if node.halt.is_set():
                    return
                self._topo_kick.set()
                wait_s = self._rnd.uniform(delay / 2, delay)
                self._log(
                    "error", f"{node.name}: {_one_line(map_error(exc))}; retrying in {wait_s:.1f}s"
                )
                delay = min(RECONNECT_MAX_S, delay * 2)
                node.halt.wait(wait_s)
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
        while not node.halt.is_set():
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

    def _keys(self, raw: bytes) -> ExpiredKeys:
        """The armed set, values and claim keys of trigger key ``raw`` (its slot's, on a cluster)."""
        if not self.cluster:
            return self.keys
        slot = key_slot(raw)
        ek = self._slot_keys.get(slot)
        if ek is None:
            ek = self._slot_keys[slot] = ExpiredKeys.for_slot(self.rs.namespace, slot)
        return ek

    def _fire_keys(self, raw: bytes) -> list[Any]:
        ek = self._keys(raw)
        return [raw, ek.armed, ek.values, _b(ek.claim(_s(raw)))]

    def _claim_events(self, node: _Node, batch: list[bytes]) -> None:
        """Claim a batch of expired keys. A claim that cannot reach Redis is retried
        for up to half the claim window, then given up (the sweep recovers armed keys)."""
        t0 = time.monotonic()
        delay = 0.05
        while True:
            try:
                outs = self._run_fire(node, [(raw, "event") for raw in batch])
                break
            except TRANSIENT as exc:
                if node.halt.is_set() or time.monotonic() - t0 > self.claim_window_ms / 2000.0:
                    self._log(
                        "error",
                        f"could not claim {len(batch)} expired key(s) ({_one_line(map_error(exc))}); "
                        "another subscriber may have run them"
                        + ("; the sweep fires armed ones" if self.backup_sweep else ""),
                    )
                    raise
                if delay == 0.05:  # once per refused batch: say what it waits for
                    self._log(
                        "error",
                        f"claim of {len(batch)} expired key(s) refused ({_one_line(map_error(exc))}); "
                        f"retrying for up to {self.claim_window_ms / 2000.0:g}s",
                    )
                self._topo_kick.set()
                time.sleep(self._rnd.uniform(delay / 2, delay))
                delay = min(1.0, delay * 2)
        for raw, out in zip(batch, outs, strict=True):
            self._after_fire(raw, out, "event")
        if self.cluster and self.backup_sweep:
            # Learn the slots in use from the events (a slot new to us is looked at
            # by the next sweep; its entries may be armed later than this one).
            now = time.monotonic() + SWEEP_MAX_INTERVAL_S
            for raw in batch:
                node.learn(key_slot(raw), now)

    def _run_fire(self, node: _Node, items: list[tuple[bytes, str]]) -> list[Any]:
        if len(items) == 1:
            raw, mode = items[0]
            try:
                return [node.scripts("expired-fire-4", self._fire_keys(raw), self._fire_args(mode))]
            except _REDIRECT as exc:
                return [self._fire_redirected(exc, raw, mode)]
        pipe = node.cmd.pipeline(transaction=False)
        for raw, mode in items:
            node.scripts("expired-fire-4", self._fire_keys(raw), self._fire_args(mode), client=pipe)
        try:
            outs = list(pipe.execute(raise_on_error=False))
        except redis.RedisError as exc:
            raise map_error(exc) from exc
        for i, o in enumerate(outs):
            if isinstance(o, _REDIRECT):
                # The slot moved since the event (or the sweep's look): claim it there.
                outs[i] = self._fire_redirected(o, *items[i])
            elif isinstance(o, Exception):
                raise map_error(o)
        return outs

    def _fire_redirected(self, exc: redis.exceptions.AskError, raw: bytes, mode: str) -> Any:
        self._topo_kick.set()
        target = self._redirect_node(exc.host, int(exc.port))
        pipe = target.cmd.pipeline(transaction=False)
        if not isinstance(exc, redis.exceptions.MovedError):
            pipe.execute_command("ASKING")
        target.scripts("expired-fire-4", self._fire_keys(raw), self._fire_args(mode), client=pipe)
        try:
            out = pipe.execute(raise_on_error=False)[-1]
        except redis.RedisError as e:
            raise map_error(e) from e
        if isinstance(out, _REDIRECT):  # moved again: the next look (event or sweep) retries
            raise redis.exceptions.TryAgainError(f"{raw!r}: slot {exc.slot_id} is moving")
        if isinstance(out, Exception):
            raise map_error(out)
        return out

    def _redirect_node(self, host: str, port: int) -> _Node:
        """A client of the node at host:port (one of ours, or one made for redirections)."""
        name = f"{host}:{port}"
        with self._nodes_lock:
            for n in self.nodes:
                if n.name == name:
                    return n
            made = self._redirect_nodes.get((host, port))
            if made is None:
                made = self._redirect_nodes[(host, port)] = self._new_node(host, port)
            return made

    def _after_fire(self, raw: bytes, out: list[Any], mode: str) -> str:
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
        return status

    # ------------------------------------------------------------------ cluster topology

    def _new_node(self, host: str, port: int, late: bool = False) -> _Node:
        return _Node(
            f"{host}:{port}", {**self._template, "host": host, "port": port}, self._conn_class, late
        )

    def _guard_topology(self) -> None:
        """Refresh the list of primaries every TOPOLOGY_INTERVAL_S, and soon after
        a connection error (a failover in progress); never stops the runner."""
        failing_since: float | None = None
        while not self._stop.is_set():
            self._topo_kick.wait(TOPOLOGY_INTERVAL_S)
            self._topo_kick.clear()
            if self._stop.is_set():
                return
            try:
                self._refresh_topology()
                failing_since = None
            except Exception as exc:  # noqa: BLE001 - logged; tried again
                now = time.monotonic()
                if failing_since is None:
                    failing_since = now
                    self._log(
                        "warning",
                        f"could not refresh the cluster's primaries ({_one_line(map_error(exc))}); "
                        "retrying",
                    )
            self._stop.wait(TOPOLOGY_MIN_GAP_S)

    def _cluster_slots(self) -> dict[tuple[str, int], list[tuple[int, int]]]:
        """Ask the nodes we subscribed to first, then the others, then the seeds."""
        with self._nodes_lock:
            nodes = sorted(self.nodes, key=lambda n: not n.subscribed)
        last: Exception | None = None
        tried: set[str] = set()
        for n in nodes:
            tried.add(n.name)
            try:
                return _parse_cluster_slots(
                    n.cmd.execute_command("CLUSTER SLOTS"), str(n.kwargs["host"])
                )
            except redis.RedisError as exc:
                last = exc
        for host, port in self._seeds:
            if f"{host}:{port}" in tried:
                continue
            c = redis.Redis(
                connection_pool=redis.ConnectionPool(
                    connection_class=self._conn_class,
                    **{**self._template, "host": host, "port": port},
                )
            )
            try:
                return _parse_cluster_slots(c.execute_command("CLUSTER SLOTS"), host)
            except redis.RedisError as exc:
                last = exc
            finally:
                c.connection_pool.disconnect()
        raise last or RedisUnavailable("no cluster node to ask for its primaries")

    def _refresh_topology(self, start_threads: bool = True) -> None:
        """Follow the cluster's primaries: a new one (a promoted replica, an added
        node) gets a subscription and a sweeper; one that is no longer a primary
        (dead, demoted, removed) has its threads stopped; armed sets of slots that
        moved are handed to their new node's sweeper."""
        owners = self._cluster_slots()
        if not owners:
            raise redis.exceptions.ClusterDownError("CLUSTER SLOTS lists no primary")
        added: list[_Node] = []
        with self._nodes_lock:
            if self._stop.is_set():
                return
            current = {n.name: n for n in self.nodes}
            fresh: list[_Node] = []
            for (host, port), ranges in sorted(owners.items()):
                n = current.pop(f"{host}:{port}", None)
                if n is None:
                    n = self._new_node(host, port, late=start_threads)
                    added.append(n)
                n.ranges = sorted(ranges)
                fresh.append(n)
            gone = list(current.values())
            self.nodes = fresh
            self._retired.extend(gone)
        for n in gone:
            n.halt.set()
            n.kick.set()
            self._log(
                "info", f"{n.name} is no longer a primary: its subscription and sweep stopped"
            )
        if start_threads:
            for n in added:
                self._log("info", f"{n.name} is a primary now: subscribing to its expiry events")
                self._start_node(n)
        moved: list[int] = []
        for n in fresh + gone:
            with n.lock:
                for slot in [s for s in n.sets if n.halt.is_set() or not n.owns(s)]:
                    del n.sets[slot]
                    moved.append(slot)
        for slot in moved:
            for n in fresh:
                if n.owns(slot):
                    n.learn(slot, 0.0)
                    n.kick.set()
        self._wake.set()

    # ------------------------------------------------------------------ the backup sweep

    def _sweep_loop(self, node: _Node) -> None:
        delay = 0.1
        timeout: float | None = None  # the first sweep waits for the first subscription
        last = -1e18
        while not node.halt.is_set():
            node.kick.wait(timeout)
            node.kick.clear()
            if node.halt.is_set():
                return
            if not node.subscribed:
                timeout = None if not node.ever_subscribed else SWEEP_MAX_INTERVAL_S
                continue
            gap = last + SWEEP_MIN_INTERVAL_S - time.monotonic()
            if gap > 0:
                node.halt.wait(gap)
            try:
                if self.cluster and (node.rediscover or time.monotonic() >= node.next_discover):
                    self._discover(node)
                wait_s = self._sweep(node)
                delay = 0.1
            except TRANSIENT as exc:
                if node.halt.is_set():
                    return
                self._topo_kick.set()
                wait_s = self._rnd.uniform(delay / 2, delay)
                self._log(
                    "error",
                    f"{node.name}: sweep: {_one_line(map_error(exc))}; retrying in {wait_s:.1f}s",
                )
                delay = min(RECONNECT_MAX_S, delay * 2)
                timeout = wait_s
                continue
            last = time.monotonic()
            if self.cluster:
                wait_s = min(wait_s, max(0.0, node.next_discover - last))
            timeout = max(min(wait_s, SWEEP_MAX_INTERVAL_S), SWEEP_MIN_INTERVAL_S)

    def _discover(self, node: _Node) -> None:
        """Cluster: find the node's armed sets (SCAN MATCH ... TYPE zset: the node's
        keyspace, ``DISCOVER_SCAN_COUNT`` keys a call, never KEYS)."""
        node.rediscover = False
        pattern = ExpiredKeys.scan_pattern(self.rs.namespace)
        found: set[int] = set()
        cursor: Any = 0
        try:
            while True:
                cursor, keys = node.cmd.scan(
                    cursor, match=pattern, count=DISCOVER_SCAN_COUNT, _type="zset"
                )
                for k in keys:
                    slot = ExpiredKeys.slot_of_armed(self.rs.namespace, k)
                    if slot is not None:
                        found.add(slot)
                if int(cursor) == 0 or node.halt.is_set():
                    break
        except redis.RedisError as exc:
            node.rediscover = True
            raise map_error(exc) from exc
        node.next_discover = time.monotonic() + DISCOVER_INTERVAL_S
        new = [slot for slot in found if node.learn(slot, 0.0)]
        if new:
            self._log("debug", f"{node.name}: found {len(new)} more armed set(s) to sweep")

    def _sweep(self, node: _Node) -> float:
        """Sweep the node's armed sets that are due for a look (pipelined). Returns
        the seconds until the next one is."""
        now = time.monotonic()
        with node.lock:
            due = sorted((at, slot) for slot, at in node.sets.items() if at <= now)
        slots = [slot for _, slot in due]
        for i in range(0, len(slots), SWEEP_PIPELINE):
            if node.halt.is_set():
                break
            chunk = slots[i : i + SWEEP_PIPELINE]
            keys = [self.keys if slot < 0 else self._slot_set(slot) for slot in chunk]
            args = [self.sweep_grace_ms, 0, SWEEP_PAGE]
            outs: list[Any]
            try:
                if len(keys) == 1:
                    try:
                        outs = [node.scripts("expired-due-1", [keys[0].armed], args)]
                    except _REDIRECT as exc:
                        outs = [exc]
                else:
                    pipe = node.cmd.pipeline(transaction=False)
                    for ek in keys:
                        node.scripts("expired-due-1", [ek.armed], args, client=pipe)
                    outs = pipe.execute(raise_on_error=False)
            except redis.RedisError as exc:
                raise map_error(exc) from exc
            for slot, ek, out in zip(chunk, keys, outs, strict=True):
                if isinstance(out, _REDIRECT):
                    self._slot_moved(node, slot, out)
                    continue
                if isinstance(out, Exception):
                    raise map_error(out)
                self._sweep_set(node, slot, ek, out)
        with node.lock:
            nxt = min(node.sets.values(), default=None)
        return SWEEP_MAX_INTERVAL_S if nxt is None else max(0.0, nxt - time.monotonic())

    def _slot_set(self, slot: int) -> ExpiredKeys:
        ek = self._slot_keys.get(slot)
        if ek is None:
            ek = self._slot_keys[slot] = ExpiredKeys.for_slot(self.rs.namespace, slot)
        return ek

    def _slot_moved(self, node: _Node, slot: int, exc: redis.exceptions.AskError) -> None:
        """A set's slot is served elsewhere now: hand it to that node's sweeper."""
        self._topo_kick.set()
        if isinstance(exc, redis.exceptions.MovedError):
            with node.lock:
                node.sets.pop(slot, None)
        else:  # ASK: moving; both nodes hold some of its keys for now
            node.learn(slot, time.monotonic() + SWEEP_MAX_INTERVAL_S)
        with self._nodes_lock:
            target = next((n for n in self.nodes if n.name == f"{exc.host}:{exc.port}"), None)
        if target is not None:
            target.learn(slot, 0.0)
            target.kick.set()

    def _sweep_set(self, node: _Node, slot: int, ek: ExpiredKeys, out: Any) -> None:
        """Fire the overdue entries of our pattern in one armed set (``out``: the
        first page of expired-due-1) and schedule the set's next look."""
        offset = 0
        scanned = 0
        foreign = 0
        foreign_oldest: int | None = None
        kept = False  # an entry was re-armed under the sweep ("extended"): the set lives on
        while True:
            now_ms, next_ms = int(out[0]), int(out[1])
            entries = [(bytes(out[i]), int(out[i + 1])) for i in range(2, len(out), 2)]
            scanned += len(entries)
            mine = [raw for raw, _ in entries if self._match(_s(raw))]
            for raw, score in entries:
                if not self._match(_s(raw)):
                    foreign += 1
                    foreign_oldest = score if foreign_oldest is None else min(foreign_oldest, score)
            offset += len(entries) - len(mine)
            for i in range(0, len(mine), CLAIM_BATCH):
                chunk = mine[i : i + CLAIM_BATCH]
                outs = self._run_fire(node, [(raw, "sweep") for raw in chunk])
                for raw, o in zip(chunk, outs, strict=True):
                    kept = self._after_fire(raw, o, "sweep") == "extended" or kept
            if len(entries) < SWEEP_PAGE or scanned >= SWEEP_SCAN_BUDGET or node.halt.is_set():
                break
            try:
                out = node.scripts(
                    "expired-due-1", [ek.armed], [self.sweep_grace_ms, offset, SWEEP_PAGE]
                )
            except redis.RedisError as exc:
                raise map_error(exc) from exc
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
        now = time.monotonic()
        with node.lock:
            if slot < 0:
                recheck = SWEEP_MAX_INTERVAL_S
            else:
                if next_ms == -1 and not foreign and not kept and scanned < SWEEP_SCAN_BUDGET:
                    # Empty (or gone): forget it; an event or the next SCAN finds it again.
                    node.sets.pop(slot, None)
                    return
                recheck = min(SLOT_RECHECK_MAX_S, max(SWEEP_MAX_INTERVAL_S, len(node.sets) * 1.0))
            if scanned >= SWEEP_SCAN_BUDGET:
                recheck = SWEEP_MIN_INTERVAL_S  # more to look at: soon
            elif next_ms != -1:
                recheck = min(recheck, (next_ms + self.sweep_grace_ms - now_ms + 1) / 1000.0)
            node.sets[slot] = now + max(recheck, SWEEP_MIN_INTERVAL_S)

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
