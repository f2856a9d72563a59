"""`rsched exec`: one host at a time, once per tick, status passed through."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rsched.api import Rsched
from tests.support import Cli, RedisServer, wait_for

PY = sys.executable


def ns_keys(rs: Rsched) -> list[str]:
    return list(rs.redis.scan_iter(match=f"{rs.namespace}:*"))


def test_exit_status_and_environment(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    code = f"import json,os; json.dump({{k: v for k, v in os.environ.items() if k.startswith('RSCHED_')}}, open({str(out)!r}, 'w')); raise SystemExit(7)"
    r = cli("exec", "--lock", "envjob", "--", PY, "-c", code)
    assert r.returncode == 7, r.stderr
    env = json.loads(out.read_text())
    assert env["RSCHED_NAME"] == "envjob"
    assert env["RSCHED_FENCING_TOKEN"] == "1"
    assert env["RSCHED_FIRE_AT"].endswith("Z")
    assert "RSCHED_REDIS_URL" in env  # our own environment is inherited
    assert cli("exec", "--lock", "envjob", "--", "true").returncode == 0
    hist = cli.json("history", "envjob")
    assert [h["result"] for h in hist] == ["ok", "failed"]
    assert hist[1]["exit_code"] == 7 and hist[1]["kind"] == "exec" and hist[1]["token"] == 1
    assert {"fire_at", "started_at", "finished_at", "duration_ms", "host", "attempt"} <= set(
        hist[0]
    )


def test_if_locked_skip_fail_wait(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    holder = cli.spawn("exec", "--lock", "busy", "--", "sleep", "30")
    wait_for(lambda: rs.redis.exists(rs.keys.lock("busy").lock), what="holder has the lock")
    r = cli("exec", "--lock", "busy", "--", "touch", str(marker))
    assert r.returncode == 0 and not marker.exists() and r.stderr == ""
    r = cli("-v", "exec", "--lock", "busy", "--", "touch", str(marker))
    assert r.returncode == 0 and "held by" in r.stderr
    r = cli("exec", "--lock", "busy", "--if-locked", "fail", "--", "touch", str(marker))
    assert r.returncode == 75 and "held by" in r.stderr and not marker.exists()
    r = cli(
        "exec",
        "--lock",
        "busy",
        "--if-locked",
        "wait",
        "--wait-timeout",
        "300ms",
        "--",
        "touch",
        str(marker),
    )
    assert r.returncode == 75 and not marker.exists()
    waiter = cli.spawn("exec", "--lock", "busy", "--if-locked", "wait", "--", "touch", str(marker))
    os.killpg(holder.pid, signal.SIGTERM)  # exec forwards it to its child, releases the lock
    assert holder.wait(10) == 128 + signal.SIGTERM
    assert waiter.wait(10) == 0 and marker.exists()


def test_five_concurrent_once_per_run_once(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    log = tmp_path / "runs"
    job = ["sh", "-c", f'echo "$RSCHED_FIRE_AT $RSCHED_FENCING_TOKEN" >> {log}; sleep 0.3']
    # Yearly: all five share the latest tick (Jan 1st) however long they take to start.
    args = ["exec", "--lock", "backup", "--once-per", "0 0 1 1 *", "--", *job]
    procs = [cli.spawn(*args) for _ in range(5)]
    assert [p.wait(30) for p in procs] == [0] * 5
    lines = log.read_text().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].split()[0].endswith("-01-01T00:00:00.000Z")
    # The seeds' flaw: a host whose cron fires after the job already finished must not run it again.
    for _ in range(3):
        assert cli(*args).returncode == 0
    assert len(log.read_text().splitlines()) == 1


def test_once_per_each_tick_once(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    log = tmp_path / "runs"
    job = ["sh", "-c", f'echo "$RSCHED_FIRE_AT" >> {log}']
    args = ["exec", "--lock", "tick", "--once-per", "1s", "--", *job]
    deadline = time.monotonic() + 3
    attempts = 0
    while time.monotonic() < deadline:
        procs = [cli.spawn(*args) for _ in range(3)]
        assert [p.wait(30) for p in procs] == [0, 0, 0]
        attempts += 3
    lines = log.read_text().splitlines()
    assert len(lines) == len(set(lines)), lines  # never twice for one tick
    assert 2 <= len(lines) < attempts


def test_kill9_holder_is_taken_over_with_higher_token(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    log = tmp_path / "runs"
    job = ["sh", "-c", f'echo "$RSCHED_FENCING_TOKEN $$" >> {log}; exec sleep 30']
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    a = cli.spawn("exec", "--lock", "long", "--ttl", "2s", "--", *job, **quiet)
    wait_for(lambda: log.exists() and log.read_text().strip(), what="first holder running")
    b = cli.spawn(
        "exec", "--lock", "long", "--ttl", "2s", "--if-locked", "wait", "--", *job, **quiet
    )
    try:
        t0 = time.monotonic()
        os.kill(a.pid, signal.SIGKILL)  # only the rsched process; its guardian kills the child
        wait_for(lambda: len(log.read_text().splitlines()) == 2, timeout=6, what="takeover")
        took = time.monotonic() - t0
        print(f"exec takeover after kill -9: {took:.2f}s (ttl 2s)")
        assert took <= 2 + 1
        (t1, _), (t2, _) = (line.split() for line in log.read_text().splitlines())
        assert int(t2) > int(t1)
    finally:
        b.send_signal(signal.SIGTERM)
        b.wait(10)
        for line in log.read_text().splitlines():
            try:
                os.kill(int(line.split()[1]), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_lock_lost_stops_the_child(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    p = cli.spawn("exec", "--lock", "lose", "--ttl", "1s", "--", "sleep", "30")
    wait_for(lambda: rs.redis.exists(rs.keys.lock("lose").lock), what="running")
    cli("unlock", "lose", "--force", check=0)
    assert p.wait(10) == 128 + signal.SIGTERM
    h = cli.json("history", "lose")
    assert h[0]["result"] == "lost" and "lock lost" in h[0]["error"]


def test_lock_lost_continue(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    p = cli.spawn(
        "exec",
        "--lock",
        "lose2",
        "--ttl",
        "1s",
        "--on-lock-lost",
        "continue",
        "--",
        "sh",
        "-c",
        "sleep 1.5; exit 0",
    )
    wait_for(lambda: rs.redis.exists(rs.keys.lock("lose2").lock), what="running")
    cli("unlock", "lose2", "--force", check=0)
    assert p.wait(10) == 0
    assert cli.json("history", "lose2")[0]["result"] == "lost"


def test_timeout_kills_group(cli: Cli) -> None:
    r = cli("exec", "--lock", "slow", "--timeout", "300ms", "--", "sh", "-c", "sleep 20 & sleep 20")
    assert r.returncode == 128 + signal.SIGTERM
    h = cli.json("history", "slow")
    assert h[0]["result"] == "timeout"


@pytest.mark.parametrize(
    "args",
    [
        ["--lock", "bad name", "--", "true"],
        ["--lock", "x", "--once-per", "0 0 31 2 *", "--", "true"],
        ["--lock", "x", "--once-per", "@reboot", "--", "true"],
        ["--lock", "x", "--ttl", "soon", "--", "true"],
        ["--lock", "x", "--if-locked", "maybe", "--", "true"],
        ["--lock", "x"],
    ],
)
def test_bad_input_refused_before_writing(cli: Cli, rs: Rsched, args: list[str]) -> None:
    r = cli("exec", *args)
    assert r.returncode == 2, r.stderr
    assert ns_keys(rs) == []


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


@pytest.mark.skipif(FAKETIME_LIB is None, reason="faketime (libfaketime) is not installed")
def test_three_hosts_with_skewed_clocks_run_once_per_minute(cli: Cli, tmp_path: Path) -> None:
    """`* * * * * rsched exec --lock backup --once-per '* * * * *' -- ./backup.sh` on three
    hosts whose clocks disagree by a minute: the tick comes from the server's clock."""
    log = tmp_path / "runs"
    args = [
        "exec",
        "--lock",
        "backup",
        "--once-per",
        "* * * * *",
        "--",
        "sh",
        "-c",
        f'echo "$RSCHED_FIRE_AT" >> {log}',
    ]
    envs = [
        {},
        *(
            {"LD_PRELOAD": str(FAKETIME_LIB), "FAKETIME": skew, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
            for skew in ("+30s", "-30s")
        ),
    ]
    for _ in range(2):
        procs = [cli.spawn(*args, env=e) for e in envs]
        assert [p.wait(30) for p in procs] == [0, 0, 0]
    fired = log.read_text().splitlines()
    assert len(fired) == len(set(fired)) and 1 <= len(fired) <= 2  # 2 only across a minute boundary
    assert all(f.endswith(":00.000Z") for f in fired)


def test_command_that_cannot_start(cli: Cli) -> None:
    r = cli("exec", "--lock", "nope", "--", "/nonexistent/program")
    assert r.returncode == 127 and "cannot start" in r.stderr
    assert cli.json("history", "nope")[0]["result"] == "failed"
    r = cli("-q", "exec", "--lock", "nope", "--", "/nonexistent/program")
    assert r.returncode == 127 and "cannot start" in r.stderr  # an error: -q keeps it


def test_sigint_exits_130_and_stops_the_child(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    """Ctrl-C on `exec`: the child's group is stopped, the lock released, exit 130
    (interrupted), whatever status the child itself ends with."""
    started = tmp_path / "started"
    p = cli.spawn("exec", "--lock", "intr", "--", "sh", "-c", f"touch {started}; exec sleep 30")
    wait_for(started.exists, what="the child running")
    p.send_signal(signal.SIGINT)
    assert p.wait(10) == 130
    assert not rs.redis.exists(rs.keys.lock("intr").lock)
    h = cli.json("history", "intr")
    assert h[0]["result"] == "failed" and "SIGINT" in h[0]["error"]


def test_a_signal_while_waiting_for_the_lock_stops_waiting(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    """SIGTERM / Ctrl-C while `exec --if-locked wait` waits: it stops waiting at once
    (143 / 130), never runs the command and never takes the lock."""
    started = tmp_path / "started"
    holder = cli.spawn("exec", "--lock", "w8", "--", "sh", "-c", f"touch {started}; exec sleep 30")
    wait_for(started.exists, what="the holder running")
    marker = tmp_path / "ran"
    for sig, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        err = tmp_path / f"waiter-{sig}.err"
        with open(err, "w") as fh:
            w = cli.spawn(
                "-v", "exec", "--lock", "w8", "--if-locked", "wait", "--", "touch", str(marker),
                stderr=fh,
            )  # fmt: skip
        wait_for(lambda: "; waiting for it" in err.read_text(), what="the waiter waiting")  # noqa: B023
        w.send_signal(sig)
        assert w.wait(10) == code, err.read_text()
    assert not marker.exists()
    holder.send_signal(signal.SIGTERM)
    assert holder.wait(10) == 143


def test_once_per_duration_refuses_a_time_zone(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    r = cli("exec", "--lock", "tzd", "--once-per", "1h", "--tz", "Asia/Kolkata", "--",
            "touch", str(marker), check=2)  # fmt: skip
    assert "--tz" in r.stderr and "cron expression" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not marker.exists() and not rs.redis.keys(f"{rs.namespace}:*")
    cli("exec", "--lock", "tzd", "--once-per", "0 * * * *", "--tz", "Asia/Kolkata", "--",
        "touch", str(marker), check=0)  # fmt: skip
    assert marker.exists()


def test_once_per_that_is_neither_form_names_both(cli: Cli) -> None:
    r = cli("exec", "--lock", "np", "--once-per", "1x", "--", "true", check=2)
    assert "--once-per" in r.stderr and "duration" in r.stderr and "cron" in r.stderr
    r = cli("run", "cron", "--schedule", "* * * * *", "--", "true", check=2)
    assert "no command after the cron's name 'true'" in r.stderr


def test_redis_dies_during_the_job_the_record_is_written_when_it_returns(
    own_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """Redis is kill -9'd while the command runs: the watchdog stops the command at
    the TTL (the lease is gone for sure), `exec` keeps the run's record and writes
    it once Redis is back (AOF restart), then exits with the command's status.
    Today's `exec` gave up on the record after ~6 s of retries and wrote none."""
    c = Cli(own_server, namespace, cwd=str(tmp_path))
    pidfile = tmp_path / "job.pid"
    err = tmp_path / "exec.err"
    job = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    try:
        with open(err, "w") as fh:
            p = c.spawn("exec", "--lock", "dies", "--ttl", "1s", "--", PY, "-c", job, stderr=fh)
        wait_for(lambda: pidfile.exists() and pidfile.read_text(), timeout=30, what="the job")
        pid = int(pidfile.read_text())
        t_kill = time.monotonic()
        own_server.kill()
        wait_for(lambda: not os.path.exists(f"/proc/{pid}"), timeout=30, what="the job killed")
        wait_for(lambda: "keeping the record" in err.read_text(), timeout=30, what="pending")
        assert p.poll() is None, err.read_text()
        # The outage lasts longer than today's retries did (6 attempts, 6.3 s in all).
        time.sleep(max(0.0, 8.0 - (time.monotonic() - t_kill)))
        own_server.start()
        assert p.wait(timeout=60) == 143, err.read_text()  # the job's SIGTERM status
        assert "is written (lost)" in err.read_text()
    finally:
        c.close()
    hist = c.json("history", "dies")
    assert len(hist) == 1 and hist[0]["result"] == "lost", hist
    assert hist[0]["exit_code"] == 143 and hist[0]["kind"] == "exec"
    # Its finish is when the job ended, not when Redis came back.
    assert hist[0]["finished_ms"] - hist[0]["started_ms"] == hist[0]["duration_ms"]
