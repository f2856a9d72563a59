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

**Stopped from outside.** Give :func:`run_call` a :class:`CallControl` and
another thread can stop the call, as a command's :class:`HandlerRun` is
stopped (the consumer does: a lost lease and the end of the shutdown grace
kill, ``rsched cancel`` terminates then kills after the grace):

* :meth:`CallControl.kill`: a forked child's group gets SIGKILL now; a
  coroutine is cancelled;
* :meth:`CallControl.terminate`: a forked child's group gets SIGTERM, which
  raises ``SystemExit`` in the handler (its ``finally`` blocks and context
  managers run; the caller SIGKILLs it after its grace); a coroutine is
  cancelled.

A request made before the call started is applied as it starts. A plain
function without a timeout runs in the worker's thread and cannot be
stopped: it sees ``task.cancelled`` (rsched cancel) and should return.

Returns :class:`rsched.runtime.handlers.CallOutcome` (``timed_out`` set when
the deadline stopped it; the error ``killed (REASON)`` when a control did).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
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


class CallControl:
    """Stop one :func:`run_call` from another thread; see the module doc."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._fut: concurrent.futures.Future[Any] | None = None
        #: the first reason given (what the outcome's error says)
        self.killed: str | None = None
        self._pending: int | None = None  # the signal asked for before the start

    def kill(self, reason: str) -> bool:
        """SIGKILL a forked child's group now / cancel a coroutine. True if one ran."""
        return self._signal(signal.SIGKILL, reason)

    def terminate(self, reason: str) -> bool:
        """SIGTERM a forked child's group (SystemExit in it) / cancel a coroutine."""
        return self._signal(signal.SIGTERM, reason)

    def _signal(self, sig: int, reason: str) -> bool:
        with self._lock:
            self.killed = self.killed or reason
            pid, fut = self._pid, self._fut
            if pid is None and fut is None:
                if self._pending != signal.SIGKILL:
                    self._pending = sig
                return False
            if pid is not None:
                _kill_group(pid, sig)
                return True
        assert fut is not None
        fut.cancel()  # run_coroutine_threadsafe's future: cancels the task on the loop
        return True

    def _started(self, pid: int | None = None, fut: Any = None) -> None:
        with self._lock:
            self._pid, self._fut = pid, fut
            pending, self._pending = self._pending, None
        if pending is not None:
            self._signal(pending, self.killed or "stopped")

    def _ended(self) -> None:
        with self._lock:  # (before the child is reaped: its pid is never reused under us)
            self._pid = self._fut = None


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _read(fd: int) -> bytes | None:
    """What the pipe holds (b"": EOF; None: nothing now, on a non-blocking pipe)."""
    try:
        return os.read(fd, 65536)
    except BlockingIOError:
        return None


def _wait_go(fd: int, parent: int) -> bool:
    """In the child: wait for the worker's go; False when the worker died first."""
    while True:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            return os.read(fd, 1) == b"1"
        if os.getppid() != parent:
            return False


def _kill_group(pid: int, sig: int) -> None:
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, sig)
        except OSError:
            pass


def _killed_text(reason: str) -> str:
    return f"killed ({reason})"


def _terminated(_signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signal.SIGTERM)


def _error(exc: BaseException) -> str:
    tail = "".join(traceback.format_exception(exc)[-3:]).strip()
    return f"{type(exc).__name__}: {exc}\n{tail}"


def _timeout_text(timeout_s: float, how: str) -> str:
    return f"timeout: stopped after {timeout_s:g}s ({how})"


def run_call(
    fn: Callable[[Any], Any],
    arg: Any,
    timeout_s: float | None = None,
    control: CallControl | None = None,
) -> CallOutcome:
    """Call ``fn(arg)``; see the module doc."""
    t0 = time.monotonic()
    error, timed_out = "", False
    ctl = control or CallControl()
    if ctl.killed:  # stopped before it started: it does not run at all
        return CallOutcome(False, _killed_text(ctl.killed), 0, 0.0)
    if is_async(fn):
        error, timed_out = _run_async(fn, arg, timeout_s, ctl)
    elif timeout_s:
        error, timed_out = _run_forked(fn, arg, timeout_s, ctl)
    else:
        try:
            fn(arg)
        except BaseException as exc:  # noqa: BLE001 - a handler's failure is the run's
            error = _error(exc)
    dur = time.monotonic() - t0
    return CallOutcome(not error, error, int(dur * 1000), dur, timed_out)


