"""Issue 13 follow-ups of `rsched trigger` and `--after`: sharded and broadcast crons
triggered (each shard once across the runners, every live runner once) and in chains
(a sharded A starts B once per tick whose shards all ended ok; a sharded B), a lost
run without a run lock (`--concurrency allow`, kill -9), a replace that could not
take the old run's place, and the run.failed event of a triggered run. Several
runner processes each."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

from rsched.api import Rsched
from rsched.cron import trigger as trig
from tests.integration.cron.test_cron import history, job, lines, spawn_runner, stop_all
from tests.integration.cron.test_trigger import YEARLY, _live
from tests.support import Cli, wait_for


def _recs(rs: Rsched, name: str, rid: str) -> list[dict[str, Any]]:
    """The execution records of request ``rid`` (the stream's own JSON: history --json
    leaves the request id out)."""
    out = []
    for _id, fields in rs.redis.xrange(rs.keys.cron(name).history):
        rec = json.loads(fields["j"])
        if rec.get("trigger") == rid:
            out.append(rec)
    return out


def _lost_after_kill(
    cli: Cli, tmp_path: Path, name: str, concurrency: str, before: int = 0
) -> tuple[dict[str, Any], int, Any]:
    """A runner of ``name`` (``--ttl 1s``) whose job sleeps, ``before`` runs triggered
    first, then ``trigger --wait``; kill -9 of the runner and its job once the run
    started: what --wait printed (it must exit 1), the run's token (its log line)."""
    log = tmp_path / "fired"
    cmd = job(log, "exec sleep 30")
    p = spawn_runner(cli, tmp_path, name, YEARLY, cmd, "--concurrency", concurrency, "--ttl", "1s")
    _live(cli, name, 1)
    for i in range(before):
        assert cli.json("trigger", name)["status"] == "run"
        wait_for(lambda n=i + 1: len(lines(log)) == n, timeout=10, what="the earlier run")
    waiter = cli.spawn("trigger", name, "--wait", "--json", stdout=subprocess.PIPE)
    wait_for(lambda: len(lines(log)) == before + 1, timeout=15, what="the run to start")
    token = int(lines(log)[before][1])
    return waiter, token, p


def _kill(waiter: Any, p: Any) -> dict[str, Any]:
    os.killpg(p.pid, signal.SIGKILL)  # kill -9 of the runner and its job: no record ever
    out, _ = waiter.communicate(timeout=30)
    assert waiter.returncode == 1
    got: dict[str, Any] = json.loads(out)
    assert got["result"] == "lost" and "runner died" in got["error"], got
    return got


