"""`run cron B --after A` (issue 13, "Act"): B runs once each time A finishes ok,
once across all of B's runners (several processes), also for a run of A that
ended while no runner of B was alive; a cycle is refused."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from rsched.api import Rsched
from tests.clusters import Cluster, ClusterCli, ccli, cluster, needs_cluster
from tests.integration.cron.test_cron import history, job, lines, spawn_runner, stop_all
from tests.support import Cli, wait_for

__all__ = ["ccli", "cluster"]  # fixtures, imported for pytest

YEARLY = "0 0 1 1 *"


def spawn_after(
    cli: Cli, tmp_path: Path, name: str, after: str, cmd: list[str], *opts: str
) -> subprocess.Popen[str]:
    errlog = tmp_path / f"runner-{name}-{len(cli.procs)}.log"
    fd = os.open(errlog, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        return cli.spawn(
            "-v", "run", "cron", name, "--after", after, *opts, "--", *cmd,
            stdout=subprocess.DEVNULL, stderr=fd,
        )  # fmt: skip
    finally:
        os.close(fd)


def _live(cli: Cli, name: str, n: int) -> None:
    wait_for(
        lambda: [r for r in cli.json("crons") if r["name"] == name and r["runners"] == n],
        timeout=15,
        what=f"{n} live runners of {name}",
    )


def _after_runs(cli: Cli, name: str, n: int) -> list[dict[str, Any]]:
    def got() -> list[dict[str, Any]]:
        recs = [r for r in history(cli, name) if r["result"] == "ok"]
        return recs if len(recs) >= n else []

    return wait_for(got, timeout=15, what=f"{n} runs of {name}")


def test_b_runs_once_per_ok_run_of_a_across_three_runners(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    alog, blog, flag = tmp_path / "a", tmp_path / "b", tmp_path / "fail"
    a = spawn_runner(cli, tmp_path, "extract", YEARLY, job(alog, f"test ! -e {flag}"))
    # allow: no run lock between B's runs; only the once-claims keep B to one run per A.
    bs = [
        spawn_after(cli, tmp_path, "load", "extract", job(blog), "--concurrency", "allow")
        for _ in range(3)
    ]
    _live(cli, "extract", 1)
    _live(cli, "load", 3)
    flag.touch()
    res = cli("trigger", "extract", "--wait", "--json", check=1)
    assert json.loads(res.stdout)["result"] == "failed"
    flag.unlink()
    ok1 = cli.json("trigger", "extract", "--wait")
    ok2 = cli.json("trigger", "extract", "--wait")
    recs = _after_runs(cli, "load", 2)
    assert sorted(r["after_token"] for r in recs) == sorted([ok1["token"], ok2["token"]])
    assert all(r["cause"] == "after extract" for r in recs), recs
    # The failed run of A started nothing; each ok one exactly one run of B.
    assert len(lines(blog)) == 2, lines(blog)
    row = next(r for r in cli.json("crons") if r["name"] == "load")
    assert row["schedule"] is None and row["next_fire_at"] is None
    assert stop_all([a, *bs]) == [0, 0, 0, 0]
    assert len(lines(blog)) == 2
    logs = [f.read_text() for f in tmp_path.glob("runner-load-*.log")]
    assert len(logs) == 3 and not any("warning" in t for t in logs), logs


def test_a_run_while_b_was_down_is_caught_up_once(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    alog, blog = tmp_path / "a", tmp_path / "b"
    a = spawn_runner(cli, tmp_path, "extract", YEARLY, job(alog))
    b = spawn_after(cli, tmp_path, "load", "extract", job(blog))
    _live(cli, "load", 1)
    first = cli.json("trigger", "extract", "--wait")
    _after_runs(cli, "load", 1)
    assert stop_all([b]) == [0]
    missed = cli.json("trigger", "extract", "--wait")  # no runner of B alive
    bs = [spawn_after(cli, tmp_path, "load", "extract", job(blog)) for _ in range(2)]
    recs = _after_runs(cli, "load", 2)
    assert sorted(r["after_token"] for r in recs) == sorted([first["token"], missed["token"]])
    _live(cli, "load", 2)
    assert stop_all([a, *bs]) == [0, 0, 0]
    assert len(lines(blog)) == 2


def test_cycles_and_bad_after_are_refused_with_exit_2(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    conf = tmp_path / "cycle.toml"
    conf.write_text(
        '[cron.a]\nafter = ["b"]\ncommand = "true"\n[cron.b]\nafter = ["a"]\ncommand = "true"\n'
    )
    res = cli("--config", str(conf), "run", "cron", "--all", check=2)
    assert "cycle" in res.stderr and "a after b after a" in res.stderr, res.stderr
    assert cli("run", "cron", "x", "--after", "x", "--", "true", check=2).stderr.count("itself")
    assert "--schedule" in cli("run", "cron", "x", "--", "true", check=2).stderr
    assert "--after" in cli("run", "cron", "x", "--after", "bad name", "--", "true", check=2).stderr
    assert list(rs.redis.scan_iter(f"{rs.keys.ns}:*")) == []
    # Known from what runners registered: c runs after d; d after c is a cycle.
    c = spawn_after(cli, tmp_path, "c", "d", ["true"])
    _live(cli, "c", 1)
    res = cli("run", "cron", "d", "--after", "c", "--", "true", check=2)
    assert "d after c after d" in res.stderr, res.stderr
    assert stop_all([c]) == [0]


@needs_cluster
def test_trigger_and_after_on_a_cluster(cluster: Cluster, ccli: ClusterCli) -> None:
    """A and B in slots of different primaries: the trigger's keys are one slot (A's),
    B's runners read A's history there and queue B's run in B's slot."""
    a_name = "extract"
    b_name = next(
        n
        for n in (f"load{i}" for i in range(50))
        if cluster.node_of(f"{ccli.namespace}:{{c:{n}}}:state").port
        != cluster.node_of(f"{ccli.namespace}:{{c:{a_name}}}:state").port
    )
    blog = Path(ccli.cwd) / "b"
    a = ccli.spawn("run", "cron", a_name, "--schedule", YEARLY, "--", "true")
    bs = [ccli.spawn("run", "cron", b_name, "--after", a_name, "--", *job(blog)) for _ in range(2)]
    _live(ccli, a_name, 1)
    _live(ccli, b_name, 2)
    ran = ccli.json("trigger", a_name, "--wait")
    assert ran["result"] == "ok" and ran["token"] is not None
    recs = _after_runs(ccli, b_name, 1)
    assert [r["after_token"] for r in recs] == [ran["token"]]
    assert stop_all([a, *bs]) == [0, 0, 0]
    assert len(lines(blog)) == 1
