"""A minimal Redis client for one-shot commands (``rsched add``), so that they
start without importing redis-py.

Why: ``import redis`` (redis-py 8) costs 70-90 ms, because its package
``__init__`` also imports ``redis.asyncio``, cluster, sentinel and
observability support; ``rsched add`` needs three round trips. This client
speaks RESP2 over one blocking socket and implements exactly what
:func:`rsched.queue.ops.add` and :func:`rsched.queue.ops.show` call: a command, a
non-transactional pipeline, ``TIME``/``HGET``/``ZSCORE``/``SADD``, and Lua
scripts (``EVAL``). Replies are decoded like
redis-py's ``decode_responses=True``; ``ZSCORE`` gives a float.

It is used only for plain ``redis://`` and ``unix://`` URLs without query
options (:func:`rsched.core.conn.connect_oneshot` decides); TLS, Sentinel and
everything long-running use redis-py.
"""

from __future__ import annotations

import socket
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit


class RespError(Exception):
    """An error reply from the server (``-ERR ...``), like redis-py's ResponseError."""


class RespConnectionError(Exception):
    """The server could not be reached, or the connection broke."""


def _encode(args: tuple[Any, ...]) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, bytes):
            b = a
        elif isinstance(a, str):
            b = a.encode("utf-8")
        elif isinstance(a, bool):
            raise TypeError(f"cannot send {a!r} to Redis")
        elif isinstance(a, int | float):
            b = repr(a).encode()
        else:
            raise TypeError(f"cannot send {type(a).__name__} to Redis")
        out.append(b"$%d\r\n%b\r\n" % (len(b), b))
    return b"".join(out)


