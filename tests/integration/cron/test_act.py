"""The operator's actions on crons (issue 13, "Act"): `pause` / `resume` of a name
rsched has never seen, `forget` of a retired cron."""

from __future__ import annotations

import json
from pathlib import Path

from rsched.api import Rsched
from rsched.tools import history
from tests.integration.cron.test_cron import EVERY_SECOND, job, lines, spawn_runner, stop_all
from tests.integration.tools.test_history import add
from tests.support import Cli, wait_for


def _ns_keys(rs: Rsched) -> list[str]:
    return sorted(rs.redis.scan_iter(f"{rs.keys.ns}:*"))


# --- pause / resume of an unknown name -----------------------------------------------------
def test_pause_unknown_cron_or_queue_exits_3_and_writes_nothing(cli: Cli, rs: Rsched) -> None:
    for args, what in (
        (["pause", "nope"], 'no cron "nope"'),
        (["resume", "nope"], 'no cron "nope"'),
        (["pause", "--queue", "typo"], 'no queue "typo"'),
        (["resume", "--queue", "typo"], 'no queue "typo"'),
    ):
        res = cli(*args, check=3)
        assert res.stdout == ""
        assert what in res.stderr and "--create" in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
        res = cli(*args, "--json", check=3)
        assert res.stdout == ""
    # no key of the cron or queue: only the audit trail, which records the refusals
    assert _ns_keys(rs) == [rs.keys.audit]
    refused = cli.json("history", "--actions")
    assert len(refused) == 8 and {r["result"] for r in refused} == {"refused"}


def test_pause_create_then_known(cli: Cli, rs: Rsched) -> None:
    got = cli.json("pause", "later", "--create")
    assert got == {"name": "later", "paused": True, "known": False}
    # Paused on purpose: rsched has seen it now, resume needs no --create.
    assert cli.json("resume", "later") == {"name": "later", "paused": False, "was_paused": True}
    assert cli.json("pause", "--queue", "mailq", "--create")["known"] is False
    assert cli.json("resume", "--queue", "mailq")["was_paused"] is True
    # A queue with a task is known; a registered cron is known.
    cli("add", "t.x", "1", "--queue", "real", check=0)
    assert cli.json("pause", "--queue", "real") == {"queue": "real", "paused": True, "known": True}
    rs.redis.sadd(rs.keys.crons, "reg")
    assert json.loads(cli("pause", "reg", "--json", check=0).stdout)["known"] is True


# --- forget -----------------------------------------------------------------------------------
def test_forget_unknown_exits_3(cli: Cli, rs: Rsched) -> None:
    res = cli("forget", "nope", check=3)
    assert res.stdout == "" and 'no cron "nope"' in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert cli("forget", "bad name", check=2).stderr.count("NAME") == 1
    assert _ns_keys(rs) == []


def test_forget_refused_while_a_runner_lives_then_removes_every_key(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    log = tmp_path / "fires"
    p = spawn_runner(cli, tmp_path, "old.job", EVERY_SECOND, job(log))
    wait_for(lambda: len(lines(log)) >= 1, timeout=15, what="a fire")
    k = rs.keys.cron("old.job")
    before = _ns_keys(rs)
    res = cli("forget", "old.job", check=4)
    assert "1 live runner" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert rs.redis.sismember(rs.keys.crons, "old.job")
    # nothing deleted (but what the live runner itself deletes after each run: its run
    # lock, wake-up and live output)
    durable = {x for x in before if not any(t in x for t in (":lock", ":wake", ":live:"))}
    assert durable <= set(_ns_keys(rs))
    assert stop_all([p]) == [0]
    cli("pause", "old.job", check=0)
    got = cli.json("forget", "old.job")
    assert got["name"] == "old.job" and got["forgotten"] is True and got["keys"] >= 4
    assert got["live_runners"] == 0
    left = [x for x in _ns_keys(rs) if "{c:old.job}" in x and ":shards:" not in x]
    # Only the fencing counter stays: tokens only go up, also for a new cron of the name.
    assert left == [k.fence] and not rs.redis.sismember(rs.keys.crons, "old.job")
    assert not rs.redis.exists(k.state, k.history, k.paused, k.ticks)
    assert cli.json("crons") == []
    cli("forget", "old.job", check=3)
    cli("pause", "old.job", check=3)  # never seen again


def test_forget_force_with_a_live_registration(cli: Cli, rs: Rsched) -> None:
    """A runner killed -9 stays registered live for up to 30 s: --force forgets it."""
    k = rs.keys.cron("gone")
    rs.redis.sadd(rs.keys.crons, "gone")
    rs.redis.zadd(k.runners, {"host:1:abc": rs.now_ms() + 30_000})
    rs.redis.hset(k.state, "schedule", "* * * * *")
    cli("forget", "gone", check=4)
    got = cli.json("forget", "gone", "--force")
    assert got == {"name": "gone", "forgotten": True, "keys": 2, "live_runners": 1}
    assert _ns_keys(rs) == []


# --- history ----------------------------------------------------------------------------------
def test_history_cuts_errors_with_an_ellipsis_and_json_has_cause(cli: Cli, rs: Rsched) -> None:
    rs.redis.sadd(rs.keys.crons, "nightly")
    key = rs.keys.cron("nightly").history
    long_line = "E" * 80
    base = dict(kind="cron", name="nightly", fire_ms=1000, result="failed", exit_code=1, token=1)
    add(rs, key, finished_ms=2000, error="first line\n" + long_line + "\n", **base)
    add(rs, key, finished_ms=3000, error="short", **base)
    add(rs, key, finished_ms=4000, error="x" * 60, **base)
    out = cli("history", "nightly", "--format", "plain", check=0).stdout
    assert "\tshort\n" in out
    cut = [w for w in out.split() if w.startswith("…E")]
    assert cut == ["…" + "E" * 58 + "…"], out
    assert "x" * 60 in out and "x" * 60 + "…" not in out  # it fits: not cut
    recs = cli.json("history", "nightly")
    assert [r["error"] for r in recs][2] == "first line\n" + long_line + "\n"  # JSON: as stored
    assert all(r["cause"] is None and r["triggered_by"] is None for r in recs)
    add(rs, key, finished_ms=5000, cause="manual", triggered_by="ops-1", **base)
    assert cli.json("history", "nightly", "--limit", "1")[0]["cause"] == "manual"


def test_short_error_unit() -> None:
    assert history.short_error(None) is None
    assert history.short_error("boom") == "boom"
    assert history.short_error("a\nb\n") == "…b"
    assert history.short_error("z" * 70, 10) == "z" * 9 + "…"
    assert history.short_error("a\n" + "z" * 70, 10) == "…" + "z" * 8 + "…"
