"""`rsched top`: the live dashboard. A collector thread refreshes a snapshot
every ``--interval``; the main thread redraws (countdowns move every second),
reads keys in cbreak mode and restores the terminal however it exits."""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from rsched.cli.main import App, output_options, pass_app
from rsched.core.errors import BadInput
from rsched.core.timeutil import human_duration, parse_duration

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console

    from rsched.api import Rsched
    from rsched.tools.top import Snapshot

#: A refresh that has not answered for this long shows a banner (it may be frozen).
SLOW_MS = 3_000


@dataclass
class _State:
    snap: Snapshot
    local_at: float  # time.monotonic() when snap was taken
    error: str | None = None
    error_since: float | None = None
    fetch_started: float | None = None


class _Collector(threading.Thread):
    """Refreshes the snapshot every ``interval_ms``; on failure keeps the last
    one, says why, and retries at the same pace."""

    def __init__(self, rs: Rsched, first: Snapshot, interval_ms: int, poke: int):
        super().__init__(name="rsched-top-collector", daemon=True)
        self.rs = rs
        self.interval_s = interval_ms / 1000
        self.poke = poke
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.state = _State(first, time.monotonic())

    def view(self) -> _State:
        with self.lock:
            s = self.state
            return _State(s.snap, s.local_at, s.error, s.error_since, s.fetch_started)

    def run(self) -> None:
        from rsched.core.errors import RedisUnavailable, map_error
        from rsched.tools.top import collect

        while not self.stop.wait(self.interval_s):
            with self.lock:
                self.state.fetch_started = time.monotonic()
                prev = self.state.snap
            try:
                snap = collect(self.rs, prev)
            except Exception as exc:  # noqa: BLE001 - shown in the banner, retried
                err = map_error(exc)
                msg = (
                    "Redis unreachable, retrying"
                    if isinstance(err, RedisUnavailable)
                    else f"error reading Redis, retrying: {err}"
                )
                with self.lock:
                    self.state.error = msg
                    self.state.error_since = self.state.error_since or time.monotonic()
                    self.state.fetch_started = None
            else:
                with self.lock:
                    self.state = _State(snap, time.monotonic())
            try:
                os.write(self.poke, b"x")
            except OSError:  # the pipe is full (nobody is reading) or closed
                pass


def _banner(st: _State, now: float) -> str | None:
    if st.error:
        since = human_duration(int((now - (st.error_since or now)) * 1000))
        return f"{st.error} (for {since})"
    if st.fetch_started is not None and (now - st.fetch_started) * 1000 >= SLOW_MS:
        waited = human_duration(int((now - st.fetch_started) * 1000))
        return f"Redis not answering for {waited}, waiting"
    return None


def _frame(st: _State, console: Console, title: str, interval_ms: int) -> Any:
    from rsched.tools.top import render

    mono = time.monotonic()
    now_ms = st.snap.now_ms + int((mono - st.local_at) * 1000)
    w, h = console.size
    return render(
        st.snap,
        width=w,
        height=h,
        now_ms=now_ms,
        title=title,
        interval_ms=interval_ms,
        banner=_banner(st, mono),
    )


class _Quit(Exception):
    pass