def parse_url(url: str) -> dict[str, Any] | None:
    """``redis://[user:password@]host[:port][/db]`` or ``unix://[user:password@]/path[?db=N]``
    -> connection options; None when the URL needs redis-py (TLS, other options)."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    if set(query) - {"db"}:
        return None
    opts: dict[str, Any] = {
        "username": unquote(parts.username) if parts.username else None,
        "password": unquote(parts.password) if parts.password else None,
        "db": 0,
    }
    if parts.scheme == "redis":
        opts["host"] = parts.hostname or "localhost"
        opts["port"] = parts.port or 6379
        path = parts.path.lstrip("/")
        if path:
            opts["db"] = int(path)
    elif parts.scheme == "unix":
        opts["path"] = unquote(parts.path)
    else:
        return None
    if "db" in query:
        opts["db"] = int(query["db"])
    return opts


class LiteRedis:
    """One connection, opened lazily; not thread-safe (one-shot commands only)."""

    #: rsched.lua.loader sends EVAL (no NOSCRIPT round trip, no hashlib import).
    prefers_eval = True

    def __init__(
        self,
        *,
        host: str | None = None,
        port: int = 6379,
        path: str | None = None,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        connect_timeout: float = 3.0,
        socket_timeout: float = 10.0,
        probe_cluster: bool = False,
    ):
        self.host, self.port, self.path, self.db = host, port, path, db
        #: With probe_cluster, connect() also sends HELLO 2 (same round trip)
        #: and sets cluster_enabled: the caller switches to redis-py's cluster client.
        self.probe_cluster = probe_cluster
        self.cluster_enabled = False
        self.username, self.password = username, password
        self.connect_timeout, self.socket_timeout = connect_timeout, socket_timeout
        self._sock: socket.socket | None = None
        self._file: Any = None

    # ---------------------------------------------------------------- connection

    def connect(self) -> None:
        """Connect, authenticate, select the database and PING, in one round trip."""
        if self._sock is None:
            self._connect(ping=True)

    def _connect(self, ping: bool = False) -> None:
        try:
            if self.path is not None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(self.connect_timeout)
                sock.connect(self.path)
            else:
                sock = socket.create_connection(
                    (self.host or "localhost", self.port), timeout=self.connect_timeout
                )
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(self.socket_timeout)
        except OSError as exc:
            where = self.path or f"{self.host}:{self.port}"
            raise RespConnectionError(f"Error connecting to {where}: {exc}") from None
        self._sock = sock
        self._file = sock.makefile("rb")
        hello: list[tuple[Any, ...]] = []
        if self.password is not None:
            if self.username:
                hello.append(("AUTH", self.username, self.password))
            else:
                hello.append(("AUTH", self.password))
        if self.db:
            hello.append(("SELECT", self.db))
        if ping:
            hello.append(("PING",))
        probe = ping and self.probe_cluster
        if probe:
            hello.append(("HELLO", "2"))  # "mode": "cluster" on a cluster node
        replies = self._roundtrip(hello)
        if probe:
            info = replies.pop()  # an error (no HELLO) means: assume a single server
            if isinstance(info, list):
                pairs = dict(zip(info[0::2], info[1::2], strict=False))
                self.cluster_enabled = pairs.get("mode") == "cluster"
        for reply in replies:
            if isinstance(reply, RespError):
                self.close()
                raise reply

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._file.close()
                self._sock.close()
            except OSError:
                pass
        self._sock = self._file = None

    def _roundtrip(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """Send commands in one write, read one reply each (errors returned in place)."""
        if not commands:
            return []
        if self._sock is None:
            self._connect()
        assert self._sock is not None
        try:
            self._sock.sendall(b"".join(_encode(c) for c in commands))
            return [self._read() for _ in commands]
        except (OSError, ValueError) as exc:
            self.close()
            raise RespConnectionError(f"Error talking to Redis: {exc}") from None

    def _read(self) -> Any:
        line = self._file.readline()
        if not line.endswith(b"\r\n"):
            raise ValueError("connection closed by the server")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode("utf-8")
        if kind == b"-":
            return RespError(rest.decode("utf-8", errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self._file.read(n + 2)
            if len(data) != n + 2:
                raise ValueError("connection closed by the server")
            return data[:-2].decode("utf-8")
        if kind == b"*":
            n = int(rest)
            if n < 0:
                return None
            return [self._read() for _ in range(n)]
        raise ValueError(f"unexpected reply {line[:20]!r}")

    # ---------------------------------------------------------------- commands

    def execute_command(self, *args: Any) -> Any:
        reply = self._roundtrip([args])[0]
        if isinstance(reply, RespError):
            raise reply
        return _post(args[0], reply)

    def pipeline(self, transaction: bool = False) -> LitePipeline:
        if transaction:
            raise NotImplementedError("the lite client has no MULTI/EXEC")
        return LitePipeline(self)

    def register_script(self, source: str) -> LiteScript:
        return LiteScript(self, source)

    def ping(self) -> bool:
        return self.execute_command("PING") == "PONG"

    def time(self) -> Any:
        return self.execute_command("TIME")

    def hget(self, key: str, field: str) -> Any:
        return self.execute_command("HGET", key, field)

    def zscore(self, key: str, member: str) -> Any:
        return self.execute_command("ZSCORE", key, member)

    def sadd(self, key: str, *members: str) -> Any:
        return self.execute_command("SADD", key, *members)


def _post(command: Any, reply: Any) -> Any:
    """redis-py's reply conversions for the commands this client sends."""
    if command == "ZSCORE" and reply is not None:
        return float(reply)
    return reply


class LitePipeline:
    """Commands buffered and sent in one write (no MULTI)."""

    def __init__(self, client: LiteRedis):
        self.client = client
        self.commands: list[tuple[Any, ...]] = []

    def execute_command(self, *args: Any) -> LitePipeline:
        self.commands.append(args)
        return self

    def time(self) -> LitePipeline:
        return self.execute_command("TIME")

    def hget(self, key: str, field: str) -> LitePipeline:
        return self.execute_command("HGET", key, field)

    def zscore(self, key: str, member: str) -> LitePipeline:
        return self.execute_command("ZSCORE", key, member)

    def sadd(self, key: str, *members: str) -> LitePipeline:
        return self.execute_command("SADD", key, *members)

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        commands, self.commands = self.commands, []
        replies = self.client._roundtrip(commands)
        out = []
        for args, reply in zip(commands, replies, strict=True):
            if isinstance(reply, RespError):
                if raise_on_error:
                    raise reply
                out.append(reply)
            else:
                out.append(_post(args[0], reply))
        return out


class LiteScript:
    """A Lua script, sent with EVAL: the server caches it by its SHA1 as EVALSHA
    would, and a one-shot command saves a ``NOSCRIPT`` round trip and hashlib."""

    def __init__(self, client: LiteRedis, source: str):
        self.client = client
        self.source = source

    def __call__(
        self, keys: list[str], args: list[Any], client: LiteRedis | LitePipeline | None = None
    ) -> Any:
        c = client or self.client
        return c.execute_command("EVAL", self.source, len(keys), *keys, *args)
