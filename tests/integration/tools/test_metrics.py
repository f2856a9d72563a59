"""`rsched metrics`: Prometheus text that prometheus_client's own parser reads back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rsched.api import Rsched
from rsched.tools.metrics import exposition
from tests.support import Cli


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float | None:
    return samples(text).get((name, frozenset(labels.items())))


def test_queue_depths_lag_and_runs(cli: Cli, rs: Rsched) -> None:
    cli("add", "order.close", "1", check=0)
    cli("add", "order.close", "2", check=0)
    cli("add", "order.close", "3", "--in", "1h", check=0)
    cli("add", "mail.send", "a", "--queue", "mail", "--in", "30m", check=0)
    # run counters as the Lua core records them (ack-9 / fail-10: "RESULT|TYPE" -> count)
    st = rs.keys.queue("default").stats
    rs.redis.hset(
        st,
        mapping={
            "ok|order.close": 7,
            "failed|order.close": 2,
            "timeout|order.close": 1,
            "dead|order.close": 1,
        },
    )

    text = cli("metrics", check=0).stdout
    assert value(text, "rsched_queue_tasks", queue="default", state="due") == 2
    assert value(text, "rsched_queue_tasks", queue="default", state="scheduled") == 1
    assert value(text, "rsched_queue_tasks", queue="default", state="processing") == 0
    assert value(text, "rsched_queue_tasks", queue="default", state="dead") == 0
    assert value(text, "rsched_queue_tasks", queue="mail", state="scheduled") == 1
    assert value(text, "rsched_queue_tasks", queue="mail", state="due") == 0
    assert value(text, "rsched_queue_lag_seconds", queue="mail") == 0
    assert value(text, "rsched_queue_lag_seconds", queue="default") >= 0
    assert value(text, "rsched_queue_consumers", queue="default") == 0
    assert (
        value(text, "rsched_task_runs_total", queue="default", type="order.close", result="ok") == 7
    )
    assert (
        value(text, "rsched_task_runs_total", queue="default", type="order.close", result="failed")
        == 2
    )
    assert (
        value(text, "rsched_task_runs_total", queue="default", type="order.close", result="timeout")
        == 1
    )
    assert value(text, "rsched_task_dead_total", queue="default", type="order.close") == 1
    assert value(text, "rsched_up") == 1
    fams = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert fams["rsched_task_runs"] == "counter" and fams["rsched_queue_tasks"] == "gauge"


def test_lag_grows_with_the_oldest_due_task(cli: Cli, rs: Rsched) -> None:
    now = rs.now_ms()
    cli("add", "t", "old", "--at", _iso(now - 90_000), check=0)
    text = exposition(rs)
    lag = value(text, "rsched_queue_lag_seconds", queue="default")
    assert lag is not None and 89 <= lag < 200


def test_empty_namespace_parses(cli: Cli) -> None:
    text = cli("metrics", check=0).stdout
    assert value(text, "rsched_up") == 1
    assert not [k for k in samples(text) if k[0] == "rsched_queue_tasks"]


def test_cron_metrics_when_present(cli: Cli, rs: Rsched) -> None:
    ck = rs.keys.cron("report")
    now = rs.now_ms()
    rs.redis.sadd(rs.keys.crons, "report")
    rs.redis.hset(ck.stats, mapping={"ok": 5, "failed": 1, "missed": 2})
    rs.redis.hset(ck.state, mapping={"last_run_fire": now - 60_000})
    rs.redis.zadd(ck.runners, {"r1": now + 30_000, "r2": now + 30_000, "gone": now - 1})
    rs.redis.xadd(
        ck.history,
        {
            "j": json.dumps(
                {
                    "kind": "cron",
                    "name": "report",
                    "fire_ms": now - 60_000,
                    "started_ms": now - 59_750,
                    "result": "ok",
                }
            )
        },
    )
    rs.redis.sadd(rs.keys.crons, "never-ran")  # registered, no keys yet: skipped gracefully
    text = cli("metrics", check=0).stdout
    assert value(text, "rsched_cron_runs_total", cron="report", result="ok") == 5
    assert value(text, "rsched_cron_runs_total", cron="report", result="missed") == 2
    assert value(text, "rsched_cron_runners", cron="report") == 2
    assert value(text, "rsched_cron_paused", cron="report") == 0
    assert value(text, "rsched_cron_lateness_seconds", cron="report") == pytest.approx(0.25)
    assert value(text, "rsched_cron_last_fire_timestamp_seconds", cron="report") == pytest.approx(
        (now - 60_000) / 1000
    )
    assert value(text, "rsched_cron_runners", cron="never-ran") == 0


def test_output_file_is_written_atomically(cli: Cli, tmp_path: Path) -> None:
    cli("add", "t", "1", check=0)
    target = tmp_path / "rsched.prom"
    res = cli("metrics", "--output", str(target), check=0)
    assert res.stdout == ""
    assert value(target.read_text(), "rsched_queue_tasks", queue="default", state="due") == 1
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".rsched.prom")] == []


def test_metrics_over_http(rs: Rsched) -> None:
    import urllib.request

    from rsched.tools.metrics import serve
    from tests.support import free_port

    rs.add("t", "1")
    port = free_port()
    result = serve(rs, port)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        assert value(text, "rsched_queue_tasks", queue="default", state="due") == 1
    finally:
        server = result[0] if isinstance(result, tuple) else result
        server.shutdown()
        server.server_close()


def _iso(ms: int) -> str:
    from rsched.core.timeutil import iso

    out = iso(ms)
    assert out is not None
    return out


def test_missing_prometheus_client_is_a_config_error(cli: Cli) -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['prometheus_client'] = None\n"
        "from rsched.cli.main import main; main(['metrics'])"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=cli.env(), timeout=60
    )
    assert res.returncode == 78, res.stderr
    assert "pip install 'rsched[metrics]'" in res.stderr


def test_lock_holders(rs: Rsched) -> None:
    from rsched.locks.lock import Lock

    with Lock(rs, "nightly", ttl_ms=30_000, watchdog=False):
        text = exposition(rs)
        assert value(text, "rsched_lock_held", lock="nightly") == 1
        ttl = value(text, "rsched_lock_ttl_seconds", lock="nightly")
        assert ttl is not None and 0 < ttl <= 30
    text = exposition(rs)
    assert value(text, "rsched_lock_held", lock="nightly") == 0


def test_unreachable_redis_writes_rsched_up_0(cli: Cli, tmp_path: Path) -> None:
    """The textfile collector must not keep serving the last good file as "up"."""
    from tests.support import free_port

    cli("add", "t", "1", check=0)
    target = tmp_path / "rsched.prom"
    cli("metrics", "-o", str(target), check=0)
    assert value(target.read_text(), "rsched_up") == 1
    down = {"RSCHED_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}  # nobody listens
    res = cli("metrics", "-o", str(target), env=down)
    assert res.returncode == 69 and res.stdout == ""
    [line] = res.stderr.splitlines()
    assert line.startswith("rsched: error: ")
    # Only rsched_up 0: no queue depth, lag or run counter left over from the last scrape.
    assert samples(target.read_text()) == {("rsched_up", frozenset()): 0}
    assert [p.name for p in tmp_path.iterdir()] == ["rsched.prom"]  # no temp file left
    # On stdout the same: the scrape says "down" instead of saying nothing.
    res = cli("metrics", env=down)
    assert res.returncode == 69 and samples(res.stdout) == {("rsched_up", frozenset()): 0}
    res = cli("metrics", "--json", env=down)
    assert res.returncode == 69
    assert json.loads(res.stdout) == [{"name": "rsched_up", "labels": {}, "value": 0}]


def test_json_samples(cli: Cli) -> None:
    cli("add", "t", "1", check=0)
    for args in (["metrics", "--json"], ["--json", "metrics"]):
        rows = cli(*args, check=0).stdout
        got = {(r["name"], frozenset(r["labels"].items())): r["value"] for r in json.loads(rows)}
        assert got[("rsched_up", frozenset())] == 1
        assert (
            got[("rsched_queue_tasks", frozenset({"queue": "default", "state": "due"}.items()))]
            == 1
        )
