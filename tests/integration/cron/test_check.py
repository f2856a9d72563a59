"""`rsched check` against real servers and real runners: exit 0 with nothing to
say, 1 with one line per problem; the dead-man's switch with no runner alive."""

from __future__ import annotations

import json
from pathlib import Path

from rsched.api import Rsched
from tests.integration.cron.test_cron import EVERY_SECOND, job, lines, spawn_runner, stop_all
from tests.support import Cli, wait_for


def problems(cli: Cli, *args: str, rc: int = 1) -> list[dict[str, object]]:
    """`rsched check --json ARGS`, asserting its exit status."""
    return json.loads(cli("check", *args, "--json", check=rc).stdout)


def test_all_well_is_exit_0_and_silence(cli: Cli, tmp_path: Path) -> None:
    assert cli("check", check=0).stdout == ""
    assert cli.json("check") == []
    log = tmp_path / "fires"
    p = spawn_runner(cli, tmp_path, "ok.job", EVERY_SECOND, job(log))
    try:
        wait_for(lambda: len(lines(log)) >= 2, timeout=15, what="two fires")
        res = cli("check", "--max-lag", "1m", "--dead", check=0)
        assert res.stdout == ""
    finally:
        assert stop_all([p]) == [0]
    # The runner stopped cleanly: nobody runs the cron now.
    got = problems(cli)
    assert [(g["check"], g["name"]) for g in got] == [("cron.no-runner", "ok.job")]


def test_a_failing_cron_is_reported(cli: Cli, tmp_path: Path) -> None:
    log = tmp_path / "fires"
    p = spawn_runner(cli, tmp_path, "bad.job", EVERY_SECOND, job(log, "exit 3"))
    try:
        wait_for(lambda: len(lines(log)) >= 1, timeout=15, what="a fire")
        wait_for(
            lambda: any(
                g["check"] == "cron.failed" for g in json.loads(cli("check", "--json").stdout)
            ),
            timeout=15,
            what="the failure reported",
        )
        res = cli("check", check=1)
        assert res.stdout.startswith("cron.failed bad.job: the tick of ")
        assert "failed" in res.stdout and len(res.stdout.splitlines()) == 1
    finally:
        stop_all([p])


def test_dead_mans_switch_fires_with_no_runner_alive(cli: Cli, rs: Rsched) -> None:
    """A cron whose runners all died an hour ago (what a runner leaves in Redis:
    its state and registration, no live runner): every minute's tick passed
    unrun, which `check` says with no rsched loop alive."""
    k = rs.keys.cron("nightly")
    hour_ago = rs.now_ms() - 3_600_000
    rs.redis.sadd(rs.keys.crons, "nightly")
    rs.redis.hset(
        k.state, mapping={"schedule": "* * * * *", "tz": "UTC", "registered_ms": hour_ago}
    )
    got = problems(cli)
    checks = {g["check"]: g for g in got}
    assert set(checks) == {"cron.silent", "cron.no-runner"}
    assert "nothing ran it" in checks["cron.silent"]["message"]
    assert checks["cron.silent"]["name"] == "nightly" and checks["cron.silent"]["queue"] is None
    # A paused cron is silent on purpose.
    cli("pause", "nightly", check=0)
    assert cli.json("check") == []


def test_queue_lag_and_dead_only_with_their_flags(cli: Cli, tmp_path: Path) -> None:
    cli("add", "--at", "2020-01-01T00:00:00Z", "t.late", "1", check=0)
    cli("add", "--max-attempts", "1", "t.dies", "1", check=0)
    cli("run", "consumer", "--handler", "t.dies=false", "--handler", "t.late=sleep 0", "--burst",
        "--queue", "default", check=0)  # fmt: skip
    assert cli("check", check=0).stdout == ""  # lag and dead count only with their flags
    got = problems(cli, "--dead")
    assert [(g["check"], g["queue"]) for g in got] == [("queue.dead", "default")]
    assert "1 dead task" in got[0]["message"]
    cli("add", "--at", "2020-01-01T00:00:00Z", "t.wait", "1", check=0)
    got = problems(cli, "--max-lag", "30s")
    assert [(g["check"], g["queue"]) for g in got] == [("queue.lag", "default")]


def test_bad_max_lag_is_refused_before_connecting(cli: Cli) -> None:
    res = cli("--redis-url", "redis://127.0.0.1:1/0", "check", "--max-lag", "soon", check=2)
    assert "--max-lag" in res.stderr and len(res.stderr.strip().splitlines()) == 1
