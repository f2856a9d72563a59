"""rsched.runtime.pycall.CallControl: another thread stops a Python call (the
consumer's lost lease, cancel and end of the shutdown grace), forked or async."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

from rsched.runtime.pycall import CallControl, run_call


def _when(path: Path, then: object) -> threading.Thread:
    def go() -> None:
        deadline = time.monotonic() + 10
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        then()  # type: ignore[operator]

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def test_kill_before_the_start_means_it_never_runs(tmp_path: Path) -> None:
    ctl = CallControl()
    assert ctl.kill("lease lost") is False
    out = run_call(lambda _t: (tmp_path / "ran").touch(), None, timeout_s=5, control=ctl)
    assert not out.ok and out.error == "killed (lease lost)"
    assert not (tmp_path / "ran").exists()


def test_terminate_raises_system_exit_in_a_forked_call(tmp_path: Path) -> None:
    def work(_t: object) -> None:
        try:
            (tmp_path / "started").touch()
            time.sleep(30)
            (tmp_path / "after").touch()
        finally:
            (tmp_path / "finally").touch()

    ctl = CallControl()
    t = _when(tmp_path / "started", lambda: ctl.terminate("cancelled"))
    out = run_call(work, None, timeout_s=30, control=ctl)
    t.join()
    assert not out.ok and not out.timed_out and out.error == "killed (cancelled)"
    assert (tmp_path / "finally").exists() and not (tmp_path / "after").exists()


def test_kill_stops_a_forked_call_at_once(tmp_path: Path) -> None:
    def work(_t: object) -> None:
        (tmp_path / "started").touch()
        time.sleep(30)
        (tmp_path / "after").touch()

    ctl = CallControl()
    t = _when(tmp_path / "started", lambda: ctl.kill("shutdown"))
    out = run_call(work, None, timeout_s=30, control=ctl)
    t.join()
    assert out.error == "killed (shutdown)" and out.duration_s < 30
    assert not (tmp_path / "after").exists()


def test_kill_cancels_an_async_call(tmp_path: Path) -> None:
    async def work(_t: object) -> None:
        (tmp_path / "started").touch()
        try:
            await asyncio.sleep(30)
            (tmp_path / "after").touch()
        except asyncio.CancelledError:
            (tmp_path / "cancelled").touch()
            raise

    ctl = CallControl()
    t = _when(tmp_path / "started", lambda: ctl.kill("lease lost"))
    out = run_call(work, None, control=ctl)
    t.join()
    assert out.error == "killed (lease lost)"
    deadline = time.monotonic() + 5
    while not (tmp_path / "cancelled").exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert (tmp_path / "cancelled").exists() and not (tmp_path / "after").exists()


def test_a_forked_call_runs_its_function_in_a_child() -> None:
    seen: list[int] = []
    out = run_call(lambda _t: seen.append(os.getpid()), None, timeout_s=5)
    assert out.ok and seen == []  # appended in the child's memory, not ours
