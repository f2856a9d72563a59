"""Progress: a Python handler's ``task.progress(fraction, message)`` and a command
handler's ``FRACTION MESSAGE`` lines on RSCHED_PROGRESS_FD, shown by ``show`` and
``list`` (``progress``: {"fraction", "message", "at", "at_ms"} or null) while the
task runs, kept in the run's history record."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from rsched.api import Rsched
from rsched.runtime.handlers import check_progress, parse_progress_line
from tests.support import Cli, wait_for


def history(rs: Rsched) -> list[dict[str, Any]]:
    return [json.loads(f["j"]) for _, f in rs.redis.xrange(rs.keys.queue("default").history)]


def progress_of(cli: Cli, task_type: str, task_id: str) -> Any:
    return cli.json("show", task_type, task_id)["progress"]


@pytest.mark.valkey
def test_python_handler_progress_is_shown_while_it_runs_and_kept_in_history(
    rs: Rsched, cli: Cli
) -> None:
    rs.add("pg.py", "1")
    rs.add("pg.py", "idle", delay=3_600_000)
    assert cli.json("show", "pg.py", "idle")["progress"] is None
    go = threading.Event()

    def handler(task: Any) -> None:
        task.progress(0.5, "half way")
        assert go.wait(30)
        with pytest.raises(ValueError):
            task.progress(1.5)
        task.progress(1, "done")

    c = rs.consumer(handlers={"pg.py": handler}, burst=True, quiet=True)
    t = threading.Thread(target=c.run, daemon=True)
    t.start()
    wait_for(lambda: progress_of(cli, "pg.py", "1") is not None, timeout=10, what="progress")
    p = progress_of(cli, "pg.py", "1")
    assert (p["fraction"], p["message"]) == (0.5, "half way") and p["at"].endswith("Z")
    assert abs(p["at_ms"] - rs.now_ms()) < 10_000
    [row] = [x for x in cli.json("list", "--state", "processing")]
    assert row["progress"]["message"] == "half way"
    assert "50% half way" in cli("show", "pg.py", "1", check=0).stdout
    go.set()
    t.join(30)
    [rec] = history(rs)
    assert rec["result"] == "ok"
    assert (rec["progress"]["fraction"], rec["progress"]["message"]) == (1.0, "done")


def test_command_handler_writes_progress_lines_to_its_fd(
    rs: Rsched, cli: Cli, tmp_path: Path
) -> None:
    gate = tmp_path / "go"
    h = tmp_path / "h.sh"
    h.write_text(
        "#!/bin/sh\n"
        'echo "not a progress line" >&"$RSCHED_PROGRESS_FD"\n'
        'echo "2 out of range" >&"$RSCHED_PROGRESS_FD"\n'
        'echo "0.25 copying files" >&"$RSCHED_PROGRESS_FD"\n'
        f'while [ ! -e "{gate}" ]; do sleep 0.05; done\n'
        'echo "0.9 almost" >&"$RSCHED_PROGRESS_FD"\n'
    )
    h.chmod(0o755)
    rs.add("pg.cmd", "7")
    p = cli.spawn(
        "run", "consumer", "--burst", "--handler", f"pg.cmd={h}", stdout=subprocess.DEVNULL
    )
    try:
        wait_for(lambda: progress_of(cli, "pg.cmd", "7") is not None, timeout=20, what="progress")
        got = progress_of(cli, "pg.cmd", "7")
        assert (got["fraction"], got["message"]) == (0.25, "copying files")
        gate.touch()
        assert p.wait(30) == 0
    finally:
        if p.poll() is None:
            p.kill()
    [rec] = history(rs)
    assert rec["result"] == "ok"
    assert (rec["progress"]["fraction"], rec["progress"]["message"]) == (0.9, "almost")
    # and `history --json` shows it, with the server's clock at the claim
    [shown] = cli.json("history", "--queue", "default")
    assert shown["progress"]["message"] == "almost"
    assert shown["claimed_ms"] == rec["claimed_ms"] and shown["claimed_at"].endswith("Z")


def test_a_new_claim_clears_the_last_attempts_progress(rs: Rsched, cli: Cli) -> None:
    rs.add("pg.retry", "1", max_attempts=2)
    seen: list[Any] = []

    def handler(task: Any) -> None:
        seen.append(rs.show("pg.retry", "1").progress)  # at the start of each attempt
        task.progress(0.3, f"attempt {task.attempt}")
        raise RuntimeError("again")

    # the retry is due at once: this burst runs both attempts
    rs.consumer(handlers={"pg.retry": handler}, burst=True, quiet=True, backoff_ms=1).run()
    assert seen == [None, None]
    # the failed (last) attempt's progress stays
    dead = cli.json("show", "pg.retry", "1")
    assert dead["state"] == "dead" and dead["progress"]["message"] == "attempt 2"


def test_progress_values() -> None:
    assert check_progress(0, "") == (0.0, "")
    assert check_progress(1, "x" * 500)[1] == "x" * 200
    for bad in (-0.1, 1.01, float("nan"), True, "0.5", None):
        with pytest.raises(ValueError):
            check_progress(bad)
    assert parse_progress_line(b"0.5 half way\n") == (0.5, "half way")
    assert parse_progress_line(b"1\n") == (1.0, "")
    assert parse_progress_line(b"half\n") is None
    assert parse_progress_line(b"1.5 x\n") is None
