"""A real Redis Cluster for tests: ``Cluster(primaries, replicas).start()`` starts
the nodes on free ports and joins them with ``redis-cli --cluster create``;
``ClusterCli`` runs real ``rsched`` processes against it in one namespace.
Test modules import the ``cluster`` / ``ccli`` fixtures from here.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from tests.support import RSCHED, free_port, server_binary, stop_all, wait_for


def cli_binary() -> str | None:
    binary = server_binary()
    cli = Path(binary).with_name(
        "valkey-cli" if Path(binary).name.startswith("valkey") else "redis-cli"
    )
    if cli.exists():
        return str(cli)
    return shutil.which("redis-cli") or shutil.which("valkey-cli")


needs_cluster = pytest.mark.skipif(cli_binary() is None, reason="no redis-cli to create a cluster")


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
        cli = cli_binary()
        assert cli is not None
        subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *[f"127.0.0.1:{n.port}" for n in self.nodes],
                "--cluster-replicas",
                str(self.replicas),
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        wait_for(self.ok, timeout=30, what="cluster_state:ok on every node")
        return self

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


class ClusterCli:
    """Real `rsched` processes against the cluster, one namespace."""

    def __init__(self, url: str, namespace: str, cwd: str):
        self.url, self.namespace, self.cwd = url, namespace, cwd
        self.procs: list[subprocess.Popen[str]] = []

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RSCHED_", "REDIS_URL"))}
        env.update(
            RSCHED_REDIS_URL=self.url,
            RSCHED_NAMESPACE=self.namespace,
            NO_COLOR="1",
            PYTHONUNBUFFERED="1",
        )
        env.update(extra)
        return env

    def __call__(
        self, *args: str, input: str | None = None, check: int | None = 0, **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(
            [*RSCHED, *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=kw.pop("timeout", 60),
            env=self.env(**kw.pop("env", {})),
            cwd=self.cwd,
        )
        if check is not None:
            assert res.returncode == check, (
                f"rsched {' '.join(args)} -> {res.returncode}\n"
                f"stdout: {res.stdout}\nstderr: {res.stderr}"
            )
        return res

    def json(self, *args: str, **kw: Any) -> Any:
        return json.loads(self(*args, "--json", **kw).stdout)

    def spawn(self, *args: str, **kw: Any) -> subprocess.Popen[str]:
        p = subprocess.Popen(
            [*RSCHED, *args],
            env=self.env(**kw.pop("env", {})),
            cwd=self.cwd,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.procs.append(p)
        return p

    def close(self) -> None:
        stop_all(self.procs)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster(primaries=3)
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.fixture
def ccli(cluster: Cluster, tmp_path: Path) -> Iterator[ClusterCli]:
    c = ClusterCli(cluster.url, f"c{uuid.uuid4().hex[:8]}", str(tmp_path))
    yield c
    c.close()
