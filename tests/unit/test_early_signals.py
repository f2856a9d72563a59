"""A SIGTERM that comes while a run loop starts (between start_loop and the loop's
own handlers) is remembered and handed to the loop, not a death by the signal."""

from __future__ import annotations

import os
import signal

from rsched.runtime import loop


def _restore(old: dict[int, object]) -> None:
    for sig, h in old.items():
        signal.signal(sig, h)  # type: ignore[arg-type]


def test_a_signal_while_starting_reaches_stop_signals() -> None:
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        loop.catch_early_signals()
        os.kill(os.getpid(), signal.SIGTERM)  # the process lives on: it is remembered
        got: list[str] = []
        with loop.stop_signals(got.append, install=True):
            assert got == ["SIGTERM"]  # handed over as soon as the loop's handlers are in
        with loop.stop_signals(got.append, install=True):
            assert got == ["SIGTERM"]  # once
    finally:
        _restore(old)


def test_a_signal_while_starting_reaches_a_loop_with_its_own_handler() -> None:
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        loop.catch_early_signals()
        os.kill(os.getpid(), signal.SIGINT)
        got: list[int] = []
        loop.replay_early_signal(lambda signum, _frame: got.append(signum))
        loop.replay_early_signal(lambda signum, _frame: got.append(signum))
        assert got == [signal.SIGINT]
    finally:
        _restore(old)
