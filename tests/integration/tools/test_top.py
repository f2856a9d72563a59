"""`rsched top`: a frame rendered headless shows queues, crons, locks and runs
and fits 80x24; the live view runs in a real pseudo-terminal, quits on `q` and
Ctrl-C with the terminal restored, and rides out Redis going away."""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from rich.console import Console

from rsched.api import Rsched
from rsched.core import cronexpr
from rsched.core.timeutil import relative
from rsched.cron.runner import CronRunner
from rsched.cron.spec import make_spec
from rsched.locks.lock import Lock
from rsched.tools.top import LOCK_SCAN_EVERY_MS, collect, render
from tests.support import RSCHED, Cli, RedisServer, free_port, rsched_env, wait_for

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_COLOUR = re.compile(r"\x1b\[(?:[0-9;]*;)?(?:3|4|9|10)[0-9][;m]")


@pytest.fixture
def scene(cli: Cli, rs: Rsched) -> Iterator[dict[str, int]]:
    """Queue `orders`: 3 scheduled, 2 due; cron `nightly` registered; lock
    `backup` held; one `exec` run recorded."""
    for i in range(3):
        rs.add("order.close", f"later-{i}", queue="orders", delay="1h")
    for i in range(2):
        rs.add("order.close", f"now-{i}", queue="orders")
    spec = make_spec("nightly", "0 3 * * *", ["true"])
    CronRunner(rs, spec).register()
    cli("exec", "--lock", "once", "--", "true", check=0)
    lock = Lock(rs, "backup", ttl_ms=60_000, watchdog=False)
    token = lock.acquire()
    yield {"token": token, "pid": os.getpid()}
    lock.release()


def _frame(rs: Rsched, width: int = 80, height: int | None = 24) -> tuple[str, int]:
    snap = collect(rs)
    console = Console(
        width=width, height=height or 25, record=True, file=io.StringIO(), color_system=None
    )
    console.print(render(snap, width=width, height=height))
    return console.export_text(), snap.now_ms


def _line(text: str, first: str) -> list[str]:
    rows = [ln.split() for ln in text.splitlines() if ln.split()[:1] == [first]]
    assert rows, f"no row starting with {first!r} in:\n{text}"
    return rows[0]


def test_headless_frame_shows_queue_cron_lock_and_run(rs: Rsched, scene: dict[str, int]) -> None:
    text, now = _frame(rs)
    lines = text.splitlines()
    assert len(lines) <= 24 and max(len(ln) for ln in lines) <= 80, text
    # QUEUE SCHED DUE PROC STALE DEAD ...
    assert _line(text, "orders")[1:6] == ["3", "2", "0", "0", "0"]
    nxt = cronexpr.parse("0 3 * * *", "UTC").next_after(now)
    assert relative(nxt, now) in " ".join(_line(text, "nightly"))
    lock = _line(text, "backup")
    assert lock[1] == "lock" and lock[-1] == str(scene["token"])
    assert f":{scene['pid']}" in lock[2]
    run = [ln for ln in lines if " exec " in ln and " once " in ln]
    assert run and " ok " in run[0], text


def test_once_prints_one_frame_that_honours_the_width(
    cli: Cli, rs: Rsched, scene: dict[str, int]
) -> None:
    res = cli("top", "--once", env={"COLUMNS": "80"}, check=0)
    lines = res.stdout.splitlines()
    assert lines[0].startswith("rsched top") and max(len(ln) for ln in lines) <= 80
    assert _line(res.stdout, "orders")[1:6] == ["3", "2", "0", "0", "0"]
    assert _line(res.stdout, "nightly")[1] == "in"
    assert _line(res.stdout, "backup")[-1] == str(scene["token"])
    assert "\x1b[" not in res.stdout  # not a terminal: no colour codes
    narrow = cli("top", "--once", env={"COLUMNS": "50"}, check=0).stdout
    assert max(len(ln) for ln in narrow.splitlines()) <= 50
    assert _line(narrow, "orders")[1:3] == ["3", "2"]
    data = cli.json("top", "--once")
    assert data["queues"][0]["queue"] == "orders" and data["queues"][0]["due"] == 2
    assert data["crons"][0]["name"] == "nightly" and data["crons"][0]["next_fire_ms"]
    assert data["locks"][0]["token"] == scene["token"]
    assert any(r["kind"] == "exec" and r["name"] == "once" for r in data["runs"])


