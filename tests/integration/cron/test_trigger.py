"""`rsched trigger NAME [--wait] [--timeout DUR]` (issue 13, "Act"): a run asked for
now, claimed once by one of the cron's live runners (several processes), with
every guarantee of a scheduled tick, recorded with cause "manual"."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from rsched.api import Rsched
from rsched.core import errors
from rsched.cron import trigger as trig
from tests.integration.cron.test_cron import history, job, lines, spawn_runner, stop_all
from tests.support import Cli, wait_for

#: Never fires during a test: every run below is a triggered one.
YEARLY = "0 0 1 1 *"


def _live(cli: Cli, name: str, n: int) -> None:
    wait_for(
        lambda: [r for r in cli.json("crons") if r["name"] == name and r["runners"] == n],
        timeout=15,
        what=f"{n} live runners of {name}",
    )


def test_trigger_wait_runs_once_across_three_runners(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    """--concurrency allow: no run lock guards it, only the claim of the request does."""
    log = tmp_path / "fired"
    procs = [
        spawn_runner(cli, tmp_path, "nightly", YEARLY, job(log), "--concurrency", "allow")
        for _ in range(3)
    ]
    _live(cli, "nightly", 3)
    first = cli.json("trigger", "nightly", "--wait")
    assert first["result"] == "ok" and first["exit_code"] == 0 and first["timed_out"] is False
    second = cli.json("trigger", "nightly", "--wait")
    assert second["token"] != first["token"]
    # Each run's record is written after its job: a duplicate run would be in the log too.
    ran = lines(log)
    assert len(ran) == 2, ran
    assert sorted(int(r[1]) for r in ran) == sorted([first["token"], second["token"]])
    recs = [r for r in history(cli, "nightly") if r["result"] == "ok"]
    assert len(recs) == 2
    host = socket.gethostname()
    for r in recs:
        assert r["cause"] == "manual" and r["triggered_by"] == host, r
    assert {r["token"] for r in recs} == {first["token"], second["token"]}
    assert rs.redis.zcard(rs.keys.cron("nightly").triggers) == 0
    assert stop_all(procs) == [0, 0, 0]


def test_trigger_without_wait_exits_0_once_taken_and_the_api_waits(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    log = tmp_path / "fired"
    procs = [spawn_runner(cli, tmp_path, "rep", YEARLY, job(log, "exit 7")) for _ in range(2)]
    _live(cli, "rep", 2)
    res = cli("trigger", "rep", check=0)
    assert "taken by" in res.stderr
    wait_for(lambda: lines(log), timeout=10, what="the triggered run")
    # --wait: the job's own exit status.
    assert cli("trigger", "rep", "--wait", check=7).returncode == 7
    got: dict[str, Any] = rs.trigger("rep", wait=True, timeout_ms=20_000)
    assert got["name"] == "rep" and got["result"] == "failed" and got["exit_code"] == 7
    assert isinstance(got["token"], int)
    wait_for(lambda: len(lines(log)) == 3, timeout=10, what="3 runs")
    assert stop_all(procs) == [0, 0]


def test_trigger_refusals_and_exit_codes(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    # Bad input: exit 2, nothing written.
    assert "NAME" in cli("trigger", "bad name", check=2).stderr
    assert "--wait" in cli("trigger", "x", "--timeout", "5s", check=2).stderr
    assert "--timeout" in cli("trigger", "x", "--wait", "--timeout", "soon", check=2).stderr
    assert list(rs.redis.scan_iter(f"{rs.keys.ns}:*")) == []
    # Unknown: 3.
    assert 'no cron "ghost"' in cli("trigger", "ghost", check=3).stderr
    log = tmp_path / "fired"
    p = spawn_runner(cli, tmp_path, "slow", YEARLY, job(log, "sleep 30"))
    _live(cli, "slow", 1)
    # --timeout ran out: 1 (the run goes on).
    res = cli("trigger", "slow", "--wait", "--timeout", "1s", check=1)
    assert "still running" in res.stderr
    # forbid while that run holds the run lock: refused, 4, recorded skipped.
    res = cli("trigger", "slow", check=4)
    assert "previous run still active" in res.stderr
    skipped = [r for r in history(cli, "slow") if r["result"] == "skipped"]
    assert len(skipped) == 1 and skipped[0]["cause"] == "manual"
    # Paused: 4, nothing queued.
    cli("pause", "slow", check=0)
    assert "paused" in cli("trigger", "slow", check=4).stderr
    cli("resume", "slow", check=0)
    assert stop_all([p]) == [0]
    # No runner alive any more: 3.
    assert "no live runner" in cli("trigger", "slow", check=3).stderr
    assert rs.redis.zcard(rs.keys.cron("slow").triggers) == 0
    assert len(lines(log)) == 1


def test_a_request_no_runner_takes_is_withdrawn_and_reported(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    """Registered live but stopped (SIGSTOP): the asker withdraws its request at the bound,
    so it never fires later."""
    log = tmp_path / "fired"
    p = spawn_runner(cli, tmp_path, "frozen", YEARLY, job(log))
    _live(cli, "frozen", 1)
    os.killpg(p.pid, signal.SIGSTOP)
    with pytest.raises(errors.NotFound, match="no runner took the run"):
        trig.trigger(rs, "frozen", take_ms=1000)
    assert rs.redis.zcard(rs.keys.cron("frozen").triggers) == 0
    os.killpg(p.pid, signal.SIGCONT)
    # The thawed runner heartbeats and looks at the requests: a real trigger still works,
    # and the withdrawn one never ran.
    got = trig.trigger(rs, "frozen", wait=True, timeout_ms=20_000)
    assert got["result"] == "ok"
    assert len(lines(log)) == 1
    assert stop_all([p]) == [0]


def test_trigger_under_replace_stops_the_running_job_and_takes_its_place(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    flag, log = tmp_path / "flag", tmp_path / "fired"
    cmd = job(log, f"test -e {flag} || exec sleep 30")
    p = spawn_runner(cli, tmp_path, "swap", YEARLY, cmd, "--concurrency", "replace")
    _live(cli, "swap", 1)
    first = cli.json("trigger", "swap")
    assert first["status"] == "run"
    wait_for(lambda: lines(log), timeout=10, what="the first run")
    flag.touch()
    second = cli.json("trigger", "swap", "--wait", "--timeout", "30s")
    assert second["status"] == "replace" and second["result"] == "ok", second
    recs = {r["token"]: r for r in history(cli, "swap")}
    assert recs[first["token"]]["result"] == "failed"  # stopped to make room
    assert recs[second["token"]]["cause"] == "manual"
    assert second["token"] > first["token"]
    assert stop_all([p]) == [0]


def test_wait_reports_a_run_whose_runner_died_as_lost(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    log = tmp_path / "fired"
    p = spawn_runner(cli, tmp_path, "doomed", YEARLY, job(log, "exec sleep 30"), "--ttl", "1s")
    _live(cli, "doomed", 1)
    waiter = cli.spawn("trigger", "doomed", "--wait", "--json", stdout=subprocess.PIPE)
    wait_for(lambda: lines(log), timeout=10, what="the run to start")
    os.killpg(p.pid, signal.SIGKILL)  # the runner and its job: no record is ever written
    out, _ = waiter.communicate(timeout=30)
    assert waiter.returncode == 1
    got = json.loads(out)
    assert got["result"] == "lost" and "runner died" in got["error"], got


def test_run_cron_once_runs_it_here_when_no_runner_is_alive(cli: Cli, tmp_path: Path) -> None:
    """`trigger` with no runner alive exits 3 and says how to run it here: `run cron
    NAME --once`, which runs it once now with a tick's guarantees and exits with the
    job's status."""
    out = tmp_path / "ran"
    res = cli("trigger", "once.job", check=3)
    assert "--once" in res.stderr
    res = cli(
        "run", "cron", "once.job", "--schedule", "0 0 1 1 *", "--once", "--",
        "sh", "-c", f'echo "$RSCHED_FENCING_TOKEN" >> {out}; exit 5',
        check=5, timeout=60,
    )  # fmt: skip
    assert lines(out) == [["1"]]
    rec = [r for r in cli.json("history", "once.job") if r["name"] == "once.job"]
    assert [(r["cause"], r["result"], r["exit_code"], r["token"]) for r in rec] == [
        ("manual", "failed", 5, 1)
    ]
    cli("run", "cron", "once.job", "--schedule", "0 0 1 1 *", "--once", "--", "true", check=0)
    assert [r["token"] for r in cli.json("history", "once.job")] == [2, 1]  # newest first
    res = cli("run", "cron", "--all", "--once", check=2)
    assert "--once" in res.stderr and len(res.stderr.splitlines()) == 1
