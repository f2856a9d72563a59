"""Every Redis key rsched uses is built here, and nowhere else.

All keys of one queue (or one cron, or one lock) share a hash tag, so that a
Lua script touching them works on Redis Cluster:

    {ns}:{q:QUEUE}:sched       ZSET  member "TYPE ID" -> due time (ms)
    {ns}:{q:QUEUE}:proc        ZSET  member -> lease expiry (ms)
    {ns}:{q:QUEUE}:dead        ZSET  member -> time it died (ms)
    {ns}:{q:QUEUE}:tasks       HASH  member -> record (JSON array, see tasks.py)
    {ns}:{q:QUEUE}:wake        ZSET  the wake-up marker idle consumers BZPOPMIN on
    {ns}:{q:QUEUE}:seq         STRING claim-token counter
    {ns}:{q:QUEUE}:paused      STRING present while the queue is paused
    {ns}:{q:QUEUE}:consumers   ZSET  consumer id -> registration expiry (ms)
    {ns}:{q:QUEUE}:history     STREAM execution records (capped)
    {ns}:{q:QUEUE}:stats       HASH  run counters for metrics
    {ns}:{q:QUEUE}:lanes       HASH  type -> lane of its parked tasks ('#': lanes given out)
    {ns}:{q:QUEUE}:handles     HASH  consumer id -> JSON array of the type globs it runs
    {ns}:{q:QUEUE}:prio        ZSET  tasks of a priority other than 0 -> when a claim looks
                                     at them next (their due time; _prio.lua)
    {ns}:{q:QUEUE}:ready       ZSET  due tasks of a priority other than 0, out of sched ->
                                     (1000 - priority) * 2**42 + due (claimed highest first)
    {ns}:{q:QUEUE}:waiting     ZSET  tasks added with parents (`add --after`) still waiting
                                     for them -> their own due time (ms; _after.lua)
    {ns}:{q:QUEUE}:children    HASH  parent member -> JSON array of the members waiting for it
    {ns}:{q:QUEUE}:rate        ZSET  claim token -> when claimed: the rate limit's window;
                                     't' + token -> lane * 2**42 + when claimed: the window
                                     of its type's own limit (`type_rate_limits`)
    {ns}:{q:QUEUE}:ratelimit   STRING the limits, set by consumers: "N WINDOW_MS TEXT" of
                                     `rate_limit` (or "- - -"), then a line "N WINDOW_MS
                                     TYPE TEXT" per type
    {ns}:{q:QUEUE}:cancel      Pub/Sub channel: claim tokens of running tasks cancelled
    {ns}:{q:QUEUE}:logs        HASH  claim token -> run log (JSON: stdout, stderr, truncated)
    {ns}:{q:QUEUE}:logidx      ZSET  claim token -> when its log was written: trims `logs`
                                     to the history's cap (oldest first; log-put-3)
    {ns}:{q:QUEUE}:events      STREAM events (task.dead; capped), with the consumer group
                                     of each alert sink (see rsched/tools/events.py)
    {ns}:{q:QUEUE}:evdone      HASH  "EVENT_ID SINK" -> "delivered N" | "failed N": outcomes
                                     that took a retry (trimmed with the stream)
    {ns}:{q:QUEUE}:live:TOKEN  STREAM a running handler's output in chunks (capped,
                                     expires; `rsched logs --follow`)

A due task that a consumer cannot run (it has no handler for the type) is
*parked*: it stays in ``sched``, due, with its score moved into its type's
lane below every real due time (``due - lane * 2**42``; ``rsched/lua/_lanes.lua``),
so a consumer of that type finds it with one range read and the others never
read it again. :func:`due_of_score` turns a score back into the due time.

    {ns}:{c:NAME}:ticks        ZSET  fire_ms -> claim time: each tick is claimed once ever
    {ns}:{c:NAME}:state        HASH  schedule, tz, last_tick, last_run_fire, last_result, last_host,
                                     replace_fire, paused_ms, pause_from_ms, pause_to_ms
    {ns}:{c:NAME}:runners      ZSET  runner id -> registration expiry (ms): the live runners
    {ns}:{c:NAME}:lock         HASH  the run lock (owner, host, pid, since, token, fire, cancel), PEXPIRE
    {ns}:{c:NAME}:wake         ZSET  wakes the run lock's holder (--concurrency replace)
    {ns}:{c:NAME}:fence        STRING fencing counter
    {ns}:{c:NAME}:paused       STRING present while the cron is paused
    {ns}:{c:NAME}:shards:FIRE  HASH  shard item -> runner id for one tick (expires)
    {ns}:{c:NAME}:history      STREAM execution records (capped)
    {ns}:{c:NAME}:stats        HASH  result -> count
    {ns}:{c:NAME}:logs, logidx, live:TOKEN   run logs by fencing token (as a queue's)
    {ns}:{c:NAME}:events, evdone  events (run.failed, run.lost, run.recovered, tick.missed,
                                     cron.silent) and their delivery outcomes, as a queue's

    {ns}:{l:NAME}:lock         HASH  one lock's owner record, PEXPIRE (see lua/_lock.lua)
    {ns}:{l:NAME}:fence        STRING its fencing counter
    {ns}:{l:NAME}:wake         LIST  a release pushes one element; waiters BLPOP on it
    {ns}:{l:NAME}:ticks        ZSET  ticks claimed by `exec --once-per`
    {ns}:{l:NAME}:history      STREAM `exec` execution records
    {ns}:{l:NAME}:logs, logidx, live:TOKEN   `exec` run logs by fencing token
    {ns}:{l:NAME}:events, evdone  `exec` events (run.failed, run.lost), as a queue's

    {ns}:queues, {ns}:crons, {ns}:locks  registries (SETs) of known names, for listings
    {ns}:queue-config          HASH  queue -> partition count (written on first use)
    {ns}:alert-sinks           HASH  sink id -> its definition without secrets (JSON), for
                                     `rsched events` to know each sink's events and match
    {ns}:audit                 STREAM operator actions (who, what, done/refused; capped)
    {ns}:alert-stats           HASH  "SINK_ID OUTCOME" -> deliveries (delivered | failed |
                                     retried: an attempt that failed and will be retried)

A partitioned queue (``partitions = N``) is N queues of the layout above, one
per hash tag ``{q:QUEUE#0}`` ... ``{q:QUEUE#N-1}`` (``#`` is not allowed in a
queue name, so a partition never collides with a queue), spread over the
cluster's primaries; a task lives in partition ``crc32("TYPE ID") % N``.

A TYPE never contains whitespace and an ID never does either, so "TYPE ID" is
an unambiguous member.
"""

