"""`rsched bench`: runs with real processes, reports every figure with sane
types, refuses a namespace that holds data, and leaves nothing behind.

No timed asserts: speed is what the bench measures, not what tests check."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from tests.support import Cli, RedisServer

NUMBER = (int, float)


def _figures(report: dict) -> None:
    enq = report["enqueue"]
    assert enq["tasks"] > 0
    assert isinstance(enq["in_process_per_s"], int) and enq["in_process_per_s"] > 0
    assert isinstance(enq["process_per_s"], int) and enq["process_per_s"] > 0


def test_quick_embedded_reports_every_figure(cli: Cli) -> None:
    # a short idle window: the test checks every figure is there, not its value
    res = cli("bench", "--quick", "--embedded", "--idle-for", "2s", "--json", timeout=600)
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    assert r["server"]["embedded"] is True
    assert r["server"]["version"]
    assert r["machine"]["cpus"] >= 1
    _figures(r)
    d = r["drain"]
    for k in ("python_per_s", "command_per_s"):
        assert isinstance(d[k], int) and d[k] > 0
    assert d["command_concurrency"] >= 1
    for handler in ("python", "command"):
        lat = r["lateness"][handler]
        for k in ("p50_ms", "p99_ms", "max_ms"):
            assert isinstance(lat[k], NUMBER)
        assert lat["p50_ms"] <= lat["p99_ms"] <= lat["max_ms"]
        # never early by the server clock
        assert lat["early"] == 0
    cold = r["cold"]
    assert isinstance(cold["add_ms"], NUMBER) and cold["add_ms"] > 0
    assert cold["runs"] >= 1
    idle = r["idle"]
    assert idle["window_s"] == 2.0  # --idle-for
    for k in ("consumer_requests_per_s", "cron_requests_per_s"):
        assert isinstance(idle[k], NUMBER) and idle[k] >= 0
    for k in ("consumer_cmds_per_s", "cron_cmds_per_s"):
        assert isinstance(idle[k], NUMBER) and idle[k] >= 0
    s = r["scale"]
    assert s["small"] < s["large"]
    for k in ("claim_p50_us_small", "claim_p50_us_large", "add_p50_us_small", "add_p50_us_large"):
        assert isinstance(s[k], int) and s[k] > 0
    assert isinstance(s["claim_ratio"], NUMBER) and s["claim_ratio"] > 0
    assert isinstance(s["memory_bytes_per_task"], int) and 0 < s["memory_bytes_per_task"] < 10_000
    lk = r["locks"]  # every waiter got the lock once, from the release before it
    assert lk["handovers"] == lk["waiters"] * r["params"]["lock_chains"] > 0
    assert 0 < lk["handover_p50_ms"] <= lk["handover_p99_ms"] <= lk["handover_max_ms"]
    # every target is judged, with a boolean
    assert set(r["met"]) == set(r["targets"])
    assert all(isinstance(v, bool) for v in r["met"].values())


def test_table_output(cli: Cli) -> None:
    res = cli("bench", "--quick", "--only", "enqueue", timeout=300)
    assert res.returncode == 0, res.stderr
    assert "enqueue: add --from, in process" in res.stdout
    assert "TARGET" in res.stdout
    assert "CPUs" in res.stderr  # the machine, on stderr


def test_configured_server_cleans_up(cli: Cli, server: RedisServer) -> None:
    ns = f"bench-{uuid.uuid4().hex[:8]}"
    res = cli(
        "bench", "--quick", "--only", "enqueue,scale", "--namespace", ns, "--json", timeout=600
    )
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    assert r["server"]["embedded"] is False
    assert r["server"]["namespace"] == ns
    _figures(r)
    assert r["scale"]["memory_bytes_per_task"] > 0
    assert "drain" not in r and "idle" not in r
    c = server.client()
    assert list(c.scan_iter(match=f"{ns}:*", count=1000)) == []


def test_default_namespace_is_fresh_and_removed(cli: Cli, server: RedisServer) -> None:
    res = cli("bench", "--quick", "--only", "cold", "--json", timeout=300)
    assert res.returncode == 0, res.stderr
    ns = json.loads(res.stdout)["server"]["namespace"]
    assert ns.startswith("rsched-bench-")
    assert list(server.client().scan_iter(match=f"{ns}:*", count=1000)) == []


def test_refuses_non_empty_namespace(cli: Cli, server: RedisServer) -> None:
    ns = f"bench-{uuid.uuid4().hex[:8]}"
    c = server.client()
    c.set(f"{ns}:precious", "1")
    res = cli("bench", "--quick", "--only", "enqueue", "--namespace", ns)
    assert res.returncode == 4, res.stderr
    assert "not empty" in res.stderr
    assert c.get(f"{ns}:precious") == "1"
    assert list(c.scan_iter(match=f"{ns}:*", count=1000)) == [f"{ns}:precious"]


@pytest.mark.parametrize(
    "args",
    [
        ["--only", "enqueue,nope"],
        ["--repeat", "0"],
        ["--namespace", "bad name"],
        ["--idle-for", "0"],
        ["--idle-for", "soon"],
    ],
)
def test_bad_options_exit_2(cli: Cli, args: list[str]) -> None:
    res = cli("bench", "--quick", *args)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("rsched: error: ") and res.stderr.count("\n") == 1, res.stderr
    assert args[0] in res.stderr, res.stderr  # naming the option


def test_config_file_and_password_reach_its_processes(tmp_path: os.PathLike[str]) -> None:
    srv = RedisServer(password="b3nch-pw").start()
    try:
        (Path(tmp_path) / "pw").write_text("b3nch-pw\n")
        (Path(tmp_path) / "rsched.toml").write_text(
            f'[redis]\nurl = "{srv.url}"\npassword_file = "{Path(tmp_path) / "pw"}"\n'
        )
        c = Cli(srv, "unused", cwd=str(tmp_path))
        env = {"RSCHED_REDIS_URL": "", "RSCHED_NAMESPACE": "", "RSCHED_REDIS_PASSWORD": ""}
        res = c("bench", "--quick", "--only", "enqueue,cold", "--json", env=env, timeout=300)
        assert res.returncode == 0, res.stderr
        assert "b3nch-pw" not in res.stdout + res.stderr
        assert srv.client().dbsize() == 0
    finally:
        srv.stop()


def test_a_figure_not_measured_shows_n_a_with_its_reason() -> None:
    from rsched.tools.bench import Report, table_rows, unmeasured

    r = Report()
    r.results["idle"] = {
        "consumer_requests_per_s": None,
        "consumer_cmds_per_s": 0.5,
        "unmeasured": {"consumer_requests_per_s": "MONITOR on n1: NOPERM"},
    }
    assert unmeasured(r) == {"idle.consumer_requests_per_s": "MONITOR on n1: NOPERM"}
    rows = {row[0]: row for row in table_rows(r)}
    assert rows["idle consumer: requests"][1] == "n/a"
    assert rows["idle consumer: commands incl. in scripts"][1] == "0.50"
    assert "idle.consumer_requests_per_s" not in r.met()  # not judged against its target