def test_busy_namespace_fits_80x24_with_more_rows_elided(rs: Rsched) -> None:
    for i in range(30):
        rs.add("t", "1", queue=f"queue-number-{i:02d}-with-a-name-far-too-long-for-80-columns")
    for i in range(10):
        rs.add("t", "1", queue=f"idle-{i:02d}", delay="1h")
    for i in range(12):
        CronRunner(rs, make_spec(f"cron-{i:02d}", "*/5 * * * *", ["true"])).register()
    locks = [Lock(rs, f"lock-{i:02d}", ttl_ms=60_000, watchdog=False) for i in range(9)]
    for lk in locks:
        lk.acquire()
    try:
        text, _ = _frame(rs)
    finally:
        for lk in locks:
            lk.release()
    lines = text.splitlines()
    assert len(lines) <= 24 and max(len(ln) for ln in lines) <= 80, text
    assert "QUEUES (40)" in text and "CRONS (12)" in text and "LOCKS (9)" in text
    assert "…" in text  # long queue names are ellipsized, not wrapped
    more = [int(ln.split()[0][1:]) for ln in lines if ln.split()[1:2] == ["more"]]
    shown_queues = sum(1 for ln in lines if ln.startswith("queue-number-"))
    assert len(more) == 3 and shown_queues + more[0] == 40
    assert "idle-" not in text  # queues with due work come first
    # With no height (--once into a pipe) panels are capped but longer.
    tall, _ = _frame(rs, height=None)
    assert sum(1 for ln in tall.splitlines() if ln.startswith("queue-number-")) > shown_queues


def test_locks_between_scans_are_re_read_not_rescanned(rs: Rsched) -> None:
    a = Lock(rs, "a", ttl_ms=60_000, watchdog=False)
    b = Lock(rs, "b", ttl_ms=60_000, watchdog=False)
    a.acquire()
    b.acquire()
    first = collect(rs)
    assert [lk.name for lk in first.locks] == ["a", "b"]
    b.release()
    c = Lock(rs, "c", ttl_ms=60_000, watchdog=False)
    c.acquire()
    rs.redis.pexpire(rs.keys.lock("a").lock, 30_000)
    again = collect(rs, first)  # within LOCK_SCAN_EVERY_MS: no SCAN
    assert again.locks_scan_ms == first.locks_scan_ms
    assert [lk.name for lk in again.locks] == ["a"]  # the released one is gone at once
    assert again.locks[0].ttl_ms <= 30_000
    first.locks_scan_ms = again.now_ms - LOCK_SCAN_EVERY_MS
    rescanned = collect(rs, first)
    assert [lk.name for lk in rescanned.locks] == ["a", "c"]
    assert rescanned.locks_scan_ms == rescanned.now_ms
    for lk in (a, c):
        lk.release()


def test_every_terminal_size_from_20_columns_fits() -> None:
    from rsched.cron.admin import CronInfo
    from rsched.locks.admin import LockInfo
    from rsched.queue.ops import QueueStats
    from rsched.tools.history import Record
    from rsched.tools.top import Snapshot

    now = 1_800_000_000_000
    long = "x" * 150
    snap = Snapshot(
        now,
        [
            QueueStats(f"q{i}-{long}", 10**i, i, i, i, i, now + 1000, 90_000, i, i % 2 == 0)
            for i in range(8)
        ],
        [
            CronInfo(
                f"c{i}",
                "*/5 * * * *",
                "UTC",
                now + 5000,
                now - 3000,
                "failed",
                long,
                2,
                False,
                True,
            )
            for i in range(6)
        ],
        [
            LockInfo(f"l{i}-{long}", "cron", long, 123456, 10**i, now - 10, 60_000, 10, None)
            for i in range(6)
        ],
        [
            Record(f"{now - i}-0", {"kind": "exec", "name": long, "result": "ok", "error": long})
            for i in range(20)
        ],
        now,
    )
    for width in range(20, 201, 9):
        for height in [*range(12, 61, 6), None]:
            console = Console(width=width, height=height or 25, record=True, file=io.StringIO())
            console.print(
                render(snap, width=width, height=height, title=long, interval_ms=1000, banner=long)
            )
            lines = console.export_text().splitlines()
            assert max(len(ln) for ln in lines) <= width, (width, height)
            assert height is None or len(lines) <= height, (width, height)


