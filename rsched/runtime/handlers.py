"""Run a handler: the one runner of a command (and of a Python callable) that
every loop uses.

A **command** (:class:`Command`: argv, never a shell; ``RSCHED_*`` variables
added to our environment minus rsched's secrets, :func:`~rsched.runtime.proc.child_env`;
bytes on stdin; a timeout; the grace between SIGTERM and SIGKILL) runs as a
:class:`HandlerRun` on :class:`rsched.runtime.proc.Child`: its own process
group (a timeout, a lost lease or lock, a shutdown kill the whole group), its
stderr passed through with the last lines kept, guarded against outliving a
killed runner. Another thread controls a run at any time, before it started
too (the request is then applied as it starts: "cancelled while starting"):

* :meth:`HandlerRun.kill`: SIGKILL the group now (a lost lease, the end of a
  shutdown grace);
* :meth:`HandlerRun.terminate`: SIGTERM the group (``rsched cancel`` of a running
  task; the caller SIGKILLs it later);
* :meth:`HandlerRun.stop`: SIGTERM, then SIGKILL after the grace (blocks for
  the grace: cron's replace and lock lost, ``exec``'s signals);

the first reason given is the one recorded (``killed``). :meth:`HandlerRun.wait`
returns an :class:`Outcome`: exit code (128+N after signal N), whether the
timeout killed it, why rsched killed it, the stderr tail, the duration, and the
result classified the one way every record uses: ``lost`` (the caller says so:
its lease or lock went meanwhile) > ``timeout`` > ``ok`` (exit 0, not killed) >
``failed``, with :attr:`Outcome.error` the text for the history record.

**Run logs.** Every command's stdout and stderr are kept (the last
``Command.log_bytes`` of each, ``[logs] max_bytes``, 64 KiB by default) and still
copied to the runner's own stdout/stderr; :attr:`Outcome.stdout`,
:attr:`Outcome.stderr`, :attr:`Outcome.truncated`. :class:`LiveLog` (given as
``Command.on_output``'s owner by :func:`live_log`) appends what the run writes,
while it runs, to the run's live stream (chunks flushed every second or per
16 KiB, capped), which ``rsched logs --follow`` reads from any host;
:func:`store_log` writes the finished run's log next to its history record
(``log-put-3``: same hash slot, trimmed with the history's cap).

**Progress.** A command given ``Command.on_progress`` gets the write end of a
pipe, its number in ``RSCHED_PROGRESS_FD``; each line it writes there,
``FRACTION MESSAGE`` (0 <= FRACTION <= 1; the message optional, at most
:data:`PROGRESS_MESSAGE_MAX` characters kept), is told to ``on_progress``; other
lines are ignored. :class:`ProgressWriter` writes reports to Redis at most one per
:data:`PROGRESS_EVERY_S` (the latest wins; never failing the run).

A **Python callable** (:func:`call`) gets its argument, returning is ok,
raising is failed with the exception and the last lines of its traceback as
the error; with a timeout it runs through :mod:`rsched.runtime.pycall`
(forked and killed, or cancelled when async).

Used by ``run consumer`` (command and Python handlers) and ``run expired``;
cron's job run and ``exec`` build a :class:`Command` the same way.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rsched.runtime.proc import DEFAULT_CAPTURE_BYTES, Child, ChildResult, child_env, describe

if TYPE_CHECKING:  # pragma: no cover
    from rsched.context import Context


@dataclass(frozen=True, slots=True)
class Command:
    """What to run: ``argv`` (never through a shell), ``env`` added to ours
    (minus rsched's secrets), ``stdin`` (None: /dev/null), the timeout after
    which the group is killed (None: none) and the grace of :meth:`HandlerRun.stop`."""

    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    stdin: bytes | None = None
    timeout_s: float | None = None
    grace_s: float = 5.0
    #: bytes of each stream kept for the run log (0: stdout inherited, not kept)
    log_bytes: int = DEFAULT_CAPTURE_BYTES
    #: told every chunk of output as it is read: ("stdout" | "stderr", bytes)
    on_output: Callable[[str, bytes], None] | None = None
    #: told each progress line the command writes to RSCHED_PROGRESS_FD
    on_progress: Callable[[float, str], None] | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a run ended (see the module doc for :attr:`result`)."""

    exit_code: int
    timed_out: bool
    killed: str | None
    stderr_tail: str
    duration_ms: int
    #: False when the program could not even be started (the tail says why)
    started: bool = True
    #: the kept output (run log): the tail of each stream, and whether either was cut
    stdout: bytes = b""
    stderr: bytes = b""
    truncated: bool = False
    #: whether the output was captured (a run log exists for it)
    captured: bool = False

    @classmethod
    def of(cls, res: ChildResult, started: bool = True) -> Outcome:
        return cls(
            res.exit_code,
            res.timed_out,
            res.killed,
            res.stderr_tail,
            res.duration_ms,
            started,
            res.stdout,
            res.stderr if started else res.stderr_tail.encode(),
            res.truncated,
            res.captured or not started,
        )

    @property
    def has_log(self) -> bool:
        """Captured, and it wrote something: a run that wrote nothing keeps no log."""
        return self.captured and bool(self.stdout or self.stderr)

    def log_json(self) -> str:
        """The run log as ``log-put-3`` stores it: ``{"stdout", "stderr", "truncated"}``."""
        return log_json(self.stdout, self.stderr, self.truncated)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.killed

    @property
    def result(self) -> str:
        """``timeout`` | ``ok`` | ``failed``."""
        return "timeout" if self.timed_out else "ok" if self.ok else "failed"

    def classify(self, lost: bool = False) -> str:
        """:attr:`result`, or ``lost`` when the caller's lease or lock went meanwhile."""
        return "lost" if lost else self.result

    @property
    def error(self) -> str:
        """``exit status N: TAIL`` / ``killed (REASON): TAIL``; "" when ok."""
        return "" if self.ok else self.describe()

    def describe(self) -> str:
        return describe(self.exit_code, self.killed, self.stderr_tail)


class HandlerRun:
    """One run of a :class:`Command`; see the module doc."""

    def __init__(self, command: Command):
        self.command = command
        self._lock = threading.Lock()
        self._child: Child | None = None
        #: requested before the start: ("kill" | "term" | "stop", reason, grace)
        self._pending: tuple[str, str, float] | None = None

    @property
    def child(self) -> Child | None:
        return self._child

    @property
    def pid(self) -> int | None:
        c = self._child
        return c.pid if c is not None else None

    @property
    def running(self) -> bool:
        c = self._child
        return c is not None and c.popen is not None and c.poll() is None

    def start(self) -> HandlerRun:
        cmd = self.command
        env: dict[str, str] = dict(cmd.env)
        fds: tuple[int, ...] = ()
        if cmd.on_progress is not None:
            rfd, wfd = os.pipe()
            env[PROGRESS_FD_ENV], fds = str(wfd), (wfd,)
        with self._lock:
            try:
                self._child = Child(
                    cmd.argv,
                    env=child_env(env),
                    stdin_data=cmd.stdin,
                    capture_bytes=cmd.log_bytes,
                    on_output=cmd.on_output,
                    pass_fds=fds,
                )
            finally:
                if fds:
                    os.close(fds[0])
            pending, self._pending = self._pending, None
        if cmd.on_progress is not None:
            args = (rfd, cmd.on_progress)
            threading.Thread(target=_read_progress, args=args, daemon=True).start()
        if pending is not None:
            how, reason, grace = pending
            if how == "kill":
                self.kill(reason)
            elif how == "term":
                self.terminate(reason)
            else:
                self.stop(reason, grace)
        return self

    def _request(self, how: str, reason: str, grace_s: float = 0.0) -> Child | None:
        """The running child, or None (and the request kept for the start)."""
        with self._lock:
            c = self._child
            if c is None:
                if self._pending is None or how == "kill":
                    self._pending = (how, reason, grace_s)
                return None
        return c

    def kill(self, reason: str) -> bool:
        """SIGKILL the process group now. True if a child was running."""
        return self._signal("kill", signal.SIGKILL, reason)

    def terminate(self, reason: str) -> bool:
        """SIGTERM the process group. True if a child was running."""
        return self._signal("term", signal.SIGTERM, reason)

    def _signal(self, how: str, sig: int, reason: str) -> bool:
        c = self._request(how, reason)
        if c is None or c.popen is None or c.poll() is not None:
            return False
        c.killed = c.killed or reason
        c.signal_group(sig)
        return True

    def stop(self, reason: str, grace_s: float | None = None) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace_s`` (blocks that long at most)."""
        grace = self.command.grace_s if grace_s is None else grace_s
        c = self._request("stop", reason, grace)
        if c is not None:
            c.stop(reason, grace)

    def wait(self) -> Outcome:
        """Wait for the end (past the timeout: kill the group, reason "timeout")."""
        c = self._child
        assert c is not None, "start() first"
        cmd = self.command
        return Outcome.of(c.wait(cmd.timeout_s, cmd.grace_s), started=c.popen is not None)


# --------------------------------------------------------------------------- progress

#: The environment variable naming a command's progress file descriptor.
PROGRESS_FD_ENV = "RSCHED_PROGRESS_FD"
#: The longest progress message kept (characters), and the writes' least interval.
PROGRESS_MESSAGE_MAX = 200
PROGRESS_EVERY_S = 0.2


def check_progress(fraction: Any, message: Any = "") -> tuple[float, str]:
    """A progress report validated: (fraction 0..1, message cut to its limit)."""
    ok = isinstance(fraction, int | float) and not isinstance(fraction, bool)
    if not ok or math.isnan(fraction) or not 0 <= fraction <= 1:
        raise ValueError(f"progress: {fraction!r} is not a fraction from 0 to 1")
    if not isinstance(message, str):
        raise TypeError(f"progress: the message must be text, not {type(message).__name__}")
    return float(fraction), message[:PROGRESS_MESSAGE_MAX]


def parse_progress_line(line: bytes) -> tuple[float, str] | None:
    """``FRACTION MESSAGE`` -> (fraction, message); None for anything else."""
    text = line.decode("utf-8", "replace").strip()
    head, _, message = text.partition(" ")
    try:
        return check_progress(float(head), message.strip())
    except ValueError:
        return None


def _read_progress(rfd: int, tell: Callable[[float, str], None]) -> None:
    with os.fdopen(rfd, "rb") as f:
        for line in f:
            got = parse_progress_line(line[:4096])
            if got is not None:
                tell(*got)


class ProgressWriter:
    """Writes one run's progress reports through ``write`` (fraction, message): at
    most one per :data:`PROGRESS_EVERY_S`, a report in between written when the
    interval ends (the latest wins), errors swallowed (progress never fails a run).
    :attr:`last`: the latest report (fraction, message, time.time() ms)."""

    def __init__(self, write: Callable[[float, str], Any]):
        self._write = write
        self._lock = threading.Lock()
        self._last_write = 0.0
        self._pending: tuple[float, str] | None = None
        self._timer: threading.Timer | None = None
        self.last: tuple[float, str, int] | None = None

    def __call__(self, fraction: float, message: str = "") -> None:
        now = time.monotonic()
        with self._lock:
            self.last = (fraction, message, int(time.time() * 1000))
            wait = self._last_write + PROGRESS_EVERY_S - now
            if wait <= 0 and self._timer is None:
                self._last_write = now
            else:
                self._pending = (fraction, message)
                if self._timer is None:
                    self._timer = threading.Timer(max(wait, 0.0), self._flush)
                    self._timer.daemon = True
                    self._timer.start()
                return
        self._send(fraction, message)

    def _flush(self) -> None:
        with self._lock:
            pending, self._pending, self._timer = self._pending, None, None
            self._last_write = time.monotonic()
        if pending is not None:
            self._send(*pending)

    def close(self) -> None:
        """Write what is pending now (the run ended)."""
        with self._lock:
            timer = self._timer
        if timer is not None:
            timer.cancel()
        self._flush()

    def _send(self, fraction: float, message: str) -> None:
        try:
            self._write(fraction, message)
        except Exception:  # noqa: BLE001, S110 - a report is best effort
            pass


def run(command: Command, on_start: Callable[[HandlerRun], Any] | None = None) -> Outcome:
    """Start ``command``, tell ``on_start`` (which may keep the run to stop it from
    another thread), wait for its end."""
    r = HandlerRun(command)
    if on_start is not None:
        on_start(r)
    return r.start().wait()


@dataclass(frozen=True, slots=True)
class CallOutcome:
    ok: bool
    error: str  # "" when ok: TYPE: message, then the last lines of the traceback
    duration_ms: int
    duration_s: float
    #: stopped at its timeout (:func:`rsched.runtime.pycall.run_call`)
    timed_out: bool = False


def call(
    fn: Callable[[Any], Any], arg: Any, catch: type[BaseException] = BaseException
) -> CallOutcome:
    """Call a Python handler: returning is ok, raising (``catch``) is failed."""
    t0 = time.monotonic()
    try:
        fn(arg)
        error = ""
    except catch as exc:  # noqa: BLE001 - a handler's failure is the run's
        tail = "".join(traceback.format_exception(exc)[-3:]).strip()
        error = f"{type(exc).__name__}: {exc}\n{tail}"
    dur = time.monotonic() - t0
    return CallOutcome(not error, error, int(dur * 1000), dur)


# --------------------------------------------------------------------------- run logs

#: The live stream's flush period and size, and its cap (entries).
LIVE_FLUSH_S = 1.0
LIVE_FLUSH_BYTES = 16 * 1024
LIVE_MAXLEN = 256
#: A live stream outlives a runner that died mid-run by this much (ms).
LIVE_TTL_MS = 3_600_000


def log_json(stdout: bytes, stderr: bytes, truncated: bool) -> str:
    import json

    return json.dumps(
        {
            "stdout": stdout.decode("utf-8", "replace"),
            "stderr": stderr.decode("utf-8", "replace"),
            "truncated": bool(truncated),
        },
        separators=(",", ":"),
        ensure_ascii=False,
    )


def log_max_bytes(rs: Context) -> int:
    """``[logs] max_bytes`` of the context's settings (checked when they were read)."""
    s = rs.settings
    return int(getattr(s, "log_max_bytes", DEFAULT_CAPTURE_BYTES)) if s else DEFAULT_CAPTURE_BYTES


class LiveLog:
    """What a running command writes, appended to its live stream (``live_key``)
    every :data:`LIVE_FLUSH_S` or :data:`LIVE_FLUSH_BYTES`, from one thread; a
    Redis error drops that chunk (the finished log is written anyway)."""

    def __init__(self, client: Any, live_key: str, limit: int):
        self.client = client
        self.key = live_key
        self.limit = max(limit, 1)
        self._buf: list[tuple[str, bytes]] = []
        #: one incremental UTF-8 decoder per stream: a character cut between chunks
        #: is sent whole with the next one
        self._dec: dict[str, Any] = {}
        self._size = 0
        self._cv = threading.Condition()
        self._done = False
        #: started with the first output: a run that writes nothing costs nothing
        self._thread: threading.Thread | None = None

    def __call__(self, stream: str, data: bytes) -> None:
        with self._cv:
            if self._thread is None and not self._done:
                self._thread = threading.Thread(
                    target=self._loop, daemon=True, name="rsched-live-log"
                )
                self._thread.start()
            self._buf.append((stream, data))
            self._size += len(data)
            if self._size >= LIVE_FLUSH_BYTES:
                self._cv.notify()

    def _take(self) -> list[tuple[str, bytes]]:
        buf, self._buf, self._size = self._buf, [], 0
        return buf

    def _loop(self) -> None:
        while True:
            with self._cv:
                if not self._done and self._size < LIVE_FLUSH_BYTES:
                    self._cv.wait(LIVE_FLUSH_S)
                buf, done = self._take(), self._done
            if buf:
                self._write(buf)
            if done:
                return

    def _write(self, buf: list[tuple[str, bytes]]) -> None:
        by: dict[str, bytearray] = {}
        order: list[str] = []
        for stream, data in buf:
            if stream not in by:
                by[stream] = bytearray()
                order.append(stream)
            by[stream] += data
        try:
            pipe = self.client.pipeline(transaction=False)
            import codecs

            for stream in order:
                dec = self._dec.get(stream)
                if dec is None:
                    dec = self._dec[stream] = codecs.getincrementaldecoder("utf-8")("replace")
                text = dec.decode(bytes(by[stream][-self.limit :]))
                if not text:
                    continue
                pipe.xadd(
                    self.key,
                    {"s": stream, "d": text},
                    maxlen=LIVE_MAXLEN,
                    approximate=True,
                )
            pipe.pexpire(self.key, LIVE_TTL_MS)
            pipe.execute()
        except Exception:  # noqa: BLE001 - the live view is best effort
            pass

    def close(self) -> None:
        """Flush what is left and stop (before the finished log is stored)."""
        with self._cv:
            self._done = True
            self._cv.notify()
            t = self._thread
        if t is not None:
            t.join(5.0)


def live_log(rs: Context, live_key: str) -> LiveLog:
    return LiveLog(rs.redis, live_key, log_max_bytes(rs))


def store_log(
    rs: Context, keys: Any, token: Any, outcome: Outcome, history_maxlen: int | None = None
) -> bool:
    """Write ``outcome``'s run log under ``token`` beside its history record
    (``keys``: the run's CronKeys / LockKeys / QueueKeys). False when it was not
    captured or Redis refused (a run log never fails the run)."""
    from rsched.lua import calls

    if not outcome.has_log:
        return False
    try:
        calls.log_put(
            rs,
            keys,
            token=str(token),
            log=outcome.log_json(),
            history_maxlen=rs.history_maxlen if history_maxlen is None else history_maxlen,
        )
    except Exception:  # noqa: BLE001 - the record is written; the log is extra
        return False
    return True
