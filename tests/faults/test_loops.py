"""What every run loop does at start: doctor's warnings on stderr, and --metrics-port."""

from __future__ import annotations

import signal
import urllib.request
from pathlib import Path

import pytest

from tests.support import Cli, RedisServer, free_port, wait_for


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


@pytest.mark.parametrize("loop", ["consumer", "cron", "expired"])
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
def test_run_loops_exit_130_on_sigint_and_0_on_sigterm(
    own_server: RedisServer, namespace: str, tmp_path: Path, loop: str, sig: int, code: int
) -> None:
    """The exit-code table says 130 for an interrupt: every run loop stopped by SIGINT
    (Ctrl-C) exits 130 after its clean stop; SIGTERM (systemd's stop) stays 0."""
    c = Cli(own_server, namespace, cwd=str(tmp_path))
    r = own_server.client()
    try:
        if loop == "consumer":
            c("add", "--in", "1h", "t.x", "1", check=0)  # `queues` lists known queues
            p = c.spawn("run", "consumer", "--call", "t.x=json:dumps")
            wait_for(lambda: c.json("queues") and c.json("queues")[0]["consumers"] == 1,
                     timeout=20, what="the consumer to register")  # fmt: skip
        elif loop == "cron":
            p = c.spawn("run", "cron", "sig.c", "--schedule", "@hourly", "--", "true")
            wait_for(lambda: c.json("crons") and c.json("crons")[0]["runners"] == 1,
                     timeout=20, what="the runner to register")  # fmt: skip
        else:
            p = c.spawn("run", "expired", "--pattern", "k:*", "--set-notify", "--", "true")
            wait_for(lambda: any(int(x.get("psub", 0)) for x in r.client_list()),
                     timeout=20, what="the subscriber")  # fmt: skip
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
        assert p.returncode == code, err
    finally:
        c.close()
        r.close()