def _run_async(
    fn: Callable[[Any], Any], arg: Any, timeout_s: float | None, ctl: CallControl
) -> tuple[str, bool]:
    async def bounded() -> None:
        if timeout_s:
            async with asyncio.timeout(timeout_s):
                await fn(arg)
        else:
            await fn(arg)

    fut = asyncio.run_coroutine_threadsafe(bounded(), event_loop())
    ctl._started(fut=fut)
    try:
        fut.result()
    except concurrent.futures.CancelledError:
        return _killed_text(ctl.killed or "cancelled"), False
    except TimeoutError:
        assert timeout_s
        return _timeout_text(timeout_s, "the coroutine was cancelled"), True
    except BaseException as exc:  # noqa: BLE001
        return _error(exc), False
    finally:
        ctl._ended()
    return "", False


def _run_forked(
    fn: Callable[[Any], Any], arg: Any, timeout_s: float, ctl: CallControl
) -> tuple[str, bool]:
    from rsched.runtime import proc

    r, w = os.pipe()
    # The child runs fn only once the worker told it to (after reporting it to the
    # guardian): a worker killed in between cannot leave it running unknown.
    go_r, go_w = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    # The worker's guardian (rsched.runtime.proc) kills the child's group if the
    # worker dies (kill -9, OOM) while it runs: it never outlives its worker.
    guard = proc._GUARD.begin()
    parent = os.getpid()
    with warnings.catch_warnings():  # "multi-threaded, fork() may deadlock": we call one fn
        warnings.simplefilter("ignore", DeprecationWarning)
        # SIGTERM held back until the child has its own handler (a terminate() right
        # after the fork must not run the worker's handler in the child)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            pid = os.fork()
        except BaseException:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            raise
    if pid != 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    if pid == 0:  # the child: run, report, leave without running the parent's cleanup
        code = 0
        try:
            os.close(r)
            os.close(go_w)
            os.setpgid(0, 0)
            signal.signal(signal.SIGTERM, _terminated)  # SystemExit: finally blocks run
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            if not _wait_go(go_r, parent):
                os._exit(1)  # the worker died before it could tell its guardian
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
    os.close(go_r)
    pidfd = _pidfd(pid)
    try:
        try:
            os.setpgid(pid, pid)  # (both sides: the kill below must reach the group)
        except OSError:
            pass
        if guard is not None:
            proc._GUARD.started(guard[0], pid)
        ctl._started(pid=pid)
        try:
            os.write(go_w, b"1")
        except OSError:
            pass
        os.close(go_w)
        deadline = time.monotonic() + timeout_s
        chunks: list[bytes] = []
        done = False
        # The child's exit is seen on its pidfd (Linux): the pipe's EOF alone can come
        # late, when a sibling forked meanwhile by another worker thread holds a copy
        # of its write end.
        watch = [r] if pidfd is None else [r, pidfd]
        os.set_blocking(r, pidfd is None)
        while not done:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select(watch, [], [], left)
            if r in ready:
                data = _read(r)
                if data:
                    chunks.append(data)
                elif data is not None:
                    done = True  # EOF: the child exited (or closed its end on the way out)
            if pidfd is not None and pidfd in ready:
                while (data := _read(r)) is not None and data:  # what it wrote before exiting
                    chunks.append(data)
                done = True
        if not done:
            _kill_group(pid, signal.SIGKILL)
            ctl._ended()
            os.waitpid(pid, 0)
            if ctl.killed:
                return _killed_text(ctl.killed), False
            return _timeout_text(timeout_s, "its process was killed"), True
        ctl._ended()
        _, status = os.waitpid(pid, 0)
    finally:
        ctl._ended()
        os.close(r)
        if pidfd is not None:
            os.close(pidfd)
        if guard is not None:
            proc._GUARD.end(guard[0])
    code = os.waitstatus_to_exitcode(status)
    if ctl.killed:
        return _killed_text(ctl.killed), False
    if code == 0:
        return "", False
    text = b"".join(chunks).decode("utf-8", "replace")
    return text or f"the handler's process ended with exit status {code}", False