def test_a_sharded_cron_triggered_runs_each_shard_once_across_three_runners(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    log, flag = tmp_path / "fired", tmp_path / "fail2"
    cmd = job(log, f'test -e {flag} && test "$RSCHED_SHARD_INDEX" = 2 && exit 5; true')
    procs = [spawn_runner(cli, tmp_path, "sh4", YEARLY, cmd, "--shards", "4") for _ in range(3)]
    _live(cli, "sh4", 3)
    got = cli.json("trigger", "sh4", "--wait")
    assert got["result"] == "ok" and got["exit_code"] == 0 and got["missing"] == 0, got
    assert sorted(int(r["item"]) for r in got["runs"]) == [0, 1, 2, 3]
    ran = lines(log)
    assert sorted(int(r[3]) for r in ran) == [0, 1, 2, 3], ran  # each shard once
    assert {r[4] for r in ran} == {"4"} and len({r[0] for r in ran}) == 1  # one fire_at
    assert len({r[2] for r in ran}) >= 2  # split over the runners
    recs = _recs(rs, "sh4", got["id"])
    assert sorted(r["shard"] for r in recs) == [0, 1, 2, 3]
    assert all(r["cause"] == "manual" and r["result"] == "ok" for r in recs), recs
    # --wait exits with the worst status: shard 2 fails with 5.
    flag.touch()
    res = cli("trigger", "sh4", "--wait", "--json", check=5)
    assert "4 runs taken by" in res.stderr
    bad = json.loads(res.stdout)
    assert bad["result"] == "failed" and bad["exit_code"] == 5
    assert sorted(r["result"] for r in bad["runs"]) == ["failed", "ok", "ok", "ok"]
    assert len(lines(log)) == 8
    assert rs.redis.zcard(rs.keys.cron("sh4").triggers) == 0
    assert stop_all(procs) == [0, 0, 0]


def test_a_sharded_trigger_takes_over_the_shards_of_a_runner_that_died(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    log = tmp_path / "fired"
    procs = [
        spawn_runner(cli, tmp_path, "sh3", YEARLY, job(log), "--shards", "3") for _ in range(3)
    ]
    _live(cli, "sh3", 3)
    os.killpg(procs[0].pid, signal.SIGKILL)  # still registered live for up to 30 s
    got = cli.json("trigger", "sh3", "--wait")
    assert got["result"] == "ok" and got["missing"] == 0, got
    assert sorted(int(r[3]) for r in lines(log)) == [0, 1, 2]
    assert stop_all(procs[1:]) == [0, 0]


def test_a_broadcast_cron_triggered_runs_once_on_every_live_runner_it_registered(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    log = tmp_path / "fired"
    procs = [spawn_runner(cli, tmp_path, "bc", YEARLY, job(log), "--broadcast") for _ in range(3)]
    _live(cli, "bc", 3)
    got = cli.json("trigger", "bc", "--wait")
    assert got["result"] == "ok" and len(got["runs"]) == 3 and got["missing"] == 0, got
    ran = lines(log)
    assert len(ran) == 3 and len({r[2] for r in ran}) == 3, ran  # one run per runner
    assert len(_recs(rs, "bc", got["id"])) == 3
    # A runner that died still registered is asked and never answers: reported missing
    # (counted missed), the request withdrawn, never run later.
    os.killpg(procs[0].pid, signal.SIGKILL)
    again = trig.trigger(rs, "bc", wait=True, take_ms=3000)
    assert len(again["runs"]) == 2 and again["missing"] == 1, again
    assert all(r["result"] == "ok" for r in again["runs"])
    assert again["result"] == "missed" and trig.exit_status(again) == 1
    assert rs.redis.zcard(rs.keys.cron("bc").triggers) == 0
    assert len(lines(log)) == 5
    assert stop_all(procs[1:]) == [0, 0]


def test_a_sharded_a_starts_b_once_per_tick_whose_shards_all_ended_ok(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    alog, blog, flag = tmp_path / "a", tmp_path / "b", tmp_path / "fail"
    acmd = job(alog, f'test -e {flag} && test "$RSCHED_SHARD_INDEX" = 1 && exit 3; true')
    procs = [spawn_runner(cli, tmp_path, "A", YEARLY, acmd, "--shards", "3") for _ in range(2)]
    # B is sharded too (2 shards): each of its shards runs once per run of A.
    procs += [
        spawn_runner(cli, tmp_path, "B", YEARLY, job(blog), "--after", "A", "--shards", "2")
        for _ in range(2)
    ]
    _live(cli, "A", 2)
    _live(cli, "B", 2)
    assert {c["name"]: c["after"] for c in cli.json("crons")} == {"A": [], "B": ["A"]}
    table = cli("crons").stdout.splitlines()
    col = table[0].index("AFTER")
    after = {ln.split()[0]: ln[col : col + 5].strip() for ln in table[2:]}  # after the rule
    assert after == {"A": "-", "B": "A"}, table
    first = cli.json("trigger", "A", "--wait")
    assert first["result"] == "ok"
    wait_for(lambda: len(lines(blog)) >= 2, timeout=15, what="B's two shards")
    flag.touch()
    assert cli("trigger", "A", "--wait", check=3).returncode == 3  # one shard of A failed
    res = cli("trigger", "A", "--wait", "--json", check=3)  # shard 1 fails again: no B
    assert json.loads(res.stdout)["result"] == "failed"
    flag.unlink()
    third = cli.json("trigger", "A", "--wait")
    assert third["result"] == "ok"
    wait_for(lambda: len(lines(blog)) >= 4, timeout=15, what="B after the third run of A")
    b = [r for r in history(cli, "B") if r["result"] == "ok"]
    # Once per ok tick of A (2 of 4), each of B's 2 shards once: 4 records, never more.
    assert len(b) == 4, b
    per_token = Counter(r["after_token"] for r in b)
    assert set(per_token.values()) == {2} and len(per_token) == 2, per_token
    assert {r["cause"] for r in b} == {"after A"}
    assert sorted(int(r[3]) for r in lines(blog)) == [0, 0, 1, 1]
    assert stop_all(procs) == [0, 0, 0, 0]


def test_wait_reports_lost_under_allow_when_the_runner_is_killed(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    """No run lock under allow: the run's marker (renewed every TTL/3) tells."""
    waiter, token, p = _lost_after_kill(cli, tmp_path, "free", "allow")
    assert rs.redis.exists(rs.keys.cron("free").run_mark(token))
    assert _kill(waiter, p)["token"] == token


def test_a_marker_is_gone_once_an_allow_run_is_recorded(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    log = tmp_path / "fired"
    p = spawn_runner(cli, tmp_path, "free2", YEARLY, job(log), "--concurrency", "allow")
    _live(cli, "free2", 1)
    got = cli.json("trigger", "free2", "--wait")
    assert got["result"] == "ok"
    k = rs.keys.cron("free2")
    wait_for(lambda: not rs.redis.exists(k.run_mark(got["token"])), timeout=5, what="marker gone")
    assert stop_all([p]) == [0]


def test_replace_that_cannot_take_the_old_runs_place_reports_skipped_with_its_cause(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    log = tmp_path / "fired"
    p = spawn_runner(
        cli, tmp_path, "stuck", YEARLY, job(log), "--concurrency", "replace", "--ttl", "1s"
    )
    _live(cli, "stuck", 1)
    # A holder that never lets go (a runner that ignores the request to stop).
    k = rs.keys.cron("stuck")
    rs.redis.hset(k.run_lock, mapping={"owner": "x", "host": "elsewhere", "pid": 1, "token": 99})
    rs.redis.pexpire(k.run_lock, 120_000)
    res = cli("trigger", "stuck", "--wait", "--json", "--timeout", "60s", check=4)
    got = json.loads(res.stdout)
    assert got["status"] == "replace" and got["result"] == "skipped" and got["timed_out"] is False
    assert "did not stop in time" in got["error"]
    rec = _recs(rs, "stuck", got["id"])
    assert len(rec) == 1 and rec[0]["cause"] == "manual" and rec[0]["result"] == "skipped", rec
    assert not lines(log)
    assert stop_all([p]) == [0]


def test_a_triggered_failing_run_emits_one_run_failed_of_a_manual_run(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    log = tmp_path / "fired"
    p = spawn_runner(cli, tmp_path, "bad", YEARLY, job(log, "exit 6"))
    _live(cli, "bad", 1)
    got = json.loads(cli("trigger", "bad", "--wait", "--json", check=6).stdout)
    assert got["result"] == "failed" and got["exit_code"] == 6
    evs = [e for e in cli.json("events") if e["name"] == "bad"]
    failed = [e for e in evs if e["event"] == "run.failed"]
    assert len(failed) == 1, evs
    assert failed[0]["token"] == got["token"] and failed[0]["exit_code"] == 6
    rec = [r for r in history(cli, "bad") if r["token"] == failed[0]["token"]]
    assert len(rec) == 1 and rec[0]["cause"] == "manual" and rec[0]["result"] == "failed"
    assert stop_all([p]) == [0]


def test_a_sharded_a_that_ran_while_b_was_down_starts_b_once_when_b_is_back(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    alog, blog = tmp_path / "a", tmp_path / "b"
    a = [spawn_runner(cli, tmp_path, "SA", YEARLY, job(alog), "--shards", "3") for _ in range(2)]
    b = spawn_runner(cli, tmp_path, "SB", YEARLY, job(blog), "--after", "SA", tag="b0")
    _live(cli, "SA", 2)
    _live(cli, "SB", 1)
    sb = rs.keys.cron("SB").state
    wait_for(lambda: rs.redis.hget(sb, "after:SA"), timeout=10, what="B's cursor on A")
    assert stop_all([b]) == [0]  # B's cursor on A is set: runs of A from now on count
    got = cli.json("trigger", "SA", "--wait")  # 3 shard records, while no runner of B
    assert got["result"] == "ok"
    bs = [
        spawn_runner(cli, tmp_path, "SB", YEARLY, job(blog), "--after", "SA", tag=f"b{i}")
        for i in (1, 2)
    ]
    wait_for(lambda: lines(blog), timeout=15, what="B caught up on A's tick")
    _live(cli, "SB", 2)
    recs = [r for r in history(cli, "SB") if r["result"] == "ok"]
    assert len(recs) == 1 and recs[0]["after_token"] in {r["token"] for r in got["runs"]}
    assert stop_all([*a, *bs]) == [0, 0, 0, 0]
    assert len(lines(blog)) == 1


def test_wait_reports_lost_for_a_replacing_run_whose_runner_is_killed(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    waiter, token, p = _lost_after_kill(cli, tmp_path, "swap2", "replace", before=1)
    k = rs.keys.cron("swap2")
    wait_for(lambda: rs.redis.hget(k.run_lock, "token") == str(token), timeout=5, what="its lock")
    got = _kill(waiter, p)
    assert got["status"] == "replace"
    assert got["token"] in (token, None)  # known when --wait saw the run lock before the kill
