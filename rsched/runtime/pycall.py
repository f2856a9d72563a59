"""Run a Python handler with a timeout that really stops it.

:func:`run_call` is what the worker calls for every Python task handler
(``rsched run worker``, :class:`rsched.App`):

* a plain function without a timeout runs in the calling thread (no cost);
* an ``async def`` handler runs on the process's one event loop (a daemon
  thread, :func:`event_loop`); with a timeout it is **cancelled** at the
  deadline (``asyncio.timeout``): ``CancelledError`` is raised at its current
  ``await``, its ``finally`` blocks run, and the run is recorded ``timeout``.
  A coroutine that blocks without awaiting cannot be cancelled until it awaits
  (it holds the loop; give such work a plain function instead);
* a plain function **with** a timeout runs in a **forked child process**
  (``os.fork``: a copy of the worker's memory, no re-import, ~1-3 ms) in a
  process group of its own, killed (SIGKILL to the group) at the deadline: its
  work does not go on. The child's return value is dropped (returning is ok,
  raising is failed, with the exception's text sent back through a pipe); what
  it changed in memory stays in the child; its output goes to the worker's
  stdout/stderr; side effects it made before the kill (rows written, requests
  sent) stay made, as with any killed process. The worker's guardian
  (:mod:`rsched.runtime.proc`) kills it too if the worker dies meanwhile
  (``kill -9``, the OOM killer): it never outlives its worker.

Returns :class:`rsched.runtime.handlers.CallOutcome` (``timed_out`` set when
the deadline stopped it).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import select
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

from rsched.runtime.handlers import CallOutcome

#: Bytes of a forked handler's error sent back to the worker, at most.
ERROR_MAX = 8000

_loop_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - a callable object's __call__
    )


def event_loop() -> asyncio.AbstractEventLoop:
    """The process's event loop for async handlers (started on first use, a daemon thread)."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            t = threading.Thread(target=loop.run_forever, name="rsched-asyncio", daemon=True)
            t.start()
            _loop = loop
        return _loop


def _error(exc: BaseException) -> str:
    tail = "".join(traceback.format_exception(exc)[-3:]).strip()
    return f"{type(exc).__name__}: {exc}\n{tail}"


def _timeout_text(timeout_s: float, how: str) -> str:
    return f"timeout: stopped after {timeout_s:g}s ({how})"


def run_call(fn: Callable[[Any], Any], arg: Any, timeout_s: float | None = None) -> CallOutcome:
    """Call ``fn(arg)``; see the module doc."""
    t0 = time.monotonic()
    error, timed_out = "", False
    if is_async(fn):
        error, timed_out = _run_async(fn, arg, timeout_s)
    elif timeout_s:
        error, timed_out = _run_forked(fn, arg, timeout_s)
    else:
        try:
            fn(arg)
        except BaseException as exc:  # noqa: BLE001 - a handler's failure is the run's
            error = _error(exc)
    dur = time.monotonic() - t0
    return CallOutcome(not error, error, int(dur * 1000), dur, timed_out)


def _run_async(fn: Callable[[Any], Any], arg: Any, timeout_s: float | None) -> tuple[str, bool]:
    async def bounded() -> None:
        if timeout_s:
            async with asyncio.timeout(timeout_s):
                await fn(arg)
        else:
            await fn(arg)

    fut = asyncio.run_coroutine_threadsafe(bounded(), event_loop())
    try:
        fut.result()
    except TimeoutError:
        assert timeout_s
        return _timeout_text(timeout_s, "the coroutine was cancelled"), True
    except BaseException as exc:  # noqa: BLE001
        return _error(exc), False
    return "", False


def _run_forked(fn: Callable[[Any], Any], arg: Any, timeout_s: float) -> tuple[str, bool]:
    from rsched.runtime import proc

    r, w = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    # The worker's guardian (rsched.runtime.proc) kills the child's group if the
    # worker dies (kill -9, OOM) while it runs: it never outlives its worker.
    guard = proc._GUARD.begin()
    with warnings.catch_warnings():  # "multi-threaded, fork() may deadlock": we call one fn
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: run, report, leave without running the parent's cleanup
        code = 0
        try:
            os.close(r)
            os.setpgid(0, 0)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            fn(arg)
        except BaseException as exc:  # noqa: BLE001
            code = 1
            try:
                os.write(w, _error(exc).encode("utf-8", "replace")[:ERROR_MAX])
            except OSError:
                pass
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            os._exit(code)
    os.close(w)
    try:
        try:
            os.setpgid(pid, pid)  # (both sides: the kill below must reach the group)
        except OSError:
            pass
        if guard is not None:
            proc._GUARD.started(guard[0], pid)
        deadline = time.monotonic() + timeout_s
        chunks: list[bytes] = []
        done = False
        while not done:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select([r], [], [], left)
            if ready:
                data = os.read(r, 65536)
                if data:
                    chunks.append(data)
                else:
                    done = True  # EOF: the child exited (or closed its end on the way out)
        if not done:
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            os.waitpid(pid, 0)
            return _timeout_text(timeout_s, "its process was killed"), True
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(r)
        if guard is not None:
            proc._GUARD.end(guard[0])
    code = os.waitstatus_to_exitcode(status)
    if code == 0:
        return "", False
    text = b"".join(chunks).decode("utf-8", "replace")
    return text or f"the handler's process ended with exit status {code}", False
