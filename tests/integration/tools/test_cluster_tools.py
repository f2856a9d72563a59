"""`rsched bench` and `rsched demo` on a real Redis Cluster (3 primaries).

bench: the server-side figures are read from every primary (idle commands
summed, per node in --json; requests by MONITOR on every primary, other
clients' connections left out), memory per task from the primary that holds
the queue's slot, cold `rsched add` through the cluster client (its tasks land
where the library finds them), queues split into partitions with --partitions;
a figure that cannot be measured (MONITOR refused by ACL) is null with a reason.
demo: `rsched demo --redis-url` runs there (not on an embedded server), with
its queue in partitions over the primaries: each tick once, each task once,
and it leaves nothing behind.

No timed asserts: the figures' speed is what the bench measures.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator

import pytest

from tests.clusters import Cluster, ClusterCli, ccli, cluster, needs_cluster

__all__ = ["ccli", "cluster"]  # fixtures, imported for pytest

pytestmark = needs_cluster

NUMBER = (int, float)


def _keys(cluster: Cluster, pattern: str) -> list[str]:
    c = cluster.client()
    try:
        return list(c.scan_iter(match=pattern, count=1000))
    finally:
        c.close()


def _primaries(cluster: Cluster) -> set[str]:
    return {f"127.0.0.1:{n.port}" for n in cluster.nodes}  # no replicas in this cluster


@pytest.fixture
def load(cluster: Cluster) -> Iterator[str]:
    """Another client: about 100 GETs a second on one primary, on a connection
    opened before the bench starts (name of the node)."""
    node = cluster.nodes[2]
    c = node.client()
    c.ping()
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(0.01):  # a pace for the load, not a synchronisation
            c.get("other-client")

    t = threading.Thread(target=run, daemon=True)
    t.start()
    yield f"127.0.0.1:{node.port}"
    stop.set()
    t.join(10)
    c.close()


def test_bench_on_a_cluster_reads_every_primary(
    cluster: Cluster, ccli: ClusterCli, load: str
) -> None:
    ns = f"bench-{uuid.uuid4().hex[:8]}"
    res = ccli(
        "bench",
        "--quick",
        "--only",
        "enqueue,cold,idle,scale",
        "--idle-for",
        "2s",
        "--partitions",
        "3",
        "--namespace",
        ns,
        "--json",
        timeout=300,
    )
    r = json.loads(res.stdout)
    srv = r["server"]
    assert srv["cluster"] is True and srv["primaries"] == 3 and srv["partitions"] == 3
    assert r["params"]["partitions"] == 3
    # enqueue through `add --from --partitions 3`, in process and as a process
    assert r["enqueue"]["in_process_per_s"] > 0 and r["enqueue"]["process_per_s"] > 0
    # cold start: the one-shot client hands over to the cluster client; every add stored
    cold = r["cold"]
    assert isinstance(cold["add_ms"], NUMBER) and cold["add_ms"] > 0
    assert "cluster" in cold["client"]
    # idle: every primary measured, the sum is the per-node figures' sum
    idle = r["idle"]
    assert idle["nodes"] == 3 and set(idle["per_node"]) == _primaries(cluster)
    assert idle["unmeasured"] == {}
    for k in ("consumer_requests_per_s", "consumer_cmds_per_s", "cron_requests_per_s"):
        assert isinstance(idle[k], NUMBER) and idle[k] >= 0
        per = [n[k] for n in idle["per_node"].values()]
        assert idle[k] == pytest.approx(sum(per), abs=0.02)
    # the other client's GETs are seen on its node, and not taken for the
    # consumer's or the runner's requests (MONITOR leaves its connection out)
    assert idle["per_node"][load]["other_clients_cmds_per_s"] > 10
    assert idle["other_clients_cmds_per_s"] >= idle["per_node"][load]["other_clients_cmds_per_s"]
    assert idle["consumer_requests_per_s"] < 10 and idle["cron_requests_per_s"] < 10
    # scale: memory read on the primary that holds the large queue's slot
    s = r["scale"]
    assert s["unmeasured"] == {}
    assert (
        s["memory_node"]
        == f"127.0.0.1:{cluster.node_of(f'{ns}:{{q:bench-scale-large}}:sched').port}"
    )
    assert isinstance(s["memory_bytes_per_task"], int) and 0 < s["memory_bytes_per_task"] < 10_000
    for k in ("claim_p50_us_small", "claim_p50_us_large", "add_p50_us_small"):
        assert isinstance(s[k], int) and s[k] > 0
    assert _keys(cluster, f"{ns}:*") == []  # every primary's keys, partition config included


def test_bench_figure_it_cannot_measure_is_null_with_the_reason(
    cluster: Cluster, ccli: ClusterCli
) -> None:
    """A user that may not MONITOR: requests/s are null, the reason names
    MONITOR; the commandstats figures are still measured on every primary."""
    for n in cluster.nodes:
        c = n.client()
        try:
            c.acl_setuser(
                "bencher",
                enabled=True,
                passwords=["+b3nch"],
                keys=["*"],
                channels=["*"],
                commands=["+@all", "-monitor"],
                reset=True,
            )
        finally:
            c.close()
    url = cluster.url.replace("redis://", "redis://bencher@")
    res = ccli(
        "bench",
        "--quick",
        "--only",
        "idle",
        "--idle-for",
        "2s",
        "--json",
        "--redis-url",
        url,
        env={"RSCHED_REDIS_PASSWORD": "b3nch"},
        timeout=300,
    )
    assert "b3nch" not in res.stdout + res.stderr
    idle = json.loads(res.stdout)["idle"]
    for k in ("consumer_requests_per_s", "cron_requests_per_s"):
        assert idle[k] is None
        assert "MONITOR" in idle["unmeasured"][k]
        assert all(n[k] is None for n in idle["per_node"].values())
    for k in ("consumer_cmds_per_s", "cron_cmds_per_s"):
        assert isinstance(idle[k], NUMBER) and idle[k] >= 0


def test_demo_on_a_cluster_with_partitions(cluster: Cluster, ccli: ClusterCli) -> None:
    # RSCHED_REDIS_URL alone keeps the embedded server; --redis-url picks the cluster
    res = ccli(
        "demo",
        "--redis-url",
        cluster.url,
        "--partitions",
        "3",
        "--seconds",
        "6",
        "--tasks",
        "60",
        "--json",
        timeout=120,
    )
    out = json.loads(res.stdout)
    assert out["server"]["embedded"] is False
    assert out["server"]["cluster"] is True and out["server"]["primaries"] == 3
    assert out["server"]["partitions"] == 3
    assert out["ok"] is True
    c = out["cron"]
    assert c["ticks"] >= 3 and c["fires"] == c["ticks"]
    assert c["duplicates"] == 0 and c["missed"] == 0
    assert out["tasks"] == {
        **out["tasks"],
        "added": 60,
        "ran": 60,
        "duplicates": 0,
        "lost": 0,
        "early": 0,
    }
    assert _keys(cluster, f"{out['server']['namespace']}:*") == []


def test_bad_partitions_exit_2(ccli: ClusterCli) -> None:
    for cmd in (["bench", "--quick", "--only", "cold"], ["demo"]):
        res = ccli(*cmd, "--partitions", "0", check=2)
        assert "--partitions" in res.stderr
