"""Run logs (`rsched logs`, `[logs] max_bytes`, `history`'s has_log) against a
real server and real rsched processes: a cron job's and an `exec`'s output
kept on success (and still passed through), a failed handler's stderr, the
cut at max_bytes, a bad max_bytes refused, `--follow` from another process."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from tests.support import RSCHED, Cli, wait_for


def test_exec_output_kept_on_success_and_passed_through(cli: Cli) -> None:
    r = cli("exec", "--lock", "lg1", "--", "sh", "-c", "echo hello; echo warn >&2", check=0)
    assert "hello" in r.stdout and "warn" in r.stderr  # still the runner's own output
    runs = cli.json("logs", "lg1")
    assert len(runs) == 1
    run = runs[0]
    assert run["stdout"] == "hello\n" and run["stderr"] == "warn\n"
    assert run["result"] == "ok" and run["name"] == "lg1" and run["truncated"] is False
    for k in ("queue", "type", "id", "token", "fire_at", "started_at", "finished_at"):
        assert k in run
    hist = cli.json("history", "lg1")
    assert hist[0]["has_log"] is True

    def log_cell(name: str) -> str:  # the LOG column of the newest row (cells may hold spaces)
        head, *rows = [ln for ln in cli("history", name, check=0).stdout.splitlines() if ln]
        at = head.index(" LOG ") + 1
        row = next(r for r in rows if not r.startswith("-"))
        return row[at : at + 3].strip()

    assert log_cell("lg1") == "yes"  # the table says which runs have logs
    cli("exec", "--lock", "lg2", "--", "true", check=0)  # wrote nothing: no log kept
    assert log_cell("lg2") == "no"
    cli("exec", "--lock", "lg1", "--", "sh", "-c", "echo second", check=0)
    assert [x["stdout"] for x in cli.json("logs", "lg1", "--all")] == ["second\n", "hello\n"]
    one = cli.json("logs", "lg1", "--run", str(run["token"]))
    assert one[0]["stdout"] == "hello\n"
    assert cli("logs", "nope", check=3).returncode == 3


def test_text_output_escapes_control_characters_only_on_a_terminal(cli: Cli) -> None:
    cli("exec", "--lock", "lg2", "--", "printf", "a\\033]0;x\\007b\\n", check=0)
    r = cli("logs", "lg2", check=0)
    assert "\x1b]0;x\x07b" in r.stdout  # piped: the raw text


def test_cron_job_output_kept(cli: Cli) -> None:
    p = cli.spawn(
        "run",
        "cron",
        "lgc",
        "--schedule",
        "* * * * * *",
        "--",
        "sh",
        "-c",
        "echo tick-$RSCHED_NAME",
        stdout=subprocess.PIPE,
    )
    try:
        wait_for(lambda: cli.json("history", "lgc"), timeout=20)
        wait_for(lambda: cli.json("logs", "lgc")[0]["stdout"] == "tick-lgc\n", timeout=20)
    finally:
        p.terminate()
        out, _ = p.communicate(timeout=20)
    assert "tick-lgc" in out


def test_failed_handler_stderr_kept(cli: Cli) -> None:
    cli("add", "lg.t", "42", check=0)
    cli(
        "run",
        "consumer",
        "--burst",
        "--handler",
        "lg.t=sh -c 'echo broke >&2; exit 3'",
        "--queue",
        "default",
        check=None,
    )
    runs = cli.json("logs", "--queue", "default", "lg.t", "42")
    assert runs[0]["result"] in ("failed",) and runs[0]["stderr"] == "broke\n"
    assert runs[0]["type"] == "lg.t" and runs[0]["id"] == "42"


def test_truncated_at_max_bytes(cli: Cli, tmp_path: Path) -> None:
    cfg = tmp_path / "logs.toml"
    cfg.write_text('[logs]\nmax_bytes = "1KiB"\n')
    cli("--config", str(cfg), "exec", "--lock", "lg3", "--", "sh", "-c",
        "head -c 5000 /dev/zero | tr '\\0' x; echo end", check=0)  # fmt: skip
    run = cli.json("logs", "lg3")[0]
    assert run["truncated"] is True
    assert len(run["stdout"]) == 1024 and run["stdout"].endswith("xend\n")


def test_bad_max_bytes_is_refused_and_nothing_runs(cli: Cli, tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[logs]\nmax_bytes = "lots"\n')
    marker = tmp_path / "ran"
    r = cli("--config", str(cfg), "exec", "--lock", "lg4", "--", "touch", str(marker), check=78)
    assert "logs.max_bytes" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not marker.exists()
    assert cli("history", "lg4", "--json", check=0).stdout.strip() == "[]"


def test_follow_streams_a_running_exec_from_another_process(cli: Cli, tmp_path: Path) -> None:
    go = tmp_path / "go"
    script = f"echo first; while [ ! -e {go} ]; do sleep 0.05; done; echo second"
    p = cli.spawn("exec", "--lock", "lg5", "--", "sh", "-c", script)
    f: Any = None
    try:
        wait_for(lambda: cli.json("locks", "lg5"), timeout=20)
        f = cli.spawn("logs", "lg5", "--follow")
        assert f.stdout is not None
        assert f.stdout.readline() == "first\n"  # written so far, while it still runs
        go.write_text("")
        assert f.stdout.readline() == "second\n"
        assert f.wait(timeout=20) == 0
    finally:
        p.wait(timeout=20)
    assert cli.json("logs", "lg5")[0]["stdout"] == "first\nsecond\n"


def test_text_on_a_terminal_escapes_control_characters(cli: Cli) -> None:
    import os
    import pty

    cli("exec", "--lock", "lg6", "--", "printf", "a\\033]0;x\\007b\\n", check=0)
    master, slave = pty.openpty()
    try:
        p = subprocess.run(
            [*RSCHED, "logs", "lg6"],
            stdout=slave,
            stderr=subprocess.PIPE,
            env=cli.env(),
            timeout=60,
        )
        os.close(slave)
        slave = -1
        out = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)
    assert p.returncode == 0, p.stderr
    assert b"\x1b" not in out and b"a\\x1b]0;x\\x07b" in out


def test_follow_streams_a_running_task_handler(cli: Cli, tmp_path: Path) -> None:
    go = tmp_path / "go"
    cli("add", "lg.f", "7", check=0)
    handler = f"lg.f=sh -c 'echo started; while [ ! -e {go} ]; do sleep 0.05; done; echo done'"
    c = cli.spawn("run", "consumer", "--burst", "--handler", handler)
    try:
        wait_for(lambda: cli.json("list", "--state", "processing"), timeout=20)
        f = cli.spawn("logs", "--queue", "default", "lg.f", "7", "--follow")
        assert f.stdout is not None
        assert f.stdout.readline() == "started\n"
        go.write_text("")
        assert f.stdout.readline() == "done\n"
        assert f.wait(timeout=20) == 0
    finally:
        go.write_text("")
        c.wait(timeout=30)
