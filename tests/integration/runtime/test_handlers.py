"""The one handler runner (rsched.runtime.handlers) with real processes."""

from __future__ import annotations

import sys
import threading

from rsched.runtime.handlers import Command, HandlerRun, call, run

PY = sys.executable


def test_ok_gets_env_and_stdin_and_no_secret() -> None:
    import os

    os.environ["RSCHED_REDIS_PASSWORD"] = "hunter2"
    try:
        code = (
            "import os, sys; d = sys.stdin.read();"
            "sys.exit(0 if d == 'payload' and os.environ['RSCHED_X'] == 'y'"
            " and 'RSCHED_REDIS_PASSWORD' not in os.environ else 3)"
        )
        out = run(Command([PY, "-c", code], env={"RSCHED_X": "y"}, stdin=b"payload"))
    finally:
        del os.environ["RSCHED_REDIS_PASSWORD"]
    assert out.ok and out.result == "ok" and out.error == "" and out.exit_code == 0


def test_failure_keeps_the_stderr_tail() -> None:
    code = "import sys; sys.stderr.write('first\\nboom\\n'); sys.exit(4)"
    out = run(Command([PY, "-c", code]))
    assert not out.ok and out.result == "failed" and out.exit_code == 4
    assert out.error == "exit status 4: first\nboom"
    assert out.classify(lost=True) == "lost"


def test_timeout_kills_the_process_group() -> None:
    # A grandchild in the same group holds stderr open: the whole group must die.
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    out = run(Command([PY, "-c", code], timeout_s=0.5, grace_s=0.5))
    assert out.timed_out and out.result == "timeout" and out.killed == "timeout"
    assert out.error.startswith("killed (timeout)")
    assert out.duration_ms < 10_000


def test_a_kill_before_the_start_applies_at_the_start() -> None:
    r = HandlerRun(Command([PY, "-c", "import time; time.sleep(60)"]))
    assert r.kill("lease lost") is False  # not started: kept for the start
    out = r.start().wait()
    assert out.killed == "lease lost" and out.exit_code == 128 + 9 and not out.ok


def test_terminate_from_another_thread() -> None:
    code = "import sys, time; print('up', flush=True); time.sleep(60)"
    r = HandlerRun(Command([PY, "-c", code])).start()
    t = threading.Thread(target=lambda: r.terminate("cancelled"))
    t.start()
    t.join()
    out = r.wait()
    assert out.killed == "cancelled" and out.exit_code in (128 + 15, 128 + 9)


def test_a_program_that_cannot_start() -> None:
    out = run(Command(["/nonexistent/program-rsched"]))
    assert not out.started and out.exit_code == 127 and "cannot start" in out.stderr_tail


def test_call_python_handler() -> None:
    assert call(lambda x: x, 1).ok

    def bad(_: object) -> None:
        raise ValueError("nope")

    done = call(bad, 1)
    assert not done.ok and done.error.startswith("ValueError: nope\n")