def test_empty_namespace_renders(rs: Rsched) -> None:
    text, _ = _frame(rs)
    assert "no queues" in text and "no crons registered" in text and "no locks held" in text


# --- the live view in a real pseudo-terminal ----------------------------------------------
_BOOT = (
    "import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    "os.execv(sys.executable, sys.argv[1:])"
)
# The same, started the way a script with `trap '' INT` (or a parent that blocks
# SIGINT) starts it: SIGINT ignored and blocked, as exec passes both on.
_BOOT_SIGINT_IGNORED = (
    "import fcntl, os, signal, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    "signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}); "
    "os.execv(sys.executable, sys.argv[1:])"
)
# A minimal job-control shell: runs the command as a foreground job in its own
# process group; when it stops, prints "[stopped]" and takes the terminal back;
# on SIGUSR1 gives it back and continues the job (`fg`).
_JOB_SHELL = """
import fcntl, os, signal, sys, termios
fcntl.ioctl(0, termios.TIOCSCTTY, 0)
signal.signal(signal.SIGTTOU, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
pid = os.fork()
if pid == 0:
    os.setpgid(0, 0)
    os.tcsetpgrp(0, os.getpid())
    signal.signal(signal.SIGTTOU, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
    os.execv(sys.executable, sys.argv[1:])
try:
    os.setpgid(pid, pid)
except OSError:
    pass
while True:
    _, status = os.waitpid(pid, os.WUNTRACED)
    if os.WIFSTOPPED(status):
        os.tcsetpgrp(0, os.getpgrp())
        os.write(1, b"[stopped]")
        signal.sigwait({signal.SIGUSR1})
        os.tcsetpgrp(0, pid)
        os.kill(pid, signal.SIGCONT)
    else:
        sys.exit(os.waitstatus_to_exitcode(status))
"""


class Pty:
    """`rsched top` on a pseudo-terminal that is its controlling terminal (so
    Ctrl-C arrives as SIGINT), 80x24; everything it writes is collected."""

    def __init__(
        self, env: dict[str, str], *args: str, shell: bool = False, boot: str | None = None
    ):
        self.master, self.slave = pty.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        self.before = termios.tcgetattr(self.slave)
        boot = boot or (_JOB_SHELL if shell else _BOOT)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", boot, *RSCHED, "top", *args],
            stdin=self.slave,
            stdout=self.slave,
            stderr=self.slave,
            env={**env, "TERM": "xterm-256color"},
            start_new_session=True,
        )
        self.out = bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self.out += data

    @property
    def text(self) -> str:
        return bytes(self.out).decode(errors="replace")

    def last_frame(self) -> str:
        """The latest complete frame as plain text (each one starts at the home position)."""
        frames = [f for f in self.text.split("\x1b[H") if "rsched top" in f]
        if len(frames) > 1 and "\x1b[?1049l" not in frames[-1]:
            frames.pop()  # may still be arriving
        return _ANSI.sub("", frames[-1]).replace("\r\n", "\n") if frames else ""

    def resize(self, rows: int, cols: int) -> None:
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def send(self, data: bytes) -> None:
        os.write(self.master, data)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        os.close(self.slave)
        os.close(self.master)


@contextmanager
def live_top(
    env: dict[str, str], *args: str, shell: bool = False, boot: str | None = None
) -> Iterator[Pty]:
    p = Pty(env, *args, shell=shell, boot=boot)
    try:
        yield p
    finally:
        p.close()


def _assert_restored(p: Pty) -> None:
    assert termios.tcgetattr(p.slave) == p.before  # cbreak undone, echo back on
    tail = p.text[-200:]
    assert "\x1b[?1049l" in tail and "\x1b[?25h" in tail  # left the alternate screen, cursor shown


