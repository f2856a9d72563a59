"""The lease watchdog of a held lock (a library :class:`~rsched.locks.lock.Lock`,
`rsched exec`, a cron run lock).

While the lock is held (a ``with`` block, a command, a job), a thread renews the lease every
TTL/3. The lease runs, at the latest, from the moment the last renewal that
succeeded was *sent* (the server set the new expiry after that), so the
holder knows, by its own monotonic clock, the earliest moment another client
can take the lock: that send time plus the TTL. The watchdog declares the
lock *lost* a margin before it (:func:`loss_margin_ms`: a fifth of the TTL,
100 ms to 2 s), whatever the network does: each renewal runs in a helper
thread and the watchdog waits for its answer only until that moment, so a
renewal stuck behind a partition (a socket timeout of 10 s, a TCP
retransmission, a half-open connection) cannot delay the verdict. Then
:attr:`~rsched.locks.lock.Lock.lost` is set and ``on_lost`` is called, so that the work can
stop; ``rsched exec`` and ``rsched run cron`` stop their job then, with a
SIGKILL no later than half the margin before the lease can have expired
(:meth:`Watchdog.stop_grace`). A renewal that answers "not yours" (expired,
or taken away with ``rsched unlock``) is a loss at once. Measured under a
partition (a proxy that stops forwarding): TTL 1 s lost 0.80 s, 2 s lost
1.60 s, 30 s lost 28.0 s after the last renewal that went through.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from rsched.core import errors

#: ``renew()``'s answer when the lock it renewed was garbage-collected.
GONE = -1
#: A wake-up wait that got no answer this long after its timeout is abandoned.
#: A wake-up wait that got no answer this long after its timeout is abandoned.
WAIT_SLACK_S = 0.5
#: The shortest timeout given to a blocking command (Redis reads 0 as "forever").
MIN_BLOCK_S = 0.01


def run_result(lost: bool, timed_out: bool, ok: bool) -> str:
    """The history ``result`` of a command run under a lock (``exec``, a cron job):
    ``lost`` (the lease was lost meanwhile), ``timeout``, ``ok`` or ``failed``."""
    if lost:
        return "lost"
    if timed_out:
        return "timeout"
    return "ok" if ok else "failed"


def loss_margin_ms(ttl_ms: int) -> int:
    """How long before the lease can have expired the watchdog declares it lost:
    a fifth of the TTL, at least 100 ms and at most 2 s."""
    return min(max(int(ttl_ms) // 5, 100), 2000)


class _Call:
    """One call run in a helper thread, so that its caller can stop waiting for it."""

    def __init__(self, fn: Callable[[], Any], kick: threading.Event, name: str):
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None
        self._fn = fn
        self._kick = kick
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        try:
            self.result = self._fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            self.error = exc
        finally:
            self.done = True
            self._kick.set()


class Watchdog:
    """Renews a lease every ``ttl/3`` in a daemon thread (see the module doc).

    ``renew()`` returns 1 (renewed), 0 (lost), 2 (renewed, but the holder was
    asked to stop) or :data:`GONE` (the lock object is gone: stop quietly). It
    runs in a helper thread; Redis errors are retried quickly. The lease is
    declared lost at :attr:`lost_at`: the send time of the last renewal that
    succeeded (or of the acquisition, given to :meth:`start`) plus the TTL
    minus :func:`loss_margin_ms`, by the local monotonic clock (which also
    covers a process that was SIGSTOPped), even while a renewal hangs.

    ``wait(timeout_s)``, when given, replaces the sleep between renewals: it
    blocks up to ``timeout_s`` and may return early (a wake-up, such as a
    ``BZPOPMIN`` on a key another process pushes to when it asks the holder to
    stop), after which the watchdog renews at once. It runs in a helper thread
    too (a wait that hangs past its timeout is abandoned). Whoever ends the run
    makes it return; :meth:`stop` never waits for it.
    """

    def __init__(
        self,
        renew: Callable[[], int],
        ttl_ms: int,
        *,
        on_lost: Callable[[str], None] | None = None,
        on_cancel: Callable[[], None] | None = None,
        name: str = "watchdog",
        wait: Callable[[float], object] | None = None,
    ):
        self._renew = renew
        self._wait = wait
        self.ttl_ms = ttl_ms
        self.margin_ms = loss_margin_ms(ttl_ms)
        self.on_lost = on_lost
        self.on_cancel = on_cancel
        self.name = name
        self.lost = threading.Event()
        self.lost_reason = ""
        #: Monotonic time the loss was declared (None while not lost).
        self.lost_time: float | None = None
        self.cancelled = threading.Event()
        self._stop = threading.Event()
        self._kick = threading.Event()  # set by stop() and by each helper call's end
        self._last_ok = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self, since: float | None = None) -> Watchdog:
        """Start renewing; ``since``: the monotonic time the acquisition was sent
        (default: now, which is later than the truth)."""
        self._last_ok = time.monotonic() if since is None else since
        self._thread.start()
        return self

    def stop(self, join: bool = True) -> None:
        self._stop.set()
        self._kick.set()
        if join:
            self.join(5)

    def join(self, timeout: float) -> None:
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    @property
    def last_ok(self) -> float:
        """Monotonic send time of the last renewal that succeeded (or of the acquisition)."""
        return self._last_ok

    @property
    def expires_at(self) -> float:
        """Monotonic time from which another client may hold the lock."""
        return self._last_ok + self.ttl_ms / 1000

    @property
    def lost_at(self) -> float:
        """Monotonic time at which the lease is declared lost unless renewed."""
        return self._last_ok + (self.ttl_ms - self.margin_ms) / 1000

    def stop_grace(self, grace_s: float) -> float:
        """The grace a job stopped for a lost lease may get: ``grace_s``, cut so
        that the SIGKILL after it comes half the margin before :attr:`expires_at`."""
        left = self.expires_at - self.margin_ms / 2000 - time.monotonic()
        return max(0.0, min(grace_s, left))

    def _call(self, fn: Callable[[], Any], until: float) -> _Call | None:
        """Run ``fn`` in a helper thread; the call, or None when it had not
        returned by ``until`` (monotonic) or the watchdog was stopped."""
        self._kick.clear()
        call = _Call(fn, self._kick, self.name + "-call")
        while True:
            if call.done:
                return call
            left = until - time.monotonic()
            if left <= 0 or self._stop.is_set():
                return None
            self._kick.wait(left)
            self._kick.clear()

    def _sleep(self, wait: float) -> bool:
        """Wait until the next renewal; True when the watchdog is stopped."""
        if self._wait is None or wait < MIN_BLOCK_S:
            # (a blocking command's timeout that rounds down to 0 ms would block forever)
            return self._stop.wait(wait)
        if self._stop.is_set():
            return True
        t0 = time.monotonic()
        waiter = self._wait
        until = min(t0 + wait + WAIT_SLACK_S, self.lost_at)
        call = self._call(lambda: waiter(wait), until)
        if call is not None and call.error is not None:
            # Redis trouble: the renewal below deals with it
            self._stop.wait(max(0.0, min(wait, 0.25) - (time.monotonic() - t0)))
        return self._stop.is_set()

    def _lose(self, reason: str) -> None:
        if self.lost.is_set() or self._stop.is_set():
            return
        self.lost_reason = reason
        self.lost_time = time.monotonic()
        self.lost.set()
        if self.on_lost:
            self.on_lost(reason)

    def _deadline_passed(self) -> str:
        return (
            f"no renewal got through for {self.ttl_ms - self.margin_ms} ms "
            f"(Redis unreachable or too slow); the {self.ttl_ms} ms lease may expire "
            f"{self.margin_ms} ms later"
        )

    def _run(self) -> None:
        interval = max(self.ttl_ms / 3000.0, 0.05)
        wait = interval
        while not self._sleep(max(0.0, min(wait, self.lost_at - time.monotonic()))):
            # Local check first: after a SIGSTOP / long pause the lease may be gone.
            if time.monotonic() >= self.lost_at:
                self._lose(self._deadline_passed())
                return
            sent = time.monotonic()  # the new lease runs from (at the latest) now
            call = self._call(self._renew, self.lost_at)
            if self._stop.is_set():
                return
            if call is None:  # no answer in time: the renewal hangs (a partition?)
                self._lose(self._deadline_passed())
                return
            if call.error is not None:
                if isinstance(call.error, redis.RedisError | errors.RedisUnavailable | OSError):
                    wait = min(interval, 0.25)  # retry soon; give up at lost_at
                    continue
                self._lose(f"renewal failed: {call.error}")  # never die silently
                return
            st = call.result
            if st == GONE:
                return
            if st == 0:
                self._lose("the lock expired or was taken by another owner")
                return
            self._last_ok = sent
            wait = interval
            if st == 2 and not self.cancelled.is_set():
                self.cancelled.set()
                if self.on_cancel:
                    self.on_cancel()
