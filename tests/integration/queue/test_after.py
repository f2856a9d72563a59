"""Task dependencies (`add --after TYPE ID`, SPEC §4 "Queue features"): a task
waits (state waiting) until every parent finished ok; a parent that goes dead
(a failed last attempt, a lapsed last lease) or is cancelled sends the tasks
waiting for it dead, with an error naming it, and theirs in turn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rsched.api import Rsched
from rsched.lua import calls
from tests.clusters import Cluster, ClusterCli, ccli, cluster, needs_cluster
from tests.integration.queue.test_bad_input import _run
from tests.support import Cli, RedisServer, free_port, wait_for

__all__ = ["ccli", "cluster"]  # fixtures, imported for pytest

#: A handler: a parent (dep.p) marks itself done after a short run; a child (dep.c)
#: records which parents' marks it found when it started.
HANDLER = """#!{python}
import os, sys, time
out = sys.argv[1]
tid = os.environ["RSCHED_TASK_ID"]
if os.environ["RSCHED_TASK_TYPE"] == "dep.p":
    time.sleep(0.3)
    open(os.path.join(out, "done-" + tid), "w").close()
else:
    seen = sorted(f[5:] for f in os.listdir(out) if f.startswith("done-"))
    with open(os.path.join(out, "child-" + tid), "w") as fh:
        fh.write(" ".join(seen))