from __future__ import annotations

from dataclasses import dataclass


def member(task_type: str, task_id: str) -> str:
    return f"{task_type} {task_id}"


def split_member(m: str) -> tuple[str, str]:
    t, _, i = m.partition(" ")
    return t, i


#: The width of a parked type's lane of sched scores (2**42 ms; see _lanes.lua).
LANE_MS = 1 << 42


def due_of_score(score: float) -> int:
    """A ``sched`` score -> the task's due time (ms): itself, or a parked task's."""
    s = int(score)
    if s >= 0:
        return s
    return s + -(s // LANE_MS) * LANE_MS


#: Priorities (``add --priority``) and the band width of the ready set's scores.
PRIORITY_MIN, PRIORITY_MAX = -1000, 1000


def ready_due(score: float) -> tuple[int, int]:
    """A ``ready`` score -> (due ms, priority) (see ``rsched/lua/_prio.lua``)."""
    s = int(score)
    band = s // LANE_MS
    return s - band * LANE_MS, 1000 - band


def lane_bounds(lane: int) -> tuple[int, str]:
    """Lane ``lane``'s scores, as ZRANGEBYSCORE/ZCOUNT bounds (max exclusive)."""
    return -lane * LANE_MS, f"({-(lane - 1) * LANE_MS}"


#: Separates a queue's name from its partition number in a partition's name.
PARTITION_SEP = "#"


def partition_name(queue: str, index: int) -> str:
    """The name of partition ``index`` of ``queue`` (its keys' hash tag)."""
    return f"{queue}{PARTITION_SEP}{index}"


def logical_queue(name: str) -> str:
    """``orders#3`` -> ``orders``; a queue's own name unchanged."""
    return name.split(PARTITION_SEP, 1)[0]


def partition_index(task_type: str, task_id: str, partitions: int) -> int:
    """The partition of a task: a stable hash of its identity (CRC-32, the same in
    every process and language, unlike Python's ``hash``)."""
    import zlib

    if partitions <= 1:
        return 0
    return zlib.crc32(member(task_type, task_id).encode("utf-8")) % partitions


class _EventKeys:
    """The keys every source of runs (queue, cron, lock) has beside its history: its
    events and their delivery outcomes, its kept run logs."""

    prefix: str

    @property
    def logs(self) -> str:
        """HASH run token -> run log JSON (stdout, stderr, truncated)."""
        return f"{self.prefix}:logs"

    @property
    def log_index(self) -> str:
        """ZSET run token -> when its log was written (trims ``logs`` to the history cap)."""
        return f"{self.prefix}:logidx"

    def live(self, token: object) -> str:
        """STREAM of a running command's output chunks (``rsched logs --follow``)."""
        return f"{self.prefix}:live:{token}"

    @property
    def events(self) -> str:
        """STREAM of events (SPEC §4), one consumer group per alert sink."""
        return f"{self.prefix}:events"

    @property
    def events_done(self) -> str:
        """HASH "EVENT_ID SINK" -> outcome of a delivery that took retries or failed."""
        return f"{self.prefix}:evdone"


@dataclass(frozen=True)
class QueueKeys(_EventKeys):
    name: str
    prefix: str

    def _k(self, suffix: str) -> str:
        return f"{self.prefix}:{suffix}"

    @property
    def sched(self) -> str:
        return self._k("sched")

    @property
    def proc(self) -> str:
        return self._k("proc")

    @property
    def dead(self) -> str:
        return self._k("dead")

    @property
    def tasks(self) -> str:
        return self._k("tasks")

    @property
    def wake(self) -> str:
        return self._k("wake")

    @property
    def seq(self) -> str:
        return self._k("seq")

    @property
    def paused(self) -> str:
        return self._k("paused")

    @property
    def consumers(self) -> str:
        return self._k("consumers")

    @property
    def history(self) -> str:
        return self._k("history")

    @property
    def stats(self) -> str:
        return self._k("stats")

    @property
    def lanes(self) -> str:
        """HASH type -> lane number of its parked tasks; field ``#``: lanes given out."""
        return self._k("lanes")

    @property
    def prio(self) -> str:
        """ZSET tasks of a priority other than 0 -> when a claim looks at them next
        (``rsched/lua/_prio.lua``)."""
        return self._k("prio")

    @property
    def ready(self) -> str:
        """ZSET due tasks of a priority other than 0, out of ``sched`` -> their band
        score ``(1000 - priority) * 2**42 + due`` (``rsched/lua/_prio.lua``)."""
        return self._k("ready")

    @property
    def waiting(self) -> str:
        """ZSET tasks waiting for their parents (``add --after``) -> their due time."""
        return self._k("waiting")

    @property
    def children(self) -> str:
        """HASH parent member -> JSON array of the members waiting for it."""
        return self._k("children")

    @property
    def rate(self) -> str:
        """ZSET claim token -> when claimed: the rate limit's window (claim-18)."""
        return self._k("rate")

    @property
    def ratelimit(self) -> str:
        """STRING the rate limit the consumers enforce, ``N WINDOW_MS TEXT`` (expires)."""
        return self._k("ratelimit")

    @property
    def cancel_channel(self) -> str:
        """Pub/Sub channel (not a key): ``rsched cancel`` of a running task publishes
        its claim token here; the consumer running it stops its handler."""
        return self._k("cancel")

    @property
    def handles(self) -> str:
        """HASH consumer id -> JSON array of the type globs the consumer runs."""
        return self._k("handles")


@dataclass(frozen=True)
class CronKeys(_EventKeys):
    name: str
    prefix: str

    def _k(self, suffix: str) -> str:
        return f"{self.prefix}:{suffix}"

    @property
    def ticks(self) -> str:
        """ZSET fire_ms -> claim time: every tick claimed, kept for a while."""
        return self._k("ticks")

    @property
    def state(self) -> str:
        """HASH: schedule, tz, last fire/result/host, ..."""
        return self._k("state")

    @property
    def runners(self) -> str:
        """ZSET runner id -> registration expiry (ms)."""
        return self._k("runners")

    @property
    def run_lock(self) -> str:
        return self._k("lock")

    @property
    def wake(self) -> str:
        """ZSET: a member added wakes the run lock's holder (``--concurrency replace``)."""
        return self._k("wake")

    @property
    def fence(self) -> str:
        return self._k("fence")

    @property
    def paused(self) -> str:
        return self._k("paused")

    @property
    def triggers(self) -> str:
        """ZSET request JSON -> when asked (ms): runs asked for by ``rsched trigger`` and
        by ``--after`` and not yet claimed by a runner (see cron-trigger-5)."""
        return self._k("triggers")

    @property
    def trigger_wake(self) -> str:
        """STREAM (capped): one entry per request; idle runners block on it (XREAD)."""
        return self._k("twake")

    def trigger_reply(self, request_id: str) -> str:
        """LIST: the claiming runner's answer to one request (expires after a minute)."""
        return self._k(f"treply:{request_id}")

    def trigger_items(self, request_id: str) -> str:
        """HASH item -> runner id: who claimed each item of one run asked for of a sharded
        or broadcast cron (cron-trigger-items-8; expires)."""
        return self._k(f"titems:{request_id}")

    def run_mark(self, token: int) -> str:
        """STRING (PX the run's --ttl, renewed while it runs): a run asked for that holds no
        run lock (allow, sharded, broadcast) is alive; ``trigger --wait`` reads it."""
        return self._k(f"mark:{int(token)}")

    def shards(self, fire_ms: int) -> str:
        """HASH item -> runner id: who claimed each shard item of one tick (expires)."""
        return self._k(f"shards:{int(fire_ms)}")

    @property
    def history(self) -> str:
        return self._k("history")

    @property
    def stats(self) -> str:
        return self._k("stats")


@dataclass(frozen=True)
class LockKeys(_EventKeys):
    name: str
    prefix: str

    @property
    def lock(self) -> str:
        return f"{self.prefix}:lock"

    @property
    def fence(self) -> str:
        return f"{self.prefix}:fence"

    @property
    def history(self) -> str:
        return f"{self.prefix}:history"

    @property
    def ticks(self) -> str:
        """ZSET of ticks claimed by `exec --once-per`."""
        return f"{self.prefix}:ticks"

    @property
    def wake(self) -> str:
        """LIST: a release pushes one element (expiring); a waiter BLPOPs on it."""
        return f"{self.prefix}:wake"

    @property
    def stats(self) -> str:
        """HASH: the run-duration histogram of the lock's recorded runs (``exec``)."""
        return f"{self.prefix}:stats"


def logs_of_history(history_key: str) -> str:
    """The run-log HASH beside a cron's, lock's or queue's history stream (same hash tag)."""
    return history_key[: -len("history")] + "logs"


class Keys:
    """Key builder for one namespace."""

    def __init__(self, namespace: str = "rsched"):
        self.ns = namespace

    def queue(self, name: str) -> QueueKeys:
        return QueueKeys(name, f"{self.ns}:{{q:{name}}}")

    def cron(self, name: str) -> CronKeys:
        return CronKeys(name, f"{self.ns}:{{c:{name}}}")

    def lock(self, name: str) -> LockKeys:
        return LockKeys(name, f"{self.ns}:{{l:{name}}}")

    @property
    def queues(self) -> str:
        return f"{self.ns}:queues"

    @property
    def crons(self) -> str:
        return f"{self.ns}:crons"

    @property
    def queue_config(self) -> str:
        """HASH queue name -> partition count, agreed by every producer and consumer."""
        return f"{self.ns}:queue-config"

    @property
    def alert_sinks(self) -> str:
        """HASH sink id -> the sink's definition without secrets (JSON)."""
        return f"{self.ns}:alert-sinks"

    @property
    def silence_check(self) -> str:
        """STRING, PX the check's interval: the process that set it (NX) checks the
        namespace for silent crons this interval; the others skip."""
        return f"{self.ns}:silence-check"

    @property
    def alert_stats(self) -> str:
        """HASH "SINK_ID OUTCOME" -> deliveries by outcome (``rsched metrics``)."""
        return f"{self.ns}:alert-stats"

    @property
    def audit(self) -> str:
        """STREAM of operator actions, capped (``rsched history --actions``; tools/audit.py)."""
        return f"{self.ns}:audit"

    @property
    def locks(self) -> str:
        """SET of lock names used by `exec` / the lock API (for `history`)."""
        return f"{self.ns}:locks"

    def lock_scan_pattern(self) -> str:
        return f"{self.ns}:{{l:*}}:lock"

    def cron_lock_scan_pattern(self) -> str:
        return f"{self.ns}:{{c:*}}:lock"

    def lock_name_from_key(self, key: str) -> str:
        # "{ns}:{l:NAME}:lock"
        start = len(self.ns) + 4
        return key[start : -len("}:lock")]


#: Redis Cluster's number of hash slots.
CLUSTER_SLOTS = 16384

_slot_tags: list[str] | None = None


def key_slot(key: str | bytes) -> int:
    """The Redis Cluster slot of a key name (redis-py's ``key_slot``): CRC16
    (CCITT/XMODEM) of the name, or of its hash tag, the text between the first
    ``{`` and the first ``}`` after it when that is not empty. A ``str`` is
    encoded as UTF-8 (surrogate escapes give back the original bytes)."""
    import binascii

    raw = key if isinstance(key, bytes) else key.encode("utf-8", "surrogateescape")
    start = raw.find(b"{")
    if start > -1:
        end = raw.find(b"}", start + 1)
        if end > -1 and end != start + 1:
            raw = raw[start + 1 : end]
    return binascii.crc_hqx(raw, 0) & (CLUSTER_SLOTS - 1)


def slot_tag(slot: int) -> str:
    """The shortest decimal string (the first ``str(i)``) whose CRC16 is ``slot``:
    ``{TAG}`` in a key name puts the key in that slot. The table is built once
    per process, on first use (~110,000 CRCs, about 30 ms)."""
    global _slot_tags
    tags = _slot_tags
    if tags is None:
        import binascii

        crc = binascii.crc_hqx
        found: list[str | None] = [None] * CLUSTER_SLOTS
        left, i = CLUSTER_SLOTS, 0
        while left:
            s = crc(b"%d" % i, 0) & (CLUSTER_SLOTS - 1)
            if found[s] is None:
                found[s] = str(i)
                left -= 1
            i += 1
        tags = _slot_tags = [t for t in found if t is not None]
    return tags[slot]


@dataclass(frozen=True)
class ExpiredKeys:
    """Keys of keyspace-notification triggers (``rsched run expired``,
    :func:`rsched.expired.arm`). The trigger keys themselves are the user's
    (any name, outside the namespace); these live in the namespace, in the
    trigger keys' database. On a single Redis (and Sentinel):

        {ns}:{x}:armed         ZSET  trigger key name -> expiry (ms): the backup-sweep set
        {ns}:{x}:values        HASH  trigger key name -> value given to arm() (handler stdin)
        {ns}:{x}:claim:KEY     STRING claim of KEY's latest firing, PX the claim window

    On Redis Cluster a script touches the trigger key and these together, so
    they live in the trigger key's slot: one set of them per slot in use, with
    the hash tag :func:`slot_tag` of that slot (``{ns}:x:{TAG}:armed``, ...;
    :meth:`for_slot`). A runner finds a node's armed sets with ``SCAN MATCH``
    :meth:`scan_pattern` and :meth:`slot_of_armed`.
    """

    prefix: str

    @classmethod
    def for_namespace(cls, namespace: str) -> ExpiredKeys:
        """The single-Redis layout (one set for the namespace)."""
        return cls(f"{namespace}:{{x}}")

    @classmethod
    def for_slot(cls, namespace: str, slot: int) -> ExpiredKeys:
        """The cluster layout: the keys of trigger keys in hash slot ``slot``."""
        return cls(f"{namespace}:x:{{{slot_tag(slot)}}}")

    @classmethod
    def for_key(cls, namespace: str, key: str | bytes, cluster: bool) -> ExpiredKeys:
        """The keys that go with trigger ``key`` (in its slot, on a cluster)."""
        return cls.for_slot(namespace, key_slot(key)) if cluster else cls.for_namespace(namespace)

    @staticmethod
    def scan_pattern(namespace: str) -> str:
        """``SCAN MATCH`` glob of the cluster layout's armed sets (``{`` is no glob character)."""
        return f"{namespace}:x:{{*}}:armed"

    @classmethod
    def slot_of_armed(cls, namespace: str, key: str | bytes) -> int | None:
        """The slot whose armed set ``key`` is (cluster layout), or None if it is not one."""
        name = key if isinstance(key, str) else key.decode("utf-8", "surrogateescape")
        slot = key_slot(name)
        return slot if cls.for_slot(namespace, slot).armed == name else None

    @property
    def armed(self) -> str:
        return f"{self.prefix}:armed"

    @property
    def values(self) -> str:
        return f"{self.prefix}:values"

    def claim(self, key: str) -> str:
        return f"{self.prefix}:claim:{key}"
