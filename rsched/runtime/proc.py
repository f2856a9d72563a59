"""Run a child command safely: an argv (never a shell), its own process group,
a timeout that kills the whole group, stderr passed through with its last
lines kept for the error record.

**Output kept (run logs).** With ``capture_bytes`` > 0 the child's stdout and
stderr are both pipes, read in chunks (``os.read``, up to 64 KiB: no waiting for
a newline, so progress output passes as it comes) by one thread per stream,
copied to the runner's own stdout/stderr as before (journald keeps them), and
the last ``capture_bytes`` of each stream kept (:class:`Tail`: a bytearray cut
back to its limit when it grows past twice that, so a chatty child costs
amortised O(1) per byte and at most 2x the limit in memory). ``on_output``
gets every chunk as it is read (the live log of ``rsched logs --follow``).
The error record's stderr tail (20 lines, 4,000 characters) is cut from the
kept stderr. With ``capture_bytes`` 0 stdout is inherited, as before.

Used by task handlers (`run consumer`), cron jobs (`run cron`), `exec` and
`run expired`, through :mod:`rsched.runtime.handlers` (the one handler runner).

**A child never outlives a runner that is killed (Linux).** When the rsched
process dies without cleaning up (``kill -9``, the OOM killer), the children it
was running would go on, orphaned, and overlap the retry of their task on
another consumer or the next cron run on another host. So, on Linux, the first
child a process starts also starts one *guardian* for that process: a small
Python process (``python -I -S -c``, standard library only, its own session,
SIGTERM/SIGINT/SIGHUP ignored) that reads one pipe from the runner and holds no
other link to it. Around every child the runner writes to the pipe:

* ``+SEQ`` before forking: a child is about to start;
* ``=SEQ PGID`` once it runs (its own process group; its pid);
* ``-SEQ`` once it has been waited for.

Each child gets ``RSCHED_GUARD=<runner nonce>.<SEQ>`` in its environment.
When the runner's process dies, however it dies, the kernel closes the pipe
and the guardian reads end-of-file: it SIGKILLs the process group of every
child still running, then scans ``/proc/*/environ`` for processes carrying the
marker of one of those children. The scan covers a child that exec'd but was
not reported yet and descendants that left the group (``setsid``) but kept the
environment. A child forked in the instant the runner died, between ``+`` and
its exec, carries no marker yet: until its exec its ``/proc/PID/environ`` is
the runner's own (whose sha256 the runner hands its guardian), and the pipe's end
of-file can come before that exec (the child closes its copy of the pipe just
before it). So when a child was still starting, the guardian also watches
every process whose environment is the runner's, for up to
:data:`GUARD_LATE_EXEC_S` (5 s), and kills the one that execs with a marker
(measured: killed within a few ms of its exec). A child whose exec comes later
than that after the runner's death runs on: the bound. Then the guardian
exits; when nothing was running it exits at once and kills nothing.

Why not ``prctl(PR_SET_PDEATHSIG)`` in the child: it needs code between fork
and exec, which means ``preexec_fn`` (not safe in a threaded parent, and it
turns off the vfork fast path) or an exec wrapper per child (a Python one
starts in 10-30 ms, against under 1 ms for a whole ``true`` task; a compiled one
must be built or installed); it fires when the forking *thread* exits, not
the process; and it only reaches the direct child, not a shell script's
children. The pipe is closed only when the last thread is gone, covers the
whole group, and costs three short pipe writes per child.

Not covered: a descendant that both left the group and dropped or rewrote its
environment (a double-forked daemon with a clean environment); a child left
behind by a task that already finished (it was not rsched's to kill before
either); the guardian itself killed along with the runner (``kill -9`` of the
whole cgroup, where nothing is orphaned anyway). Elsewhere than Linux children
are not guarded (the behaviour before): a killed runner's child runs on.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from rsched.core.errors import BadInput

#: Lines of stderr kept for history / dead-letter records.
STDERR_TAIL_LINES = 20
STDERR_TAIL_BYTES = 4000
#: Bytes of each stream a run keeps by default (``[logs] max_bytes``).
DEFAULT_CAPTURE_BYTES = 64 * 1024
#: One read of a child's pipe.
READ_CHUNK = 65536


class Tail:
    """The last ``limit`` bytes written to a stream, and whether more came."""

    __slots__ = ("limit", "_buf", "total")

    def __init__(self, limit: int):
        self.limit = max(0, int(limit))
        self._buf = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        if not self.limit:
            return
        self._buf += data
        if len(self._buf) > 2 * self.limit:
            del self._buf[: len(self._buf) - self.limit]

    @property
    def data(self) -> bytes:
        return bytes(self._buf[-self.limit :]) if self.limit else b""

    @property
    def truncated(self) -> bool:
        return self.total > self.limit


def split_command(command: str | Sequence[str], field: str = "command") -> list[str]:
    """A command string is split like a shell would (shlex), never run by one."""
    if isinstance(command, str):
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise BadInput(field, f"{command!r} cannot be split into arguments ({exc})") from None
    else:
        argv = [str(a) for a in command]
    if not argv or not argv[0]:
        raise BadInput(field, "is empty; give the program to run and its arguments")
    return argv


# --------------------------------------------------------------------------- guardian

#: The marker every guarded child gets in its environment: ``<runner nonce>.<seq>``.
GUARD_ENV = "RSCHED_GUARD"

_GUARDIAN_SRC_ENV = "RSCHED_GUARDIAN_SOURCE"

#: Seconds a write to a stalled guardian may block before it is replaced.
GUARD_STALL_S = 5.0
#: After the runner died, how long its guardian waits for a child that was forked
#: but had not exec'd yet (normally well under a millisecond) to exec and be killed.
GUARD_LATE_EXEC_S = 5.0

#: The guardian (standard library only: it runs with ``python -I -S``), passed in its
#: environment so that ``ps`` shows ``... rsched-guardian RUNNER_PID NONCE``. argv:
#: the runner's pid and nonce; stdin: the runner's pipe. See the module doc.
_GUARDIAN_SRC = r"""
import hashlib, os, select, signal, sys, time
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
runner, nonce, late_s = sys.argv[2], sys.argv[3].encode(), float(sys.argv[4])
# sha256 of the runner's /proc/PID/environ: what a child it forked shows until its
# exec (see "late" below); measured by the runner itself, which may be gone by now.
runner_env = sys.argv[5]
live = {}
# Woken only by POLLHUP (the runner's pipe closed: events=0 asks for nothing else)
# and every 100 ms to drain the pipe: not once per message.
os.set_blocking(0, False)
hup = select.poll()
hup.register(0, 0)
buf = b""
eof = False
while not eof:
    hup.poll(100)
    while True:
        try:
            chunk = os.read(0, 65536)
        except BlockingIOError:
            break
        if not chunk:
            eof = True
            break
        *lines, buf = (buf + chunk).split(b"\n")
        for line in lines:
            op, rest = line[:1], line[1:].split()
            if not rest:
                continue
            if op == b"+":
                live[rest[0]] = 0
            elif op == b"=" and len(rest) == 2:
                live[rest[0]] = int(rest[1])
            elif op == b"-":
                live.pop(rest[0], None)