@pytest.mark.parametrize(
    ("key", "boot"),
    [(b"q", None), (b"\x03", None), (None, None), (b"\x03", _BOOT_SIGINT_IGNORED)],
    ids=["q", "ctrl-c", "sigterm", "ctrl-c-with-sigint-ignored-by-its-parent"],
)
def test_live_view_draws_and_quits(
    cli: Cli, rs: Rsched, scene: dict[str, int], key: bytes | None, boot: str | None
) -> None:
    """Ctrl-C quits even when the parent left SIGINT ignored or blocked (seen in CI:
    the view went on, since Python raises no KeyboardInterrupt for an ignored SIGINT)."""
    with live_top(cli.env(), "--interval", "200ms", boot=boot) as p:
        wait_for(lambda: "orders" in p.text and "backup" in p.text, what="the first frame")
        assert "\x1b[?1049h" in p.text  # alternate screen: the shell's screen comes back after
        assert not _COLOUR.search(p.text)  # NO_COLOR (bold and dim stay)
        # It keeps refreshing: a new task shows up without a key press.
        rs.add("order.close", "fresh", queue="orders")
        wait_for(lambda: _due(p.last_frame()) == "3", what="the new due count")
        if key is None:
            p.proc.terminate()
        else:
            p.send(key)
        assert p.proc.wait(10) == 0
        wait_for(lambda: "\x1b[?1049l" in p.text, what="leaving the alternate screen")
        _assert_restored(p)


def test_ctrl_z_gives_the_terminal_back_and_fg_redraws(
    cli: Cli, rs: Rsched, scene: dict[str, int]
) -> None:
    with live_top(cli.env(), shell=True) as p:
        wait_for(lambda: "orders" in p.last_frame(), what="the first frame")
        p.send(b"\x1a")
        wait_for(lambda: "[stopped]" in p.text, what="the job to stop")
        _assert_restored(p)  # while stopped the shell has its own terminal back
        drawn = p.text.count("\x1b[?1049h")
        p.proc.send_signal(signal.SIGUSR1)  # fg
        wait_for(lambda: p.text.count("\x1b[?1049h") > drawn, what="the screen taken again")
        wait_for(lambda: "orders" in p.text.rsplit("[stopped]", 1)[1], what="a redraw")
        assert termios.tcgetattr(p.slave)[3] & termios.ICANON == 0  # cbreak again
        p.send(b"q")
        assert p.proc.wait(10) == 0
        _assert_restored(p)


def test_live_view_follows_a_resize(cli: Cli, rs: Rsched, scene: dict[str, int]) -> None:
    env = {k: v for k, v in cli.env().items() if k != "NO_COLOR"}
    with live_top(env, "--interval", "5s") as p:
        wait_for(lambda: "orders" in p.last_frame(), what="the first frame")
        assert "\x1b[32m" in p.text  # colour without NO_COLOR: the ok run is green
        assert max(len(ln) for ln in p.last_frame().splitlines()) > 50
        p.resize(16, 50)  # SIGWINCH (at the latest the 1s redraw) picks up the new size

        def small() -> bool:
            lines = p.last_frame().rstrip("\n").splitlines()
            return "orders" in p.last_frame() and len(lines) <= 16 and max(map(len, lines)) <= 50

        wait_for(small, timeout=4, what="a 50x16 frame")
        p.send(b"q")
        assert p.proc.wait(10) == 0
        _assert_restored(p)


