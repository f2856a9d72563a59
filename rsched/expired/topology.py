"""One :class:`Node` per primary holds a Pub/Sub subscription and a
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
"""

from __future__ import annotations

import time
from typing import Any

import redis

from rsched.core import clients
from rsched.core.errors import RedisUnavailable, map_error
from rsched.expired.base import RunnerBase
from rsched.expired.model import Node
from rsched.expired.notify import key_text, one_line

#: Cluster: how often the list of primaries is refreshed (and at once after a
#: connection error, at most every TOPOLOGY_MIN_GAP_S).
TOPOLOGY_INTERVAL_S = 5.0
TOPOLOGY_MIN_GAP_S = 0.5


def parse_cluster_slots(
    reply: Any, asked_host: str
) -> dict[tuple[str, int], list[tuple[int, int]]]:
    """``CLUSTER SLOTS`` -> {(host, port) of each primary: its slot ranges}."""
    out: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for entry in reply or []:
        lo, hi, primary = int(entry[0]), int(entry[1]), entry[2]
        host = key_text(primary[0] or b"")
        if host == "?":  # an endpoint the node does not know
            continue
        addr = (host or asked_host, int(primary[1]))
        out.setdefault(addr, []).append((lo, hi))
    return out


class TopologyMixin(RunnerBase):
    """The nodes of a cluster: follow its primaries as they change."""

    def _new_node(self, host: str, port: int, late: bool = False) -> Node:
        return Node(
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
                        f"could not refresh the cluster's primaries ({one_line(map_error(exc))}); "
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
                return parse_cluster_slots(
                    n.cmd.execute_command("CLUSTER SLOTS"), str(n.kwargs["host"])
                )
            except redis.RedisError as exc:
                last = exc
        for host, port in self._seeds:
            if f"{host}:{port}" in tried:
                continue
            c = clients.node_client(
                {**self._template, "host": host, "port": port}, self._conn_class
            )
            try:
                return parse_cluster_slots(c.execute_command("CLUSTER SLOTS"), host)
            except redis.RedisError as exc:
                last = exc
            finally:
                clients.close(c)
        raise last or RedisUnavailable("no cluster node to ask for its primaries")

    def _refresh_topology(self, start_threads: bool = True) -> None:
        """Follow the cluster's primaries: a new one (a promoted replica, an added
        node) gets a subscription and a sweeper; one that is no longer a primary
        (dead, demoted, removed) has its threads stopped; armed sets of slots that
        moved are handed to their new node's sweeper."""
        owners = self._cluster_slots()
        if not owners:
            raise redis.exceptions.ClusterDownError("CLUSTER SLOTS lists no primary")
        added: list[Node] = []
        with self._nodes_lock:
            if self._stop.is_set():
                return
            current = {n.name: n for n in self.nodes}
            fresh: list[Node] = []
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

    def _redirect_node(self, host: str, port: int) -> Node:
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
