"""Run a child command safely: an argv (never a shell), its own process group,
a timeout that kills the whole group, stderr passed through with its last
lines kept for the error record.

Used by task handlers (`run consumer`), cron jobs (`run cron`) and `exec`.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rsched.errors import BadInput

#: Lines of stderr kept for history / dead-letter records.
STDERR_TAIL_LINES = 20
STDERR_TAIL_BYTES = 4000


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


@dataclass
class ChildResult:
    exit_code: int  # the child's status; 128+N when killed by signal N (as a shell reports it)
    timed_out: bool
    killed: str | None  # why rsched killed it: "timeout", "lock lost", "shutdown", "replaced"
    stderr_tail: str
    duration_ms: int

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.killed

    def describe(self) -> str:
        why = f"killed ({self.killed})" if self.killed else f"exit status {self.exit_code}"
        tail = self.stderr_tail.strip()
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
    ):
        self.argv = list(argv)
        self._tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self.killed: str | None = None
        self._pass = pass_stderr
        self.started = time.monotonic()
        try:
            self.popen = subprocess.Popen(
                self.argv,
                env=dict(env) if env is not None else None,
                stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
                stdout=stdout,
                stderr=subprocess.PIPE,
                cwd=cwd,
                start_new_session=True,  # own process group: a timeout kills the whole tree
                close_fds=True,
            )
        except OSError as exc:
            self.popen = None  # type: ignore[assignment]
            self._spawn_error = f"cannot start {self.argv[0]!r}: {exc.strerror or exc}"
            return
        self._spawn_error = ""
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        if stdin_data is not None:
            threading.Thread(target=self._write_stdin, args=(stdin_data,), daemon=True).start()

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
        self._reader.join(timeout=1.0)
        if self._reader.is_alive():
            self.signal_group(signal.SIGKILL)
            self._reader.join(timeout=1.0)
        rc = self.popen.returncode
        code = 128 - rc if rc < 0 else rc
        tail = "\n".join(self._tail)[-STDERR_TAIL_BYTES:]
        return ChildResult(
            code, timed_out, self.killed, tail, int((time.monotonic() - self.started) * 1000)
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


def child_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The child's environment: ours, minus rsched's secrets, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("RSCHED_REDIS_PASSWORD",)}
    env.update(extra)
    return env