def _live(rs: Rsched, first: Snapshot, interval_ms: int, title: str, console: Console) -> None:
    import termios
    import tty

    from rich.live import Live

    r_poke, w_poke = os.pipe()
    os.set_blocking(r_poke, False)
    os.set_blocking(w_poke, False)
    collector = _Collector(rs, first, interval_ms, w_poke)
    suspend = threading.Event()
    hung_up = threading.Event()

    def poke(_signum: int, _frame: Any) -> None:
        try:
            os.write(w_poke, b"w")
        except OSError:
            pass

    def on_tstp(signum: int, frame: Any) -> None:
        suspend.set()  # Ctrl-Z: the loop gives the terminal back, then stops
        poke(signum, frame)

    def on_quit(signum: int, _frame: Any) -> None:
        if signum == signal.SIGHUP:
            hung_up.set()
        raise _Quit()

    keys: int | None = sys.stdin.fileno() if sys.stdin.isatty() else None
    saved = termios.tcgetattr(keys) if keys is not None else None

    def restore() -> None:
        if saved is not None:
            try:
                termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, saved)
            except (termios.error, OSError):  # the terminal is gone
                pass

    # Ctrl-C quits even when the parent left SIGINT ignored or blocked (both survive
    # exec; Python then raises no KeyboardInterrupt and the view would go on).
    old_handlers = {
        s: signal.signal(s, h)
        for s, h in (
            (signal.SIGWINCH, poke),
            (signal.SIGTSTP, on_tstp),
            (signal.SIGTERM, on_quit),
            (signal.SIGHUP, on_quit),
            (signal.SIGINT, on_quit),
        )
    }
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    live = Live(console=console, screen=True, auto_refresh=False, transient=True)
    try:
        if keys is not None:
            tty.setcbreak(keys, termios.TCSANOW)
        collector.start()
        tick_s = min(1.0, interval_ms / 1000)
        live.start()
        while True:
            if suspend.is_set():
                live.stop()
                restore()
                signal.signal(signal.SIGTSTP, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTSTP)  # stopped here until `fg`
                signal.signal(signal.SIGTSTP, on_tstp)
                suspend.clear()
                if keys is not None:
                    tty.setcbreak(keys, termios.TCSANOW)
                live.start()
            live.update(_frame(collector.view(), console, title, interval_ms), refresh=True)
            fds = [r_poke] + ([keys] if keys is not None else [])
            ready, _, _ = select.select(fds, [], [], tick_s)
            if keys is not None and keys in ready:
                data = os.read(keys, 64)
                if not data:  # the terminal went away
                    keys = None
                elif b"q" in data or b"Q" in data:
                    return
            if r_poke in ready:
                try:
                    while os.read(r_poke, 512):
                        pass
                except BlockingIOError:
                    pass
    except (KeyboardInterrupt, _Quit):
        return
    finally:
        collector.stop.set()
        try:
            live.stop()  # leaves the alternate screen, shows the cursor
        except OSError:
            if not hung_up.is_set():
                raise
        restore()
        for s, h in old_handlers.items():
            signal.signal(s, h)
        if collector.ident is not None:
            collector.join(timeout=0.2)
        if not collector.is_alive():  # else a refresh hangs on Redis: the pipe goes at exit
            os.close(r_poke)
            os.close(w_poke)


@click.command("top")
@click.option(
    "--interval",
    default="1s",
    show_default=True,
    metavar="DUR",
    help="Refresh every DUR (100ms or more); countdowns move every second regardless.",
)
@click.option(
    "--once",
    is_flag=True,
    help="Print one frame to stdout and exit (fits $COLUMNS; --json for the data).",
)
@output_options
@pass_app
def top(app: App, interval: str, once: bool) -> None:
    """Live dashboard of queues, running tasks (with their progress), crons (next fire
    counting down), locks and the latest runs.

    \b
    Keys: q (or Ctrl-C) quits. Fits an 80x24 terminal: long names are cut
    with an ellipsis and each panel shows "+N more" when it has more rows.
    When Redis goes away the last data stays on screen under a "Redis
    unreachable, retrying" banner; exit 69 only if it is unreachable at start.
    Each refresh costs a few pipelined round trips; the lock listing SCANs
    (never KEYS) at most every 5s.
    """
    from rich.console import Console

    from rsched.tools.top import collect, dumps, render

    interval_ms = parse_duration(interval, "--interval")
    if interval_ms < 100:
        raise BadInput("--interval", f"{interval!r} is too short: give 100ms or more")
    if app.json and not once:
        raise BadInput("--json", "only with --once (the live view is for people)")
    rs = app.rs  # connects: exit 69 when Redis is unreachable at start
    first = collect(rs)
    title = f"{app.settings.safe_url} ns={rs.namespace}"
    if once:
        if app.json:
            click.echo(dumps(first))
            return
        console = Console()
        height = console.height if console.is_terminal else None
        console.print(render(first, width=console.width, height=height, title=title))
        return
    console = Console()
    if not console.is_terminal:
        raise click.UsageError("stdout is not a terminal; use `rsched top --once` for one frame")
    _live(rs, first, interval_ms, title, console)
