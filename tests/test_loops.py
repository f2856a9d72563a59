"""What every run loop does at start: doctor's warnings on stderr, and --metrics-port."""

from __future__ import annotations

import signal
import urllib.request

import pytest

from tests.support import Cli, free_port, wait_for


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
        return resp.read().decode()


@pytest.mark.parametrize(
    "args",
    [
        ["run", "consumer", "--call", "t.x=json:dumps"],
        ["run", "cron", "loops.tick", "--schedule", "@hourly"],
    ],
)
def test_run_loop_serves_metrics_and_logs_startup_warnings(cli: Cli, args: list[str]) -> None:
    cli("add", "--in", "1h", "t.x", "1", check=0)
    port = free_port()
    tail = ["--", "true"] if args[1] == "cron" else []
    p = cli.spawn(*args, "--metrics-port", str(port), *tail)
    text = wait_for(lambda: _scrape(port), timeout=20, what="the metrics endpoint")
    assert 'rsched_queue_tasks{queue="default",state="scheduled"} 1.0' in text
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    # The suite's shared server runs without AOF or RDB: the loop says so at start.
    assert "WARN persistence" in err


def test_bad_metrics_port_is_refused_before_connecting(cli: Cli) -> None:
    res = cli(
        "run",
        "consumer",
        "--call",
        "t.x=json:dumps",
        "--metrics-port",
        "70000",
        env={"RSCHED_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"},
    )
    assert res.returncode == 2 and "--metrics-port" in res.stderr


def test_log_format_json_is_one_object_a_line(cli: Cli) -> None:
    import json

    cli("add", "t.x", "1", check=0)
    res = cli(
        "-v",
        "run",
        "consumer",
        "--call",
        "t.x=json:dumps",
        "--burst",
        "--log-format",
        "json",
        check=0,
    )
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) >= 2
    for ln in lines:
        obj = json.loads(ln)
        assert set(obj) == {"time", "level", "message"} and obj["time"].endswith("Z")
    assert any("stopped" in json.loads(ln)["message"] for ln in lines)
