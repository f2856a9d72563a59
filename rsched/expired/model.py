"""The values the parts of ``run expired`` pass around: a :class:`Node` (one
primary: its clients, subscription state and known armed sets) and a
:class:`Firing` (one claimed expiry, as a Python handler gets it)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import redis

from rsched.core import clients
from rsched.core.timeutil import iso
from rsched.lua import calls


@dataclass
class Node:
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
    #: the Lua calls run on ``cmd`` (:mod:`rsched.lua.calls`)
    lua: calls.Bound = field(init=False)
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
        self.lua = calls.Bound(self.cmd)

    def client(self, **over: Any) -> redis.Redis:
        return clients.node_client({**self.kwargs, **over}, self.connection_class)  # type: ignore[no-any-return]

    def owns(self, slot: int) -> bool:
        return any(lo <= slot <= hi for lo, hi in self.ranges)

    def learn(self, slot: int, at: float) -> bool:
        """Know armed set ``slot`` (look at it by ``at``). True if it was new."""
        with self.lock:
            old = self.sets.get(slot)
            if old is None or old > at:
                self.sets[slot] = at
            return old is None


def node_from(client: redis.Redis, db: int | None, name: str) -> Node:
    """The node of a single Redis (or of one of ``nodes``), from its client."""
    kwargs, connection_class = clients.options_of(client)
    kwargs["decode_responses"] = False
    if db is not None:
        kwargs["db"] = db
    kwargs.pop("client_name", None)
    return Node(name, kwargs, connection_class)


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
