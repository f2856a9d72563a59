"""`rsched cancel --all --type T` (issue 13, "Act"): paged on the server, by state,
every partition, running tasks stopped as one cancel stops them."""

from __future__ import annotations

import json
from pathlib import Path

from rsched.api import Rsched
from tests.clusters import Cluster, ClusterCli, ccli, cluster, needs_cluster
from tests.integration.consumer.test_consumer import alive, script, start
from tests.support import Cli, free_port, wait_for

__all__ = ["ccli", "cluster"]  # fixtures, imported for pytest


def _lines(task_type: str, n: int, *, queue: str = "default", **extra: object) -> str:
    rows = [
        {"type": task_type, "id": f"{task_type}-{i}", "queue": queue, **extra} for i in range(n)
    ]
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_cancel_all_refusals_before_connecting(cli: Cli) -> None:
    down = {"RSCHED_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    for args, field in (
        (["cancel", "--all"], "--type"),
        (["cancel", "--all", "--type", "bad type"], "--type"),
        (["cancel", "--all", "--type", "t", "--queue", "bad q"], "--queue"),
        (["cancel", "--all", "--type", "t", "t", "1"], "--all"),
        (["cancel", "t", "1", "--dry-run"], "--dry-run"),
        (["cancel", "t", "1", "--type", "t"], "--type"),
        (["cancel", "t", "1", "--state", "due"], "--state"),
        (["cancel"], "TYPE"),
    ):
        res = cli(*args, env=down, check=2)
        assert field in res.stderr and len(res.stderr.strip().splitlines()) == 1, (args, res.stderr)
    # click's own refusal of a choice (as `list --state`): usage, then the field
    res = cli("cancel", "--all", "--type", "t", "--state", "nope", env=down, check=2)
    assert "'--state'" in res.stderr.splitlines()[-1]


def test_cancel_all_pages_by_type_and_state(cli: Cli, rs: Rsched) -> None:
    feed = (
        _lines("a", 700)
        + _lines("b", 5)
        + "".join(
            json.dumps({"type": "a", "id": f"later-{i}", "in": "1h"}) + "\n" for i in range(600)
        )
    )
    cli("add", "--from", "-", input=feed, check=0)
    assert cli.json("cancel", "--all", "--type", "a", "--dry-run") == {"would_cancel": 1300}
    got = cli.json("cancel", "--all", "--type", "a", "--state", "due", "--dry-run")
    assert got == {"would_cancel": 700}
    assert rs.redis.hlen(rs.keys.queue("default").tasks) == 1305  # a dry run writes nothing
    got = cli.json("cancel", "--all", "--type", "a", "--state", "scheduled")
    assert got == {"cancelled": 600}
    assert cli.json("list", "--state", "scheduled") == []
    res = cli("cancel", "--all", "--type", "a", check=0)
    assert res.stdout == "cancelled 700 tasks of type a in queue default\n"
    left = cli.json("list")
    assert sorted(t["id"] for t in left) == [f"b-{i}" for i in range(5)]
    assert cli.json("cancel", "--all", "--type", "a") == {"cancelled": 0}
    assert cli.json("cancel", "--all", "--type", "b", "--queue", "none") == {"cancelled": 0}
    assert rs.redis.xlen(rs.keys.queue("default").history) == 0  # none was running


def test_cancel_all_every_partition(cli: Cli, rs: Rsched) -> None:
    cli("add", "--from", "-", "--partitions", "3", input=_lines("p", 40, queue="pq"), check=0)
    cli("add", "x", "1", "--queue", "pq", check=0)
    assert cli.json("cancel", "--all", "--type", "p", "--queue", "pq") == {"cancelled": 40}
    assert [t["id"] for t in cli.json("list", "--queue", "pq")] == ["1"]


def test_cancel_all_stops_running_handlers(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    h = script(tmp_path, "long.sh", """
        echo $$ > "$OUT_DIR/$RSCHED_TASK_ID.pid"
        exec sleep 300
    """)  # fmt: skip
    cli("add", "job.long", "r1", check=0)
    cli("add", "job.long", "r2", check=0)
    cli("add", "job.long", "later", "--in", "1h", check=0)
    _p, err = start(cli, tmp_path, "--handler", f"job.long={h}", "--concurrency", "2",
                    "--grace", "1s", env={"OUT_DIR": str(tmp_path)})  # fmt: skip
    pids = [tmp_path / "r1.pid", tmp_path / "r2.pid"]
    wait_for(lambda: all(p.exists() for p in pids), timeout=15, what="both handlers running")
    running = [int(p.read_text()) for p in pids]
    got = cli.json("cancel", "--all", "--type", "job.long", "--state", "processing")
    assert got == {"cancelled": 2}
    wait_for(lambda: not any(alive(pid) for pid in running), timeout=10, what="handlers stopped")
    recs = [json.loads(f["j"]) for _, f in rs.redis.xrange(rs.keys.queue("default").history)]
    assert sorted((r["id"], r["result"]) for r in recs) == [
        ("r1", "cancelled"),
        ("r2", "cancelled"),
    ]
    assert [t["id"] for t in cli.json("list")] == ["later"]
    wait_for(lambda: "cancelled job.long r1" in err.read_text(), timeout=10, what="log line")


@needs_cluster
def test_act_on_a_cluster(cluster: Cluster, ccli: ClusterCli) -> None:
    """cancel --all over partitions spread on every primary; forget (its registry is in
    another slot) and the unknown-name refusal."""
    ccli("add", "--from", "-", "--partitions", "4", input=_lines("p", 30, queue="cq"))
    assert ccli.json("cancel", "--all", "--type", "p", "--queue", "cq", "--dry-run") == {
        "would_cancel": 30
    }
    assert ccli.json("cancel", "--all", "--type", "p", "--queue", "cq") == {"cancelled": 30}
    assert ccli.json("list", "--queue", "cq") == []
    ccli("pause", "c.old", check=3)
    ccli("pause", "c.old", "--create")
    got = ccli.json("forget", "c.old")
    assert got["forgotten"] is True and got["keys"] == 2  # paused, state
    ccli("forget", "c.old", check=3)