"""


def _handler(tmp_path: Path) -> str:
    h = tmp_path / "h.py"
    h.write_text(HANDLER.format(python=sys.executable))
    h.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    return f"{h} {out}"


def _snapshot(rs: Rsched) -> dict[str, object]:
    r = rs.redis
    return {k: r.dump(k) for k in sorted(r.scan_iter(f"{rs.namespace}:*"))}


@pytest.mark.valkey
def test_a_child_runs_only_after_both_parents_ran_ok(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    h = _handler(tmp_path)
    cli("add", "dep.p", "p1", check=0)
    cli("add", "dep.p", "p2", "--in", "1s", check=0)
    child = cli.json("add", "dep.c", "c", "--after", "dep.p", "p1", "--after", "dep.p", "p2")
    assert child["state"] == "waiting" and child["waiting_for"] == ["dep.p p1", "dep.p p2"]
    shown = cli("show", "dep.c", "c", check=0).stdout
    assert "waiting for" in shown and "dep.p p1, dep.p p2" in shown
    [row] = cli.json("list", "--state", "waiting")
    assert (row["id"], row["waiting_for"]) == ("c", ["dep.p p1", "dep.p p2"])
    # counted as waiting, not as scheduled or due, by queues and metrics
    [q] = cli.json("queues")
    assert (q["waiting"], q["scheduled"] + q["due"]) == (1, 2), q
    assert "WAITING" in cli("queues", check=0).stdout
    metrics = cli("metrics", check=0).stdout
    assert 'rsched_queue_tasks{queue="default",state="waiting"} 1.0' in metrics
    procs = [
        cli.spawn("run", "consumer", "--handler", f"dep.*={h}", "--concurrency", "2")
        for _ in range(3)
    ]
    out = tmp_path / "out"
    wait_for(lambda: (out / "child-c").exists(), timeout=15, what="the child to run")
    # it found both parents done when it started
    assert (out / "child-c").read_text() == "p1 p2"
    wait_for(lambda: not rs.list(), timeout=10, what="every task acknowledged")
    assert all(p.poll() is None for p in procs)
    assert cli.json("queues")[0]["waiting"] == 0


def test_release_keeps_the_childs_own_due_time_and_priority(rs: Rsched) -> None:
    rs.add("dep.p", "a")
    r = rs.add("dep.c", "late", delay="1h", priority=5, after=[("dep.p", "a")])
    assert r.task.state == "waiting"
    assert rs.show("dep.c", "late").due_ms == r.task.due_ms
    q = rs.keys.queue("default")
    claimed = _claim(rs)
    assert [t[0] for t in claimed] == ["dep.p a"]  # the waiting child is not claimed
    assert calls.ack(rs, q, 100, [("dep.p a", str(claimed[0][4]), "")]) == [True]
    t = rs.show("dep.c", "late")
    assert (t.state, t.due_ms, t.priority, t.waiting_for) == (
        "scheduled",
        r.task.due_ms,
        5,
        [],
    )


def _claim(rs: Rsched, lease_ms: int = 60_000) -> list[list[object]]:
    reply = calls.claim(
        rs,
        rs.keys.queue("default"),
        max_tasks=10,
        lease_ms=lease_ms,
        consumer="t",
        registration_ttl_ms=15_000,
        reap_limit=100,
        history_maxlen=100,
        queue="default",
        default_max_attempts=1,
    )
    return [list(t) for t in reply.tasks()]


@pytest.mark.valkey
def test_a_dead_parent_sends_child_and_grandchild_dead(cli: Cli, rs: Rsched) -> None:
    cli("add", "dep.f", "p", "--max-attempts", "1", check=0)
    cli("add", "dep.p", "other", "--in", "1h", check=0)
    cli("add", "dep.c", "c", "--after", "dep.f", "p", "--after", "dep.p", "other", check=0)
    cli("add", "dep.c", "g", "--after", "dep.c", "c", check=0)
    cli.spawn("run", "consumer", "--handler", "dep.f=false", stdout=subprocess.DEVNULL)
    wait_for(lambda: rs.show("dep.c", "g").state == "dead", timeout=15, what="grandchild dead")
    c, g = rs.show("dep.c", "c"), rs.show("dep.c", "g")
    assert c.state == "dead" and c.last_error == "parent dep.f p went dead"
    assert g.last_error == "parent dep.c c went dead" and g.waiting_for == []
    assert rs.show("dep.p", "other").state == "scheduled"  # the other parent is untouched
    dead_ids = {e["id"] for e in cli.json("events", "--limit", "100") if e["event"] == "task.dead"}
    assert dead_ids == {"p", "c", "g"}
    # a task added after a dead parent is dead at once
    late = cli.json("add", "dep.c", "late", "--after", "dep.f", "p")
    assert late["state"] == "dead" and late["last_error"] == "parent dep.f p is dead"


def test_a_lapsed_last_lease_sends_children_dead(rs: Rsched, cli: Cli) -> None:
    """The reap (requeue-stale-9; claim-18 runs the same fragment)."""
    rs.add("dep.p", "p", max_attempts=1)
    lines = "\n".join(
        json.dumps(o)
        for o in (
            {"type": "dep.c", "id": "c", "after": [["dep.p", "p"]]},
            {"type": "dep.c", "id": "g", "in": "1m", "after": [["dep.c", "c"]]},
        )
    )
    assert cli.json("add", "--from", "-", input=lines + "\n")["added"] == 2
    assert rs.show("dep.c", "g").waiting_for == ["dep.c c"]
    [(m, *_)] = _claim(rs, lease_ms=200)
    assert m == "dep.p p"
    q = rs.keys.queue("default")
    wait_for(lambda: rs.now_ms() > int(rs.redis.zscore(q.proc, m) or 0), timeout=5)
    assert cli.json("requeue-stale") == {"requeued": 0, "dead": 1}
    assert {t.id: t.last_error for t in rs.list(state="dead")} == {
        "p": "lease expired (attempt 1 of 1)",
        "c": "parent dep.p p went dead",
        "g": "parent dep.c c went dead",
    }
    assert rs.list(state="waiting") == []


def test_cancel_of_a_parent_sends_its_children_dead(cli: Cli, rs: Rsched) -> None:
    rs.add("dep.p", "p", delay="1h")
    rs.add("dep.c", "c", after=[("dep.p", "p")])
    rs.add("dep.c", "g", after=[("dep.c", "c")])
    cli("cancel", "dep.p", "p", check=0)
    assert rs.show("dep.c", "c").last_error == "parent dep.p p was cancelled"
    assert rs.show("dep.c", "g").last_error == "parent dep.c c went dead"
    assert {t.state for t in rs.list()} == {"dead"}
    # cancelling a waiting task takes it out of the waiting set
    rs.add("dep.p", "q", delay="1h")
    rs.add("dep.c", "w", after=[("dep.p", "q")])
    assert cli.json("cancel", "dep.c", "w")["was"] == "waiting"
    assert rs.list(state="waiting") == []
    cli("cancel", "--all", "--type", "dep.p", check=0)
    assert rs.list(state="waiting") == [] and rs.list(state="scheduled") == []


def test_a_missing_parent_is_refused_with_nothing_written(cli: Cli, rs: Rsched) -> None:
    rs.add("dep.p", "here")
    before = _snapshot(rs)
    res = cli("add", "dep.c", "c", "--after", "dep.p", "here", "--after", "dep.p", "gone")
    assert res.returncode == 3 and "dep.p gone" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert _snapshot(rs) == before
    res = cli("add", "--from", "-", input='{"type":"dep.c","id":"c","after":[["dep.p","no"]]}\n')
    assert res.returncode == 3 and "dep.p no" in res.stderr
    assert _snapshot(rs) == before


AFTER_CASES = [
    (["add", "dep.c", "c", "--after", "dep.p"], "--after"),
    (["add", "dep.c", "c", "--after", "bad type", "1"], "--after"),
    (["add", "dep.c", "c", "--after", "dep.p", "two words"], "--after"),
    (["add", "dep.c", "c", "--after", "dep.c", "c"], "--after"),
    (["add", "--partitions", "2", "dep.c", "c", "--after", "dep.p", "1"], "--after"),
]


@pytest.mark.parametrize("args,field", AFTER_CASES, ids=[" ".join(a) for a, _ in AFTER_CASES])
def test_bad_after_refused_before_connecting(args: list[str], field: str, tmp_path: Path) -> None:
    res = _run(args, f"redis://127.0.0.1:{free_port()}/0", tmp_path)
    assert res.returncode == 2, (args, res.returncode, res.stderr)
    assert field in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


@pytest.mark.parametrize(
    "line,field",
    [
        ('{"type":"dep.c","id":"c","after":"dep.p 1"}', "line 1: after"),
        ('{"type":"dep.c","id":"c","after":[["dep.p"]]}', "line 1: after"),
        ('{"type":"dep.c","id":"c","after":[["dep.p", 7]]}', "line 1: after"),
    ],
)
def test_bad_after_lines_refused_before_connecting(line: str, field: str, tmp_path: Path) -> None:
    from tests.support import RSCHED

    res = subprocess.run(
        [*RSCHED, "add", "--from", "-"],
        input=line + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "RSCHED_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"},
        cwd=str(tmp_path),
    )
    assert res.returncode == 2 and field in res.stderr, res.stderr


def test_after_is_refused_on_a_partitioned_queue(cli: Cli, rs: Rsched) -> None:
    """The rule: a task with --after and its parents must be in an unpartitioned
    queue (partitions are picked by each task's own TYPE ID: in general different
    slots, and one script must see parent and child). Refused, exit 2."""
    cli("add", "--queue", "pq", "--partitions", "2", "dep.p", "1", check=0)
    before = _snapshot(rs)
    res = cli("add", "--queue", "pq", "dep.c", "c", "--after", "dep.p", "1")
    assert res.returncode == 2 and "partitioned" in res.stderr
    assert _snapshot(rs) == before


@needs_cluster
def test_on_a_cluster_in_queues_of_every_primary(cluster: Cluster, ccli: ClusterCli) -> None:
    """Every script of the feature names its queue's keys only (one slot): a child
    is released by its parent's ack, and sent dead by a failing one, in queues on
    each of the three primaries."""
    queues = [f"a{i}" for i in range(6)]
    nodes = {cluster.node_of(f"{ccli.namespace}:{{q:{q}}}:sched").port for q in queues}
    assert len(nodes) == 3
    out = os.path.join(ccli.cwd, "ran")
    os.makedirs(out)
    args = ["run", "consumer", "--handler", f"dep.*=sh -c 'touch {out}/$RSCHED_QUEUE-$0'"]
    args += ["--handler", "bad=false", "--max-attempts", "1"]
    for q in queues:
        args += ["--queue", q]
        ccli("add", "--queue", q, "dep.p", "p")
        ccli("add", "--queue", q, "bad", "b")
        ccli("add", "--queue", q, "dep.c", "c", "--after", "dep.p", "p")
        ccli("add", "--queue", q, "dep.c", "d", "--after", "bad", "b")
    ccli.spawn(*args)
    wait_for(
        lambda: all(os.path.exists(f"{out}/{q}-c") for q in queues), timeout=30, what="children"
    )
    for q in queues:
        d = ccli.json("show", "--queue", q, "dep.c", "d")
        assert d["state"] == "dead" and d["last_error"] == "parent bad b went dead"


def test_the_async_client_shows_waiting_and_refuses_after(server: RedisServer, rs: Rsched) -> None:
    import asyncio

    from rsched.aio import Rsched as AsyncRsched
    from rsched.core.errors import BadInput

    rs.add("dep.p", "p", delay="1h")
    rs.add("dep.c", "c", after=[("dep.p", "p")])

    async def main() -> None:
        ars = AsyncRsched.from_url(server.url, namespace=rs.namespace)
        try:
            assert await ars.show("dep.c", "c") == rs.show("dep.c", "c")
            assert (await ars.show("dep.c", "c")).waiting_for == ["dep.p p"]
            with pytest.raises(BadInput, match="after"):
                await ars.add("dep.c", "d", after=[("dep.p", "p")])
            assert await ars.cancel("dep.c", "c") == "waiting"
        finally:
            await ars.close()

    asyncio.run(main())
    assert rs.list(state="waiting") == []