def test_each_refresh_costs_redis_a_few_commands_and_never_keys(
    own_server: RedisServer, namespace: str
) -> None:
    rs = Rsched(own_server.client(), namespace)
    for q in ("a", "b"):
        rs.add("t", "1", queue=q)
    CronRunner(rs, make_spec("c", "* * * * *", ["true"])).register()
    Lock(rs, "l", ttl_ms=60_000, watchdog=False).acquire()
    with live_top(rsched_env(own_server, namespace), "--interval", "200ms") as p:
        wait_for(lambda: "QUEUES (2)" in p.last_frame(), what="the first frame")
        own_server.client().config_resetstat()
        t0 = time.monotonic()
        threading.Event().wait(2.0)  # the quantity under test is commands per unit of time
        info = own_server.client().info("commandstats")
        elapsed = time.monotonic() - t0
        p.send(b"q")
        assert p.proc.wait(10) == 0
    calls = {k.removeprefix("cmdstat_"): v["calls"] for k, v in info.items()}
    assert "keys" not in calls
    assert calls.get("scan", 0) <= 2 * (elapsed * 1000 / LOCK_SCAN_EVERY_MS + 1)  # locks: throttled
    refreshes = elapsed / 0.2 + 1
    total = sum(calls.values()) - calls.get("info", 0) - calls.get("config|resetstat", 0)
    assert total / refreshes < 60, calls  # ~30: a few pipelines, nothing per task


def _due(frame: str) -> str | None:
    for ln in frame.replace("\r", "\n").splitlines():
        words = ln.split()
        if "orders" in words:
            i = words.index("orders")
            return words[i + 2] if len(words) > i + 2 else None
    return None


def test_redis_going_away_shows_a_banner_and_recovers(
    own_server: RedisServer, namespace: str
) -> None:
    with Rsched(own_server.client(), namespace) as rs:
        rs.add("t", "1", queue="orders")
    with live_top(rsched_env(own_server, namespace), "--interval", "200ms") as p:
        wait_for(lambda: "orders" in p.text, what="the first frame")
        own_server.kill()
        wait_for(lambda: "Redis unreachable, retrying" in p.last_frame(), what="the banner")
        assert p.proc.poll() is None
        assert "orders" in p.last_frame()  # the last data stays on screen
        own_server.start()
        wait_for(
            lambda: "unreachable" not in p.last_frame() and "QUEUES" in p.last_frame(),
            timeout=15,
            what="recovery",
        )
        own_server.freeze()  # a refresh hangs: the screen says so and `q` still quits
        try:
            wait_for(lambda: "Redis not answering" in p.last_frame(), what="the slow banner")
            p.send(b"q")
            assert p.proc.wait(5) == 0
        finally:
            own_server.thaw()
        _assert_restored(p)


def test_unreachable_at_start_exits_69(cli: Cli) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    for args in (["top", "--once"], ["top"]):
        res = cli("--redis-url", url, *args, timeout=30)
        assert res.returncode == 69, res.stderr
        assert "cannot use Redis" in res.stderr and res.stdout == ""


@pytest.mark.parametrize(
    "args, field",
    [
        (["--interval", "soon"], "--interval"),
        (["--interval", "10ms"], "--interval"),
        (["--json"], "--json"),
    ],
)
def test_bad_input_exits_2(cli: Cli, args: list[str], field: str) -> None:
    res = cli("top", *args)
    assert res.returncode == 2 and field in res.stderr, res.stderr


def test_live_view_needs_a_terminal(cli: Cli) -> None:
    res = cli("top")
    assert res.returncode == 2 and "--once" in res.stderr
    assert json.loads(cli("top", "--once", "--json", check=0).stdout)["queues"] == []


def test_running_tasks_and_their_progress(cli: Cli, tmp_path: Path) -> None:
    h = tmp_path / "h.sh"
    h.write_text('#!/bin/sh\necho "0.4 copying \x1b[31mred" >&"$RSCHED_PROGRESS_FD"\nsleep 30\n')
    h.chmod(0o755)
    cli("add", "copy", "c1")
    consumer = cli.spawn("run", "consumer", "--handler", f"copy={h}", "--grace", "1s")
    try:
        wait_for(
            lambda: cli.json("show", "copy", "c1")["progress"], timeout=20, what="its progress"
        )
        out = cli("top", "--once", env={"COLUMNS": "100"}).stdout
        assert "RUNNING (1)" in out and "copy c1" in out and "40% copying" in out
        assert "\x1b[31m" not in out  # a handler's terminal escape is shown escaped
        data = cli.json("top", "--once")
        assert [(t["id"], t["progress"]["fraction"]) for t in data["running"]] == [("c1", 0.4)]
    finally:
        consumer.terminate()
        consumer.wait(timeout=30)