if not live:
    sys.exit(0)
for pgid in set(live.values()):
    if pgid > 1:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
want = {b"RSCHED_GUARD=" + nonce + b"." + seq for seq in live}
me = os.getpid()


def environ(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            return f.read()
    except OSError:
        return None


def runners(env):
    return bool(runner_env) and hashlib.sha256(env).hexdigest() == runner_env


def execing(pid):  # no environment: mid-exec, unless a kernel thread or a zombie
    try:
        with open("/proc/%d/stat" % pid) as f:
            state, ppid = f.read().rsplit(") ", 1)[1].split()[:2]
    except (OSError, IndexError, ValueError):
        return False
    return state not in "ZX" and int(ppid) not in (0, 2)  # 2: kthreadd


def kill_marked(pid, env):
    if not any(kv in want for kv in env.split(b"\0")):
        return
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


late = []  # forked by the runner, not yet exec'd: their environ is still the runner's
for d in os.listdir("/proc"):
    if not d.isdigit() or int(d) == me or d == runner:
        continue
    env = environ(int(d))
    if env is None:
        continue
    if runners(env) or env == b"" and execing(int(d)):
        late.append(int(d))
    else:
        kill_marked(int(d), env)
# A child forked in the instant the runner died ("+" came, "=" did not) gets its
# marker only with its exec, which may come after the scan above: watch the
# processes still showing the runner's environment until they exec (late_s at most).
if late and 0 in live.values():
    deadline = time.monotonic() + late_s
    while late and time.monotonic() < deadline:
        time.sleep(0.002)
        for pid in list(late):
            env = environ(pid)
            if env == b"" or env is not None and runners(env):
                continue  # not exec'd yet, or in the middle of it (no environment yet)
            late.remove(pid)
            if env is not None:
                kill_marked(pid, env)
try:
    sys.stderr.write(
        "rsched: runner pid %s is gone with %d child(ren) running: killed them and their "
        "process groups\n" % (runner, len(live))
    )
    sys.stderr.flush()
except (OSError, ValueError):
    pass
"""


def _environ_digest() -> str:
    """sha256 of this process's ``/proc/self/environ`` (what a child it forks shows
    until its exec), for the guardian; "" when it cannot be read."""
    import hashlib

    try:
        with open("/proc/self/environ", "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        return ""


def _guard_supported() -> bool:
    """Linux, and not turned off with ``RSCHED_GUARDIAN=off`` (for a supervisor that
    already kills the whole service, e.g. systemd's ``KillMode=control-group``)."""
    if os.environ.get("RSCHED_GUARDIAN", "").strip().lower() in ("off", "0", "no", "false"):
        return False
    return sys.platform.startswith("linux") and bool(sys.executable)


class _Guardian:
    """This process's guardian: started with the first child, replaced if it dies."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._owner = 0  # the pid the state belongs to (a fork starts over)
        self._fd = -1  # write end of the pipe (close-on-exec: no child inherits it)
        self._pid = 0  # the guardian's pid
        self._nonce = ""
        self._seq = 0
        self._live: dict[int, int] = {}  # seq -> pgid (0: forking)
        self._off = not _guard_supported()
        self._warned = False

    def after_fork_in_child(self) -> None:
        """A forked copy of this process: the parent's guardian and children are not
        ours. Forget them (without writing to, or closing, the parent's pipe for it)."""
        fd = self._fd
        self._reset()
        if fd >= 0:
            try:
                os.close(fd)  # our copy only; the parent keeps its own
            except OSError:
                pass

    # -- the runner's side of the protocol

    def begin(self) -> tuple[int, str] | None:
        """Before forking: ``(seq, marker)``, or None when children are not guarded."""
        if self._off:
            return None
        with self._lock:
            if self._owner != os.getpid() and not self._start():
                return None
            self._seq += 1
            seq = self._seq
            self._live[seq] = 0
            self._send(b"+%d\n" % seq)
            return seq, f"{self._nonce}.{seq}"

    def started(self, seq: int, pgid: int) -> None:
        with self._lock:
            if seq in self._live and self._owner == os.getpid():
                self._live[seq] = pgid
                self._send(b"=%d %d\n" % (seq, pgid))

    def end(self, seq: int) -> None:
        with self._lock:
            if self._live.pop(seq, None) is not None and self._owner == os.getpid():
                self._send(b"-%d\n" % seq)

    # -- internals (called with the lock held)

    def _start(self) -> bool:
        r, w = os.pipe()  # both close-on-exec
        # One nonce for this process: a replacement guardian finds the children that
        # started under the one before it.
        nonce = self._nonce or secrets.token_hex(8)
        env = {k: v for k, v in os.environ.items() if k != GUARD_ENV}
        env[_GUARDIAN_SRC_ENV] = _GUARDIAN_SRC
        boot = f"import os; exec(os.environ.pop({_GUARDIAN_SRC_ENV!r}))"
        try:
            pid = os.posix_spawn(
                sys.executable,
                [
                    sys.executable,
                    "-I",
                    "-S",
                    "-c",
                    boot,
                    "rsched-guardian",
                    str(os.getpid()),
                    nonce,
                    str(GUARD_LATE_EXEC_S),
                    _environ_digest(),
                ],
                env,
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, r, 0),
                    (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                ],
                setsid=True,  # a kill of the runner's process group spares it
            )
        except (OSError, NotImplementedError) as exc:  # NotImplementedError: no setsid
            os.close(r)
            os.close(w)
            self._give_up(f"cannot start the child guardian ({exc})")
            return False
        os.close(r)
        os.set_blocking(w, False)
        try:  # room for ~25 s of messages at 1,000 children/s should it lag
            fcntl.fcntl(w, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
        except OSError:
            pass
        self._fd, self._pid, self._nonce, self._owner = w, pid, nonce, os.getpid()
        return True

    def _send(self, msg: bytes) -> None:
        if self._write(msg):
            return
        # The guardian died (or stalls): replace it and tell the new one what runs.
        self._retire()
        if not self._start():
            return
        for seq, pgid in self._live.items():
            line = b"+%d\n" % seq + (b"=%d %d\n" % (seq, pgid) if pgid else b"")
            if not self._write(line):
                self._retire()
                self._give_up("the child guardian keeps failing")
                return

    def _write(self, msg: bytes) -> bool:
        deadline = time.monotonic() + GUARD_STALL_S
        while msg:
            try:
                n = os.write(self._fd, msg)
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                select.select([], [self._fd], [], left)
                continue
            except OSError:  # EPIPE: the guardian is gone
                return False
            msg = msg[n:]
        return True

    def _retire(self) -> None:
        """Kill the current guardian *before* closing its pipe: closing first would
        read as "the runner died" and kill the running children."""
        if self._pid:
            try:
                os.kill(self._pid, signal.SIGKILL)
                os.waitpid(self._pid, 0)
            except (ChildProcessError, ProcessLookupError):
                pass
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._pid, self._owner = -1, 0, 0

    def _give_up(self, why: str) -> None:
        self._off = True
        if not self._warned:
            self._warned = True
            try:
                sys.stderr.write(
                    f"rsched: warning: {why}; children of this process are not killed if it dies\n"
                )
                sys.stderr.flush()
            except (OSError, ValueError):
                pass


_GUARD = _Guardian()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_GUARD.after_fork_in_child)


@dataclass
class ChildResult:
    exit_code: int  # the child's status; 128+N when killed by signal N (as a shell reports it)
    timed_out: bool
    killed: str | None  # why rsched killed it: "timeout", "lock lost", "shutdown", "replaced"
    stderr_tail: str
    duration_ms: int
    #: the kept tails of both streams (b"" when not captured) and whether either was cut
    stdout: bytes = b""
    stderr: bytes = b""
    truncated: bool = False
    captured: bool = field(default=False)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.killed

    def describe(self) -> str:
        return describe(self.exit_code, self.killed, self.stderr_tail)


def describe(exit_code: int, killed: str | None, stderr_tail: str) -> str:
    """How a child ended, for an error record: ``exit status N: TAIL`` or
    ``killed (REASON): TAIL``."""
    why = f"killed ({killed})" if killed else f"exit status {exit_code}"
    tail = stderr_tail.strip()
    return f"{why}: {tail}" if tail else why


class Child:
    """One running child process in its own process group."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        stdin_data: bytes | None = None,
        cwd: str | None = None,
        pass_stderr: bool = True,
        stdout: int | None = None,
        capture_bytes: int = 0,
        on_output: Callable[[str, bytes], None] | None = None,
        pass_fds: Sequence[int] = (),
    ):
        self.argv = list(argv)
        self._tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self._capture = capture_bytes > 0
        self._on_output = on_output
        #: the kept tails (run logs); stderr's is also where the error tail is cut from
        self.out_tail = Tail(capture_bytes)
        self.err_tail = Tail(max(capture_bytes, STDERR_TAIL_BYTES))
        self.killed: str | None = None
        self._pass = pass_stderr
        self.started = time.monotonic()
        guard = _GUARD.begin()
        self._guard_seq = guard[0] if guard else 0
        penv = dict(env) if env is not None else None
        if guard:
            penv = dict(os.environ) if penv is None else penv
            penv[GUARD_ENV] = guard[1]
        try:
            self.popen = subprocess.Popen(
                self.argv,
                env=penv,
                stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE if self._capture else stdout,
                stderr=subprocess.PIPE,
                cwd=cwd,
                start_new_session=True,  # own process group: a timeout kills the whole tree
                close_fds=True,
                pass_fds=tuple(pass_fds),
            )
        except BaseException as exc:
            self._unguard()
            if not isinstance(exc, OSError):
                raise
            self.popen = None  # type: ignore[assignment]
            self._spawn_error = f"cannot start {self.argv[0]!r}: {exc.strerror or exc}"
            return
        if self._guard_seq:
            _GUARD.started(self._guard_seq, self.popen.pid)
        self._spawn_error = ""
        if self._capture:
            self._reader = threading.Thread(target=self._read_chunks, args=("stderr",), daemon=True)
            self._out_reader: threading.Thread | None = threading.Thread(
                target=self._read_chunks, args=("stdout",), daemon=True
            )
            self._out_reader.start()
        else:
            self._reader = threading.Thread(target=self._read_stderr, daemon=True)
            self._out_reader = None
        self._reader.start()
        if stdin_data is not None:
            threading.Thread(target=self._write_stdin, args=(stdin_data,), daemon=True).start()

    def _unguard(self) -> None:
        if self._guard_seq:
            _GUARD.end(self._guard_seq)
            self._guard_seq = 0

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def _write_stdin(self, data: bytes) -> None:
        assert self.popen.stdin is not None
        try:
            self.popen.stdin.write(data)
        except (BrokenPipeError, OSError):
            pass
        finally:
            try:
                self.popen.stdin.close()
            except OSError:
                pass

    def _read_stderr(self) -> None:
        assert self.popen.stderr is not None
        out = sys.stderr.buffer if self._pass else None
        for line in iter(self.popen.stderr.readline, b""):
            if out is not None:
                try:
                    out.write(line)
                    out.flush()
                except (OSError, ValueError):
                    pass
            self._tail.append(line.decode("utf-8", "replace").rstrip("\n"))
        self.popen.stderr.close()

    def _read_chunks(self, name: str) -> None:
        """One stream of a captured child: pass it through, keep its tail, tell on_output."""
        pipe = self.popen.stdout if name == "stdout" else self.popen.stderr
        assert pipe is not None
        tail = self.out_tail if name == "stdout" else self.err_tail
        std = sys.stdout if name == "stdout" else sys.stderr
        out = getattr(std, "buffer", None) if (name == "stdout" or self._pass) else None
        fd = pipe.fileno()
        while True:
            try:
                data = os.read(fd, READ_CHUNK)
            except OSError:
                break
            if not data:
                break
            if out is not None:
                try:
                    out.write(data)
                    out.flush()
                except (OSError, ValueError):
                    pass
            tail.add(data)
            if self._on_output is not None:
                try:
                    self._on_output(name, data)
                except Exception:  # noqa: BLE001 - a live log never stops the run
                    pass
        pipe.close()

    def poll(self) -> int | None:
        if self.popen is None:
            return 127
        return self.popen.poll()

    def signal_group(self, sig: int) -> None:
        if self.popen is None:
            return
        try:
            os.killpg(self.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, reason: str, grace_s: float = 5.0) -> None:
        """SIGTERM the process group, then SIGKILL it after ``grace_s``."""
        if self.popen is None or self.killed:
            return
        self.killed = reason
        self.signal_group(signal.SIGTERM)
        try:
            self.popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        self.signal_group(signal.SIGKILL)

    def wait(self, timeout_s: float | None = None, grace_s: float = 5.0) -> ChildResult:
        """Wait for the child; past ``timeout_s`` kill its group (reason "timeout")."""
        if self.popen is None:
            return ChildResult(127, False, None, self._spawn_error, 0)
        timed_out = False
        try:
            self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            self.stop("timeout", grace_s)
            self.popen.wait()
        # The group may hold the stderr pipe open after the leader exits.
        readers = [t for t in (self._reader, self._out_reader) if t is not None]
        for t in readers:
            t.join(timeout=1.0)
        if any(t.is_alive() for t in readers):
            self.signal_group(signal.SIGKILL)
            for t in readers:
                t.join(timeout=1.0)
        self._unguard()  # waited for: no longer the guardian's to kill
        rc = self.popen.returncode
        code = 128 - rc if rc < 0 else rc
        dur = int((time.monotonic() - self.started) * 1000)
        if not self._capture:
            tail = "\n".join(self._tail)[-STDERR_TAIL_BYTES:]
            return ChildResult(code, timed_out, self.killed, tail, dur)
        err = self.err_tail.data
        lines = err.decode("utf-8", "replace").rstrip("\n").split("\n")
        tail = "\n".join(lines[-STDERR_TAIL_LINES:])[-STDERR_TAIL_BYTES:]
        limit = self.out_tail.limit
        return ChildResult(
            code,
            timed_out,
            self.killed,
            tail,
            dur,
            stdout=self.out_tail.data,
            stderr=err[-limit:],
            truncated=self.out_tail.truncated or self.err_tail.total > limit,
            captured=True,
        )


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    stdin_data: bytes | None = None,
    timeout_s: float | None = None,
    grace_s: float = 5.0,
    cwd: str | None = None,
) -> ChildResult:
    return Child(argv, env=env, stdin_data=stdin_data, cwd=cwd).wait(timeout_s, grace_s)


#: rsched's own secrets: never handed to a handler or job.
_SECRET_ENV = ("RSCHED_REDIS_PASSWORD", "RSCHED_SENTINEL_PASSWORD")


def child_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The child's environment: ours, minus rsched's secrets (its password
    variables, and the password inside ``RSCHED_REDIS_URL``), plus ``extra``.
    ``REDIS_URL`` is left alone: it is a common convention the job may use itself."""
    from rsched.core.config import strip_password

    env = {k: v for k, v in os.environ.items() if k not in _SECRET_ENV}
    if "RSCHED_REDIS_URL" in env:
        env["RSCHED_REDIS_URL"] = strip_password(env["RSCHED_REDIS_URL"])
    env.update(extra)
    return env
