"""The backup sweep of ``run expired --backup-sweep``: fire armed keys whose
expiry event never came (see :mod:`rsched.expired.runner`).

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

import time
from typing import Any

import redis

from rsched.core.errors import map_error
from rsched.core.keys import ExpiredKeys
from rsched.core.transient import TRANSIENT
from rsched.expired.base import RECONNECT_MAX_S
from rsched.expired.fire import CLAIM_BATCH, REDIRECT, FireMixin
from rsched.expired.model import Node
from rsched.expired.notify import key_text, one_line
from rsched.lua import calls

SWEEP_MAX_INTERVAL_S = 5.0
SWEEP_MIN_INTERVAL_S = 0.2
SWEEP_PAGE = 500
#: Due entries looked at per sweep (those of other patterns are skipped, not fired).
SWEEP_SCAN_BUDGET = 5_000
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


class SweepMixin(FireMixin):
    """Each node's sweeper thread (``_sweep_loop``)."""

    def _sweep_loop(self, node: Node) -> None:
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
                    f"{node.name}: sweep: {one_line(map_error(exc))}; retrying in {wait_s:.1f}s",
                )
                delay = min(RECONNECT_MAX_S, delay * 2)
                timeout = wait_s
                continue
            last = time.monotonic()
            if self.cluster:
                wait_s = min(wait_s, max(0.0, node.next_discover - last))
            timeout = max(min(wait_s, SWEEP_MAX_INTERVAL_S), SWEEP_MIN_INTERVAL_S)

    def _discover(self, node: Node) -> None:
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

    def _sweep(self, node: Node) -> float:
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
            outs: list[Any]
            try:
                if len(keys) == 1:
                    try:
                        outs = [self._due(node, keys[0], 0)]
                    except REDIRECT as exc:
                        outs = [exc]
                else:
                    pipe = node.cmd.pipeline(transaction=False)
                    for ek in keys:
                        self._due(node, ek, 0, client=pipe)
                    outs = pipe.execute(raise_on_error=False)
            except redis.RedisError as exc:
                raise map_error(exc) from exc
            for slot, ek, out in zip(chunk, keys, outs, strict=True):
                if isinstance(out, REDIRECT):
                    self._slot_moved(node, slot, out)
                    continue
                if isinstance(out, Exception):
                    raise map_error(out)
                self._sweep_set(node, slot, ek, out)
        with node.lock:
            nxt = min(node.sets.values(), default=None)
        return SWEEP_MAX_INTERVAL_S if nxt is None else max(0.0, nxt - time.monotonic())

    def _due(self, node: Node, ek: ExpiredKeys, offset: int, client: Any = None) -> Any:
        """A page of the overdue entries of armed set ``ek`` (``expired-due-1``)."""
        return calls.expired_due(
            node.lua,
            ek.armed,
            grace_ms=self.sweep_grace_ms,
            offset=offset,
            count=SWEEP_PAGE,
            client=client,
        )

    def _slot_moved(self, node: Node, slot: int, exc: redis.exceptions.AskError) -> None:
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

    def _sweep_set(self, node: Node, slot: int, ek: ExpiredKeys, out: Any) -> None:
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
            mine = [raw for raw, _ in entries if self._match(key_text(raw))]
            for raw, score in entries:
                if not self._match(key_text(raw)):
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
                out = self._due(node, ek, offset)
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
