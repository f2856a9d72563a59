"""The Lua core survives `SCRIPT FLUSH` in a loop: no operation fails.

Shared harness: tests/faults/harness.py."""

from __future__ import annotations

import textwrap
import threading
from pathlib import Path
from typing import Any

from rsched.api import Rsched
from tests.faults.harness import EXEC_MODULE, Procs, cron_fires, figure, jsonl, runs, settled, stop
from tests.support import Cli, RedisServer, wait_for

# --- 5. SCRIPT FLUSH


def test_script_flush_in_a_loop_fails_no_operation(
    own_server: RedisServer, own: tuple[Cli, Rsched], tmp_path: Path
) -> None:
    cli, rs = own
    log = tmp_path / "exec.log"
    (tmp_path / "frec.py").write_text(textwrap.dedent(EXEC_MODULE))
    env = {"EXEC_LOG": str(log)}
    procs = Procs(cli, tmp_path)
    consumers = [
        procs.consumer("--call", "t.fl=frec:run", "--concurrency", "2", env=env, name=f"c{i}")
        for i in range(2)
    ]
    fires = tmp_path / "fires.log"
    runner, runner_err = procs.spawn(
        "run", "cron", "fl", "--schedule", "*/1 * * * * *", "--", "sh", "-c",
        f'echo "$RSCHED_FIRE_AT" >> {fires}', name="cron",
    )  # fmt: skip
    done = threading.Event()
    flushes = [0]

    def flusher() -> None:
        r = own_server.client()
        while not done.is_set():
            r.script_flush()
            flushes[0] += 1
            done.wait(0.002)

    t = threading.Thread(target=flusher, daemon=True)
    t.start()
    failed: list[str] = []

    def ok(*args: str, **kw: Any) -> None:
        res = cli(*args, **kw)
        if res.returncode != 0:
            failed.append(f"rsched {' '.join(args)} -> {res.returncode}: {res.stderr.strip()}")

    ids: list[str] = []
    try:
        for b in range(8):
            part = [f"b{b}-{i}" for i in range(250)]
            ids += part
            ok("add", "--from", "-", input=jsonl("t.fl", part))
            ok("add", "t.fl", f"s{b}")
            ids.append(f"s{b}")
            ok("add", "--in", "1h", "t.later", f"x{b}")
            ok("show", "t.later", f"x{b}")
            ok("cancel", "t.later", f"x{b}")
            ok("list", "--limit", "5")
            ok("queues")
            ok("requeue-stale")
            ok("exec", "--lock", "fl", "--", "true")
        everyone = [p for p, _ in consumers] + [runner]
        wait_for(
            lambda: {x.id for x in runs(log)} >= set(ids) or any(p.poll() for p in everyone),
            timeout=60,
            what="all tasks ran (or a process died)",
        )
        wait_for(lambda: len(cron_fires(fires)) >= 2, timeout=20, what="cron fires")
    finally:
        done.set()
        t.join(timeout=10)
    alive_after = [p.poll() is None for p in everyone]
    errs = procs.errors()
    figure("script_flush", flushes=flushes[0], tasks=len(ids), failed_operations=len(failed),
           process_errors=len(errs))  # fmt: skip
    assert not failed, "\n".join(failed)
    assert all(alive_after), f"a process died under SCRIPT FLUSH: {errs[:5]}"
    assert not errs, errs[:5]
    wait_for(lambda: settled(rs.redis, rs), timeout=30, what="everything acked")
    assert [stop(p) for p in everyone] == [0, 0, 0]
    assert flushes[0] > 100
