"""What the long-running loops share (``run consumer``, ``run expired``, ``exec``):
their log lines on stderr, their stop on SIGTERM / SIGINT, and which Redis
errors are an outage to wait out (:data:`TRANSIENT`) rather than a failure.

:class:`LineLog` writes ``rsched NAME: [error: |warning: ]message``, drops
``debug`` unless verbose and ``info`` when quiet, and never lets a closed or
broken stderr take a loop down. A ``sink`` (the CLI's, which also knows
``--log-format json``) gets the finished line instead.

:func:`stop_signals` routes SIGTERM and SIGINT (and any others asked for) to a
callback while a loop runs and puts the previous handlers back afterwards.
Python only delivers signals to the main thread, so by default it installs
nothing when called from another thread (a loop embedded in an application
leaves the application's handlers alone).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

_PREFIX = {"error": "error: ", "warning": "warning: "}


class LineLog:
    """``log(level, message)`` for one loop; ``level``: debug | info | warning | error."""

    def __init__(
        self,
        name: str,
        *,
        verbose: int = 0,
        quiet: bool = False,
        sink: Callable[[str], None] | None = None,
    ):
        self.name = name
        self.verbose = verbose
        self.quiet = quiet
        self.sink = sink

    def wants(self, level: str) -> bool:
        if level == "debug":
            return bool(self.verbose) and not self.quiet
        return not (level == "info" and self.quiet)

    def __call__(self, level: str, message: str) -> None:
        if not self.wants(level):
            return
        line = f"rsched {self.name}: {_PREFIX.get(level, '')}{message}"
        if self.sink is not None:
            self.sink(line)
            return
        try:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        except (OSError, ValueError, RuntimeError):  # stderr closed or gone: keep running
            pass


#: SIGTERM/SIGINT that came while a run loop was starting (see catch_early_signals)
_early: list[str] = []


def catch_early_signals(signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT)) -> None:
    """From now until a loop's :func:`stop_signals` takes over, remember ``signals``
    instead of dying of them: a SIGTERM while the loop starts (its metrics server
    may already answer) is then a clean stop, as it is a moment later. Only from
    the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return

    def remember(signum: int, _frame: Any) -> None:
        _early.append(signal.Signals(signum).name)

    for sig in signals:
        try:
            signal.signal(sig, remember)
        except (ValueError, OSError):
            pass


def replay_early_signal(handler: Callable[[int, Any], None]) -> None:
    """For a loop that installs its own ``signal.signal`` handlers: call ``handler``
    (signum, frame) for a signal :func:`catch_early_signals` remembered."""
    if _early:
        name = _early[0]
        _early.clear()
        handler(int(signal.Signals[name]), None)


@contextmanager
def stop_signals(
    on_signal: Callable[[str], None],
    install: bool | None = None,
    signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT),
) -> Iterator[bool]:
    """While inside, each of ``signals`` calls ``on_signal(name)`` ("SIGTERM", ...).

    ``install``: None = only from the main thread (the only one Python delivers
    signals to). Yields whether handlers were installed."""
    if install is None:
        install = threading.current_thread() is threading.main_thread()
    old: dict[int, Any] = {}

    def handler(signum: int, _frame: Any) -> None:
        on_signal(signal.Signals(signum).name)

    if install:
        for sig in signals:
            try:
                old[sig] = signal.signal(sig, handler)
            except (ValueError, OSError):  # not the main thread after all, or not allowed
                pass
    if old and _early:  # came while the loop was starting: act on it now
        on_signal(_early[0])
        _early.clear()
    try:
        yield bool(old)
    finally:
        for sig, previous in old.items():
            try:
                signal.signal(sig, previous)
            except (ValueError, OSError):
                pass
