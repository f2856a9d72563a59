"""rsched.runtime.pycall: a Python handler past its timeout is really stopped."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from rsched.runtime.pycall import is_async, run_call


def test_plain_call_ok_and_failed() -> None:
    assert run_call(lambda _t: None, None).ok
    out = run_call(lambda _t: 1 / 0, None)
    assert not out.ok and not out.timed_out and out.error.startswith("ZeroDivisionError")


def test_forked_call_is_killed_at_its_timeout(tmp_path: Path) -> None:
    marker = tmp_path / "after"

    def slow(_t: object) -> None:
        (tmp_path / "pid").write_text(str(os.getpid()))
        time.sleep(5)
        marker.write_text("went on")

    out = run_call(slow, None, timeout_s=0.2)
    assert out.timed_out and not out.ok and "killed" in out.error
    pid = int((tmp_path / "pid").read_text())
    assert pid != os.getpid()  # it ran in a child
    try:
        os.kill(pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive and not marker.exists()


def test_forked_call_reports_its_exception_and_success() -> None:
    out = run_call(lambda _t: (_ for _ in ()).throw(ValueError("bad order")), None, timeout_s=5)
    assert not out.ok and not out.timed_out and "ValueError: bad order" in out.error
    seen: list[int] = []
    assert run_call(lambda _t: seen.append(1), None, timeout_s=5).ok
    assert seen == []  # the child's memory is its own


def test_async_call_is_cancelled_at_its_timeout() -> None:
    events: list[str] = []

    async def slow(_t: object) -> None:
        try:
            await asyncio.sleep(5)
            events.append("went on")
        except asyncio.CancelledError:
            events.append("cancelled")
            raise

    assert is_async(slow)
    out = run_call(slow, None, timeout_s=0.1)
    assert out.timed_out and "cancelled" in out.error
    assert events == ["cancelled"]

    async def fine(_t: object) -> None:
        await asyncio.sleep(0)
        events.append("ran")

    assert run_call(fine, None).ok and events[-1] == "ran"
