"""`rsched run cron`: exactly one fire per tick across runner processes,
takeover, lost leases, pause, misfire, sharding, clock skew, Redis outages."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rsched.api import Rsched
from rsched.core import cronexpr
from tests.support import Cli, RedisServer, wait_for

EVERY_SECOND = "*/1 * * * * *"
FAKETIME_LIB = next(
    (
        p
        for p in (
            "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
            "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
            "/usr/lib/faketime/libfaketime.so.1",
        )
        if os.path.exists(p)
    ),
    None,
)


def job(log: Path, extra: str = "") -> list[str]:
    """A job that appends 'FIRE_AT TOKEN RUNNER_PID SHARD SHARD_TOTAL JOB_PID' to ``log``."""
    line = '"$RSCHED_FIRE_AT $RSCHED_FENCING_TOKEN $PPID ${RSCHED_SHARD_INDEX:--} ${RSCHED_SHARD_TOTAL:--} $$"'
    return ["sh", "-c", f"echo {line} >> {log}{'; ' + extra if extra else ''}"]


def lines(log: Path) -> list[list[str]]:
    return [ln.split() for ln in log.read_text().splitlines()] if log.exists() else []


def spawn_runner(
    cli: Cli,
    tmp_path: Path,
    name: str,
    schedule: str,
    cmd: list[str],
    *opts: str,
    env: dict[str, str] | None = None,
    tag: str = "",
) -> subprocess.Popen[str]:
    errlog = tmp_path / f"runner-{name}-{tag or len(cli.procs)}.log"
    fd = os.open(errlog, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        return cli.spawn(
            "-v",
            "run",
            "cron",
            name,
            "--schedule",
            schedule,
            *opts,
            "--",
            *cmd,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=fd,
        )
    finally:
        os.close(fd)


def stop_all(procs: list[subprocess.Popen[str]], timeout: float = 20) -> list[int]:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGCONT)
            p.send_signal(signal.SIGTERM)
    return [p.wait(timeout) for p in procs]


def history(cli: Cli, name: str, limit: int = 1000) -> list[dict[str, Any]]:
    return cli.json("history", name, "--limit", str(limit))


def assert_exactly_once(
    fires: list[str], min_ticks: int, step_ms: int = 1000, hist: list[dict[str, Any]] | None = None
) -> list[int]:
    """Every tick once, none twice, none missed between the first and the last."""
    from rsched.core.timeutil import parse_time

    counts = Counter(fires)
    twice = {f: c for f, c in counts.items() if c > 1}
    assert not twice, f"ticks fired more than once: {twice}"
    ms = sorted(parse_time(f) for f in counts)
    assert len(ms) >= min_ticks, ms
    gaps = [(a, b) for a, b in zip(ms, ms[1:], strict=False) if b - a != step_ms]
    assert not gaps, f"ticks missed between: {gaps}" + (f"; history: {hist}" if hist else "")
    return ms


def kill_pids(pids: list[str]) -> None:
    for p in pids:
        try:
            os.kill(int(p), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


# --- exactly once ------------------------------------------------------------------------
def _three_runners(cli: Cli, tmp_path: Path, ticks: int) -> None:
    log = tmp_path / "fires"
    procs = [spawn_runner(cli, tmp_path, "report.daily", EVERY_SECOND, job(log)) for _ in range(3)]
    wait_for(
        lambda: len(lines(log)) >= ticks + 1,
        timeout=ticks + 20,
        interval=0.1,
        what=f"{ticks} ticks",
    )
    assert stop_all(procs) == [0, 0, 0]
    fired = lines(log)
    ms = assert_exactly_once([f[0] for f in fired], ticks)
    # A job that was running when its runner got SIGTERM is recorded `failed` (stopped).
    recs = [r for r in history(cli, "report.daily") if r["result"] in ("ok", "failed")]
    assert sorted(r["fire_ms"] for r in recs) == ms  # history agrees: each tick once
    tokens = [int(f[1]) for f in fired]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    print(f"{len(ms)} ticks fired by runners {Counter(f[2] for f in fired)}")


@pytest.mark.valkey
def test_three_runners_every_tick_exactly_once(cli: Cli, tmp_path: Path) -> None:
    _three_runners(cli, tmp_path, 8)


@pytest.mark.slow
def test_three_runners_every_tick_exactly_once_soak(cli: Cli, tmp_path: Path) -> None:
    _three_runners(cli, tmp_path, 40)


def test_two_second_ticks_listing_and_history(cli: Cli, tmp_path: Path) -> None:
    log = tmp_path / "fires"
    procs = [
        spawn_runner(cli, tmp_path, "report.daily", "*/2 * * * * *", job(log)) for _ in range(3)
    ]
    wait_for(lambda: len(lines(log)) >= 2, timeout=15, interval=0.1, what="2 ticks")
    rows = wait_for(
        lambda: [r for r in cli.json("crons") if r["runners"] == 3], timeout=10, what="3 runners"
    )
    row = rows[0]
    assert set(row) >= {
        "name",
        "schedule",
        "tz",
        "next_fire_at",
        "last_fire_at",
        "last_result",
        "last_host",
        "runners",
        "paused",
    }
    assert (
        row["name"] == "report.daily" and row["schedule"] == "*/2 * * * * *" and row["tz"] == "UTC"
    )
    assert row["paused"] is False and row["last_host"] and row["next_fire_at"].endswith("Z")
    assert stop_all(procs) == [0, 0, 0]
    assert_exactly_once([f[0] for f in lines(log)], 2, step_ms=2000)
    h = history(cli, "report.daily")
    assert h and all(r["kind"] == "cron" and r["result"] in ("ok", "failed") for r in h)
    assert all(r["result"] == "ok" or "shutting down" in r["error"] for r in h)
    assert all(r["fire_at"].endswith(":00.000Z") or int(r["fire_at"][17:19]) % 2 == 0 for r in h)
    table = cli("crons", check=0).stdout
    assert "report.daily" in table
    assert cli.json("crons")[0]["runners"] == 0  # unregistered on SIGTERM


# --- input --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args",
    [
        ["x", "--schedule", "0 0 31 2 *", "--", "true"],
        ["x", "--schedule", "@reboot", "--", "true"],
        ["x", "--schedule", "* * *", "--", "true"],
        ["x", "--schedule", "* * * * *", "--tz", "Nowhere/City", "--", "true"],
        ["bad name", "--schedule", "* * * * *", "--", "true"],
        ["x", "--schedule", "* * * * *"],
        ["x", "--schedule", "* * * * *", "--shards", "0", "--", "true"],
        ["x", "--schedule", "* * * * *", "--ttl", "1x", "--", "true"],
    ],
)
def test_bad_input_refused_nothing_written(cli: Cli, rs: Rsched, args: list[str]) -> None:
    r = cli("run", "cron", *args, timeout=20)
    assert r.returncode == 2, r.stderr
    assert "rsched: error:" in r.stderr
    assert list(rs.redis.scan_iter(match=f"{rs.namespace}:*")) == []


def test_never_firing_names_the_field(cli: Cli) -> None:
    r = cli("run", "cron", "x", "--schedule", "0 0 31 2 *", "--", "true")
    assert r.returncode == 2 and "--schedule" in r.stderr and "never fires" in r.stderr


# --- pause ------------------------------------------------------------------------------------
def test_paused_cron_fires_nothing_and_records_skipped(cli: Cli, tmp_path: Path) -> None:
    log = tmp_path / "fires"
    cli("pause", "nightly", "--create", check=0)
    p = spawn_runner(cli, tmp_path, "nightly", EVERY_SECOND, job(log))

    def skipped() -> list[dict[str, Any]]:
        got = [r for r in history(cli, "nightly") if r["result"] == "skipped"]
        return got if len(got) >= 3 else []

    recs = wait_for(skipped, timeout=15, what="3 skipped ticks")
    assert all(r.get("error") == "paused" for r in recs)
    assert not log.exists()
    assert cli.json("crons")[0]["paused"] is True
    cli("resume", "nightly", check=0)
    wait_for(lambda: lines(log), timeout=10, what="fires after resume")
    # Stop only once a run has finished: SIGTERM may otherwise stop the job mid-run.
    wait_for(
        lambda: [r for r in history(cli, "nightly") if r["result"] == "ok"],
        timeout=10,
        what="an ok run",
    )
    assert stop_all([p]) == [0]


def test_pause_queue_passes_through(cli: Cli, rs: Rsched) -> None:
    cli("pause", "--queue", "emails", "--create", check=0)
    assert rs.redis.exists(rs.keys.queue("emails").paused)
    cli("resume", "--queue", "emails", check=0)
    assert not rs.redis.exists(rs.keys.queue("emails").paused)
    assert cli("pause").returncode == 2


# --- takeover and lost leases -------------------------------------------------------------
def test_kill9_holder_taken_over_within_ttl_plus_1s(cli: Cli, tmp_path: Path) -> None:
    log = tmp_path / "fires"
    cmd = job(log, "exec sleep 60")
    procs = [
        spawn_runner(cli, tmp_path, "long", EVERY_SECOND, cmd, "--ttl", "2s") for _ in range(2)
    ]
    try:
        first = wait_for(lambda: lines(log), timeout=15, what="first run")[0]
        holder = next(p for p in procs if str(p.pid) == first[2])
        # Ticks while it runs are skipped (forbid).
        wait_for(lambda: [r for r in history(cli, "long") if r["result"] == "skipped"], timeout=10)
        t0 = time.monotonic()
        os.kill(holder.pid, signal.SIGKILL)
        second = wait_for(lambda: lines(log)[1:], timeout=8, interval=0.02, what="takeover")[0]
        took = time.monotonic() - t0
        print(f"cron takeover after kill -9 of the holder: {took:.2f}s (ttl 2s)")
        assert took <= 2 + 1
        assert int(second[1]) > int(first[1])  # fencing token
        assert second[2] != first[2]
    finally:
        stop_all([p for p in procs if p.poll() is None])
        kill_pids([f[5] for f in lines(log)])


def test_sigstopped_runner_learns_it_lost_the_lock(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    log = tmp_path / "fires"
    # The yearly tick of Jan 1st is in the past; pretend the one before was handled, so that
    # --misfire run-once fires it now, late, once: a long job to freeze the runner under.
    yearly = cronexpr.parse("0 0 1 1 *")
    latest = yearly.prev_at_or_before(rs.now_ms())
    rs.redis.hset(rs.keys.cron("frozen").state, "last_tick", yearly.prev_at_or_before(latest - 1))
    p = spawn_runner(
        cli,
        tmp_path,
        "frozen",
        "0 0 1 1 *",
        job(log, "exec sleep 60"),
        "--ttl",
        "1s",
        "--misfire",
        "run-once",
    )
    try:
        run = wait_for(lambda: lines(log), timeout=15, what="the late run")[0]
        child = int(run[5])
        lock = rs.keys.cron("frozen").run_lock
        os.killpg(p.pid, signal.SIGSTOP)  # the runner only; the job runs in its own group
        wait_for(lambda: not rs.redis.exists(lock), timeout=5, what="lease to expire")
        os.killpg(p.pid, signal.SIGCONT)

        def gone() -> bool:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                return True
            with open(f"/proc/{child}/stat") as fh:
                return fh.read().split()[2] == "Z"

        wait_for(gone, timeout=10, what="the job to be stopped")
        rec = wait_for(
            lambda: [r for r in history(cli, "frozen") if r["result"] == "lost"], timeout=10
        )[0]
        assert "lock lost" in rec["error"]
        assert stop_all([p]) == [0]
    finally:
        kill_pids([f[5] for f in lines(log)])


def test_replace_stops_the_running_job(cli: Cli, tmp_path: Path) -> None:
    log = tmp_path / "fires"
    cmd = job(log, "exec sleep 60")
    procs = [
        spawn_runner(
            cli, tmp_path, "rep", "*/2 * * * * *", cmd, "--concurrency", "replace", "--ttl", "3s"
        )
        for _ in range(2)
    ]
    try:
        wait_for(lambda: len(lines(log)) >= 3, timeout=20, what="3 runs")
        rec = wait_for(
            lambda: [r for r in history(cli, "rep") if "replaced" in (r.get("error") or "")],
            timeout=10,
            what="a replaced run",
        )[0]
        assert rec["result"] == "failed"
        fired = lines(log)
        assert_exactly_once([f[0] for f in fired], 3, step_ms=2000)
        tokens = [int(f[1]) for f in fired]
        assert tokens == sorted(tokens)
        # At most one job alive at a time (the replaced one was stopped first).
        alive = []
        for f in fired:
            try:
                os.kill(int(f[5]), 0)
                alive.append(f)
            except ProcessLookupError:
                pass
        assert len(alive) <= 2  # the newest, plus possibly a zombie not yet reaped
    finally:
        stop_all(procs)
        kill_pids([f[5] for f in lines(log)])


def test_replace_is_prompt_and_never_overlaps(cli: Cli, tmp_path: Path) -> None:
    """Default --ttl 30s: the holder hears the stop request at once (its watchdog blocks
    on the cron's wake key), not at its next renewal TTL/3 = 10 s later; the new run
    starts only after the old one ended, with a greater fencing token."""
    log = tmp_path / "fires"
    procs = [
        spawn_runner(
            cli,
            tmp_path,
            "prompt",
            "*/2 * * * * *",
            job(log, "exec sleep 60"),
            "--concurrency",
            "replace",
        )
        for _ in range(2)
    ]
    try:
        wait_for(lambda: len(lines(log)) >= 4, timeout=25, what="4 runs")
        assert stop_all(procs) == [0, 0]
    finally:
        kill_pids([f[5] for f in lines(log)])
    runs = sorted(
        (r for r in history(cli, "prompt") if r["result"] != "skipped"), key=lambda r: r["fire_ms"]
    )
    replaced = [r for r in runs if "replaced by a newer tick" in (r.get("error") or "")]
    assert len(replaced) >= 3, runs
    late = [r["started_ms"] - r["fire_ms"] for r in runs]
    print(f"replace: new run started {late} ms after its tick (ttl 30s)")
    assert all(d < 1000 for d in late), late
    for old, new in zip(runs, runs[1:], strict=False):
        assert new["token"] > old["token"]
        assert new["started_ms"] >= old["finished_ms"], (old, new)  # no overlap
    assert_exactly_once([f[0] for f in lines(log)], 4, step_ms=2000)


def test_replace_superseded_ticks_are_recorded(cli: Cli, tmp_path: Path) -> None:
    """A job that ignores SIGTERM takes the 2.5 s grace to stop; ticks arriving meanwhile
    supersede each other: each gets exactly one record (`skipped`, superseded)."""
    log = tmp_path / "fires"
    stubborn = tmp_path / "stubborn.sh"
    stubborn.write_text(
        f"#!/bin/sh\ntrap '' TERM\necho \"$RSCHED_FIRE_AT $$\" >> {log}\nsleep 60\n"
    )
    stubborn.chmod(0o755)
    (tmp_path / "rsched.toml").write_text(
        f"[cron.stub]\nschedule = '{EVERY_SECOND}'\ncommand = '{stubborn}'\n"
        "concurrency = 'replace'\ngrace = '2500ms'\n"
    )
    errlog = open(tmp_path / "runner-stub.log", "w")  # noqa: SIM115
    p = cli.spawn("-v", "run", "cron", "--all", stdout=subprocess.DEVNULL, stderr=errlog)
    try:
        wait_for(lambda: len(lines(log)) >= 3, timeout=30, what="3 runs")
        assert stop_all([p]) == [0]
    finally:
        errlog.close()
        kill_pids([f[1] for f in lines(log)])
    h = history(cli, "stub")
    per_tick = Counter(r["fire_ms"] for r in h)
    assert all(c == 1 for c in per_tick.values()), per_tick
    ticks = sorted(per_tick)
    assert ticks == list(range(ticks[0], ticks[-1] + 1000, 1000)), ticks  # none without a record
    sup = [r for r in h if r["result"] == "skipped" and "superseded" in (r.get("error") or "")]
    assert len(sup) >= 2, h
    runs = sorted((r for r in h if r.get("token")), key=lambda r: r["fire_ms"])
    for old, new in zip(runs, runs[1:], strict=False):
        assert new["token"] > old["token"] and new["started_ms"] >= old["finished_ms"]


# --- misfire -----------------------------------------------------------------------------------
def _run_then_pause_runners(cli: Cli, rs: Rsched, tmp_path: Path, name: str) -> int:
    log = tmp_path / f"{name}-first"
    p = spawn_runner(cli, tmp_path, name, EVERY_SECOND, job(log))
    wait_for(lambda: lines(log), timeout=10, what="a first fire")
    assert stop_all([p]) == [0]
    last = int(rs.redis.hget(rs.keys.cron(name).state, "last_tick"))
    wait_for(lambda: rs.now_ms() >= last + 3500, timeout=10, what="three ticks without runners")
    return last


def test_misfire_skip_records_missed(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    last = _run_then_pause_runners(cli, rs, tmp_path, "mf")
    log = tmp_path / "fires"
    p = spawn_runner(cli, tmp_path, "mf", EVERY_SECOND, job(log), "--starting-deadline", "500ms")
    wait_for(lambda: lines(log), timeout=10, what="fires again")
    assert stop_all([p]) == [0]
    missed = sorted(r["fire_ms"] for r in history(cli, "mf") if r["result"] == "missed")
    assert missed[:3] == [last + 1000, last + 2000, last + 3000]
    from rsched.core.timeutil import parse_time

    assert min(parse_time(f[0]) for f in lines(log)) > missed[-1]


def test_ticks_while_paused_are_skipped_not_missed(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    """No runner while paused: a runner that catches up records those ticks `skipped`
    (paused), whether the cron is still paused or was resumed before it started."""
    last = _run_then_pause_runners(cli, rs, tmp_path, "pz")
    cli("pause", "pz", check=0)
    p = spawn_runner(cli, tmp_path, "pz", EVERY_SECOND, ["true"], "--starting-deadline", "500ms")
    backlog = [last + 1000, last + 2000, last + 3000]
    wait_for(
        lambda: {r["fire_ms"] for r in history(cli, "pz")} >= set(backlog),
        timeout=10,
        what="the backlog recorded",
    )
    assert stop_all([p]) == [0]
    by_fire = {r["fire_ms"]: r for r in history(cli, "pz")}
    assert [(by_fire[f]["result"], by_fire[f].get("error")) for f in backlog] == [
        ("skipped", "paused")
    ] * 3
    assert not [r for r in by_fire.values() if r["result"] == "missed"]
    # Paused while no runner ran, resumed, then a runner catches up: the ticks inside the
    # pause are skipped (paused); those after the resume, missed.
    last = int(rs.redis.hget(rs.keys.cron("pz").state, "last_tick"))
    wait_for(lambda: rs.now_ms() >= last + 2500, timeout=10)
    cli("resume", "pz", check=0)
    # When the resume took effect, by the server's clock (a now_ms() read after the
    # command exits is later, and a tick in between would count as "during").
    resumed = int(rs.redis.hget(rs.keys.cron("pz").state, "pause_to_ms"))
    wait_for(lambda: rs.now_ms() >= resumed + 2000, timeout=10)
    log = tmp_path / "pz-fires"
    spawned = rs.now_ms()
    p = spawn_runner(
        cli, tmp_path, "pz", EVERY_SECOND, job(log), "--starting-deadline", "500ms", tag="2"
    )
    wait_for(lambda: lines(log), timeout=10, what="fires again")
    assert stop_all([p]) == [0]
    h = [r for r in history(cli, "pz") if last < r["fire_ms"] < spawned - 500]
    during = [r for r in h if r["fire_ms"] < resumed]
    after = [r for r in h if r["fire_ms"] > resumed]
    assert len(during) >= 2 and all(r["error"] == "paused" for r in during), during
    assert after and all(r["result"] == "missed" for r in after), after


def test_clean_exit_leaves_the_runners_registry(cli: Cli, tmp_path: Path) -> None:
    procs = [spawn_runner(cli, tmp_path, "reg", "0 0 1 1 *", ["true"]) for _ in range(2)]
    wait_for(lambda: cli.json("crons")[0]["runners"] == 2, timeout=15, what="2 runners")
    assert stop_all(procs) == [0, 0]
    assert cli.json("crons")[0]["runners"] == 0


def _yearly_backlog(rs: Rsched, name: str, missed_years: int) -> list[int]:
    """Pretend the last tick handled was ``missed_years`` yearly ticks ago (no runner since)."""
    yearly = cronexpr.parse("0 0 1 1 *")
    ticks = [yearly.prev_at_or_before(rs.now_ms())]
    for _ in range(missed_years):
        ticks.insert(0, yearly.prev_at_or_before(ticks[0] - 1))
    rs.redis.hset(rs.keys.cron(name).state, "last_tick", ticks[0])
    return ticks[1:]


def test_misfire_run_once_fires_latest_late(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    backlog = _yearly_backlog(rs, "mf1", 3)
    log = tmp_path / "fires"
    p = spawn_runner(cli, tmp_path, "mf1", "0 0 1 1 *", job(log), "--misfire", "run-once")
    wait_for(lambda: lines(log), timeout=10, what="the late fire")
    wait_for(lambda: [r for r in history(cli, "mf1") if r["result"] == "ok"], timeout=10)
    assert stop_all([p]) == [0]
    h = history(cli, "mf1")
    assert sorted(r["fire_ms"] for r in h if r["result"] == "missed") == backlog[:-1]
    ran = [r for r in h if r["result"] == "ok"]
    assert [r["fire_ms"] for r in ran] == [backlog[-1]] and len(lines(log)) == 1
    assert ran[0]["started_ms"] - ran[0]["fire_ms"] > 86_400_000  # fired once, late


def test_misfire_run_once_respects_starting_deadline(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    backlog = _yearly_backlog(rs, "mf2", 2)
    log = tmp_path / "fires"
    p = spawn_runner(
        cli,
        tmp_path,
        "mf2",
        "0 0 1 1 *",
        job(log),
        "--misfire",
        "run-once",
        "--starting-deadline",
        "1h",
    )

    def missed() -> list[int]:
        got = sorted(r["fire_ms"] for r in history(cli, "mf2") if r["result"] == "missed")
        return got if len(got) >= 2 else []

    assert wait_for(missed, timeout=10) == backlog
    assert stop_all([p]) == [0]
    assert not log.exists()


# --- sharding and broadcast ----------------------------------------------------------------------
def test_shards_split_and_taken_over(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    log = tmp_path / "fires"
    procs = [
        spawn_runner(cli, tmp_path, "sh4", "*/2 * * * * *", job(log), "--shards", "4")
        for _ in range(3)
    ]
    try:
        wait_for(lambda: len({f[0] for f in lines(log)}) >= 3, timeout=20, what="3 sharded ticks")
        # One runner dies (kill -9) between ticks, while still registered as live: its items
        # of the next ticks are taken over by the others. (Killed in the millisecond between
        # claiming an item and starting it, that item would be lost: at most once.)
        from rsched.core.timeutil import parse_time

        last = max(parse_time(f[0]) for f in lines(log))
        wait_for(lambda: rs.now_ms() >= last + 1200, timeout=5, what="mid-interval")
        os.kill(procs[0].pid, signal.SIGKILL)
        t_kill = time.time()
        wait_for(lambda: len({f[0] for f in lines(log)}) >= 6, timeout=20, what="3 more ticks")
    finally:
        stop_all([p for p in procs if p.poll() is None])
    by_tick: dict[str, list[str]] = {}
    for f in lines(log):
        assert f[4] == "4"
        by_tick.setdefault(f[0], []).append(f[3])
    from rsched.core.timeutil import parse_time

    complete = [t for t in sorted(by_tick)][1:-1]  # first/last ticks may straddle start/stop
    for t in complete:
        assert sorted(by_tick[t]) == ["0", "1", "2", "3"], (t, by_tick[t])
    after = [t for t in complete if parse_time(t) / 1000 > t_kill + 0.5]
    assert after, by_tick
    assert all(len(by_tick[t]) == len(set(by_tick[t])) for t in by_tick)


def test_broadcast_every_runner_every_tick(cli: Cli, tmp_path: Path) -> None:
    log = tmp_path / "fires"
    procs = [
        spawn_runner(cli, tmp_path, "bc", EVERY_SECOND, job(log), "--broadcast") for _ in range(2)
    ]
    wait_for(
        lambda: sum(1 for c in Counter(f[0] for f in lines(log)).values() if c == 2) >= 3,
        timeout=20,
        what="3 ticks run by both runners",
    )
    stop_all(procs)
    for tick, runners in Counter((f[0], f[2]) for f in lines(log)).items():
        assert runners == 1, tick  # each runner runs each tick once


# --- clocks ---------------------------------------------------------------------------------------
@pytest.mark.skipif(FAKETIME_LIB is None, reason="faketime (libfaketime) is not installed")
@pytest.mark.parametrize("skew", ["+30s", "-30s"])
def test_clock_skew_no_early_fire_no_missed_tick(cli: Cli, tmp_path: Path, skew: str) -> None:
    log = tmp_path / "fires"
    # Monotonic stays real: libfaketime breaks timed waits on a faked monotonic clock.
    env = {
        "LD_PRELOAD": str(FAKETIME_LIB),
        "FAKETIME": skew,
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
    skewed = spawn_runner(cli, tmp_path, "skew", EVERY_SECOND, job(log), env=env, tag="skewed")
    wait_for(
        lambda: len(lines(log)) >= 4,
        timeout=20,
        interval=0.1,
        what="4 ticks from the skewed runner",
    )
    normal = spawn_runner(cli, tmp_path, "skew", EVERY_SECOND, job(log), tag="normal")
    n = len(lines(log))
    wait_for(
        lambda: len(lines(log)) >= n + 4, timeout=20, interval=0.1, what="4 more ticks, 2 runners"
    )
    assert stop_all([skewed, normal]) == [0, 0]
    assert_exactly_once(
        [f[0] for f in lines(log)],
        8,
        hist=[
            {k: r[k] for k in ("fire_at", "result", "error", "started_ms", "duration_ms")}
            for r in history(cli, "skew")
        ],
    )
    h = [
        r for r in history(cli, "skew") if r["result"] in ("ok", "failed")
    ]  # failed: stopped at the end
    assert len(h) == len(lines(log))
    for r in h:  # by the server's clock: never early, and on time (guarantee 3's 5 s grace:
        # a loaded 2-core CI machine can start a job a second late; the skew is 30 s)
        assert 0 <= r["started_ms"] - r["fire_ms"] < 5000, r


# --- outages and signals --------------------------------------------------------------------------
def test_survives_redis_restart_and_freeze(
    own_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    cli = Cli(own_server, namespace, cwd=str(tmp_path))
    log = tmp_path / "fires"
    try:
        procs = [spawn_runner(cli, tmp_path, "sturdy", EVERY_SECOND, job(log)) for _ in range(2)]
        wait_for(lambda: len(lines(log)) >= 2, timeout=15, what="fires")
        own_server.restart()  # kill -9 and start again (AOF keeps the data)
        n = len(lines(log))
        wait_for(lambda: len(lines(log)) >= n + 2, timeout=20, what="fires after the restart")
        own_server.freeze()
        time.sleep(1.5)  # the outage under test
        own_server.thaw()
        n = len(lines(log))
        wait_for(lambda: len(lines(log)) >= n + 2, timeout=20, what="fires after the freeze")
        assert all(p.poll() is None for p in procs)  # never exits because Redis blinked
        assert stop_all(procs) == [0, 0]
        c = Counter(f[0] for f in lines(log))
        assert max(c.values()) == 1, c
    finally:
        cli.close()


def test_sigterm_stops_job_gracefully(cli: Cli, tmp_path: Path) -> None:
    log = tmp_path / "fires"
    marker = tmp_path / "got-term"
    cmd = job(log, f"trap 'echo term > {marker}; exit 0' TERM; sleep 60 & wait")
    p = spawn_runner(cli, tmp_path, "graceful", EVERY_SECOND, cmd)
    wait_for(lambda: lines(log), timeout=10, what="running")
    p.send_signal(signal.SIGTERM)
    assert p.wait(20) == 0
    assert marker.read_text().strip() == "term"
    rec = wait_for(
        lambda: [r for r in history(cli, "graceful") if "shutting down" in (r.get("error") or "")],
        timeout=5,
    )[0]
    assert rec["result"] == "failed"
    kill_pids([f[5] for f in lines(log)])


def test_failed_job_history_has_stderr_tail(cli: Cli, tmp_path: Path) -> None:
    p = spawn_runner(
        cli, tmp_path, "broken", EVERY_SECOND, ["sh", "-c", "echo 'disk full' >&2; exit 3"]
    )
    recs = wait_for(
        lambda: cli.json("history", "--failed", "--limit", "5"), timeout=10, what="a failure"
    )
    stop_all([p])
    assert (
        recs[0]["result"] == "failed"
        and recs[0]["exit_code"] == 3
        and "disk full" in recs[0]["error"]
    )
    assert all(r["result"] in ("failed", "timeout", "lost") for r in recs)
    assert len(cli.json("history", "broken", "--limit", "1")) == 1


def test_run_all_from_config(cli: Cli, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    (tmp_path / "rsched.toml").write_text(
        "[cron.alpha]\n"
        f"schedule = '{EVERY_SECOND}'\n"
        f"command = {json.dumps(job(a))}\n"
        "[cron.beta]\n"
        "schedule = '*/2 * * * * *'\n"
        "tz = 'Asia/Shanghai'\n"
        f"command = {json.dumps(' '.join(['sh', '-c', repr(job(b)[2])]))}\n"
    )
    fd = os.open(tmp_path / "all.log", os.O_WRONLY | os.O_CREAT, 0o644)
    p = cli.spawn("run", "cron", "--all", stdout=subprocess.DEVNULL, stderr=fd)
    os.close(fd)
    wait_for(lambda: lines(a) and lines(b), timeout=15, what="both crons fire")
    assert stop_all([p]) == [0]
    names = {r["name"]: r for r in cli.json("crons")}
    assert names["beta"]["tz"] == "Asia/Shanghai"
    (tmp_path / "rsched.toml").write_text(
        "[cron.gamma]\nschedule = '0 0 31 2 *'\ncommand = 'true'\n"
    )
    assert cli("run", "cron", "--all").returncode == 78


def test_idle_runner_costs_at_most_one_command_per_second(
    own_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """Counted the strict way: INFO commandstats, which counts each command a script
    runs. A waiting runner sends one cron-heartbeat-1 per 10 s (EVALSHA, TIME, ZADD,
    ZREMRANGEBYSCORE, ZCARD): at most two of them in the 12 s window."""
    cli = Cli(own_server, namespace, cwd=str(tmp_path))
    r = own_server.client()

    def calls() -> dict[str, int]:
        stats = r.info("commandstats")
        return {
            k[len("cmdstat_") :]: int(v["calls"])
            for k, v in stats.items()
            if not k.startswith(("cmdstat_info", "cmdstat_config"))
        }

    try:
        p = spawn_runner(cli, tmp_path, "yearly", "0 0 1 1 *", ["true"])
        # Start-up ends with the HGET of last_tick (then the runner waits for the tick).
        wait_for(lambda: calls().get("hget", 0) >= 1, timeout=10, what="start-up done")
        r.config_resetstat()
        t0 = time.monotonic()
        time.sleep(12)  # the idle period under measurement
        got = calls()
        elapsed = time.monotonic() - t0
        total = sum(got.values())
        print(f"idle runner: {total} commands in {elapsed:.1f}s = {total / elapsed:.2f}/s: {got}")
        assert total / elapsed <= 1.0
        assert 1 <= got.get("evalsha", 0) + got.get("eval", 0) <= 2  # its heartbeats
        assert stop_all([p]) == [0]
    finally:
        cli.close()


def test_allow_overlaps_timeout_and_jitter(cli: Cli, tmp_path: Path) -> None:
    log = tmp_path / "fires"
    p = spawn_runner(
        cli,
        tmp_path,
        "overlap",
        EVERY_SECOND,
        job(log, "exec sleep 5"),
        "--concurrency",
        "allow",
        "--timeout",
        "1500ms",
        "--jitter",
        "400ms",
    )
    try:
        wait_for(
            lambda: len([r for r in history(cli, "overlap") if r["result"] == "timeout"]) >= 3,
            timeout=20,
            what="3 timed-out runs",
        )
        assert stop_all([p]) == [0]
    finally:
        kill_pids([f[5] for f in lines(log)])
    h = history(cli, "overlap")
    assert not [r for r in h if r["result"] == "skipped"]  # allow: runs overlap, none skipped
    runs = [r for r in h if r["result"] == "timeout"]
    assert len({r["token"] for r in runs}) == len(runs)
    delays = [r["started_ms"] - r["fire_ms"] for r in runs]
    assert all(0 <= d < 400 + 300 for d in delays), delays
    assert all(1400 <= r["duration_ms"] < 5000 for r in runs)
    assert_exactly_once([f[0] for f in lines(log)], 3)


def test_runner_warns_about_a_different_schedule(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    rs.redis.hset(
        rs.keys.cron("mixed").state,
        mapping={"schedule": "0 * * * *", "tz": "UTC", "registered_by": "other:1:x"},
    )
    p = spawn_runner(cli, tmp_path, "mixed", "0 0 1 1 *", ["true"], tag="w")
    log = tmp_path / "runner-mixed-w.log"
    wait_for(lambda: "should share its schedule" in log.read_text(), timeout=10, what="the warning")
    assert stop_all([p]) == [0]
    assert cli.json("crons")[0]["schedule"] == "0 0 1 1 *"


def test_systemd_notify_ready_watchdog_stopping(cli: Cli, tmp_path: Path) -> None:
    import socket

    path = f"/tmp/rsched-cron-notify-{os.getpid()}-{tmp_path.name[-12:]}.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(15)
    try:
        p = spawn_runner(
            cli,
            tmp_path,
            "unit",
            "0 0 1 1 *",
            ["true"],
            env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000"},
        )
        seen: list[str] = []
        while "WATCHDOG=1" not in seen:
            seen += s.recv(4096).decode().split("\n")
        assert "READY=1" in seen and seen.index("READY=1") < seen.index("WATCHDOG=1")
        p.send_signal(signal.SIGTERM)
        while "STOPPING=1" not in seen:
            seen += s.recv(4096).decode().split("\n")
        assert p.wait(15) == 0
    finally:
        s.close()
        os.unlink(path)


def test_run_lock_listed_and_unlock_stops_the_job(cli: Cli, tmp_path: Path) -> None:
    log = tmp_path / "fires"
    p = spawn_runner(cli, tmp_path, "held", EVERY_SECOND, job(log, "exec sleep 60"), "--ttl", "5s")
    try:
        first = wait_for(lambda: lines(log), timeout=10, what="running")[0]
        rows = wait_for(lambda: [r for r in cli.json("locks") if r["name"] == "held"], timeout=5)
        assert rows[0]["kind"] == "cron" and rows[0]["token"] == int(first[1])
        assert rows[0]["pid"] == int(first[2]) and rows[0]["fire_at"] == first[0]
        assert cli("unlock", "held", "--token", str(int(first[1]) + 1)).returncode == 4
        cli("unlock", "held", "--token", first[1], check=0)
        rec = wait_for(
            lambda: [r for r in history(cli, "held") if r["result"] == "lost"], timeout=10
        )
        assert rec[0]["token"] == int(first[1]) and "lock lost" in rec[0]["error"]
        assert stop_all([p]) == [0]
    finally:
        kill_pids([f[5] for f in lines(log)])


@pytest.mark.parametrize("outage", ["freeze", "restart"])
@pytest.mark.parametrize("misfire", ["skip", "run-once"])
def test_short_outage_no_backlog_run_and_no_on_time_tick_skipped(
    own_server: RedisServer, namespace: str, tmp_path: Path, outage: str, misfire: str
) -> None:
    """Redis stops for 3 s (SIGSTOP, or kill -9 and an AOF restart) under an
    every-second cron whose job takes 0.3 s. Ticks that fell in the outage are
    recorded `missed` (only the latest could still run, and only on time); the
    runner runs no backlog back to back, so no tick, late or on time, is
    `skipped: previous run still active`; every tick has one record; the ticks
    after the outage run. Today: the backlog was fired back to back, its ticks
    and the on-time ones after it (15 ms late) recorded `skipped`."""
    cli = Cli(own_server, namespace, cwd=str(tmp_path))
    try:
        p = spawn_runner(
            cli, tmp_path, "blip", EVERY_SECOND, ["sleep", "0.3"], "--misfire", misfire
        )
        wait_for(lambda: len(ok_runs(cli)) >= 3, timeout=30, what="runs before the outage")
        if outage == "freeze":
            own_server.freeze()
            time.sleep(3)  # the outage under test
            own_server.thaw()
        else:
            own_server.kill()
            time.sleep(3)  # the outage under test
            own_server.start()
        with own_server.client() as r:
            after = r.time()[0] * 1000
        wait_for(
            lambda: len([r for r in ok_runs(cli) if r["fire_ms"] > after]) >= 4,
            timeout=40,
            what="runs after the outage",
        )
        assert p.poll() is None
        assert stop_all([p]) == [0]
    finally:
        cli.close()
    h = sorted(history(cli, "blip"), key=lambda r: r["fire_ms"])
    fires = [r["fire_ms"] for r in h]
    assert len(fires) == len(set(fires)), "a tick recorded twice"
    assert fires == list(range(fires[0], fires[-1] + 1000, 1000)), "a tick with no record"
    assert not [r for r in h if r["result"] == "skipped"], [
        (r["fire_at"], r.get("error")) for r in h if r["result"] == "skipped"
    ]
    missed = [r for r in h if r["result"] == "missed"]
    assert len(missed) >= 2, h  # the outage really cost ticks
    # After the last missed tick every tick ran (the last one may have been stopped).
    tail = [r["result"] for r in h if r["fire_ms"] > missed[-1]["fire_ms"]]
    assert tail[:-1] and set(tail[:-1]) == {"ok"}, tail
    first_ok = next(r for r in h if r["fire_ms"] > missed[-1]["fire_ms"])
    print(
        f"\nFIGURE cron_short_outage_{outage}_{misfire} "
        + json.dumps(
            {
                "ticks": len(h),
                "missed": len(missed),
                "skipped": 0,
                "first_run_after_late_ms": first_ok["started_ms"] - first_ok["fire_ms"],
            }
        )
    )


def ok_runs(cli: Cli) -> list[dict[str, Any]]:
    return [r for r in history(cli, "blip") if r["result"] == "ok"]
