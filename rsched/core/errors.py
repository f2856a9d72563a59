"""One exception hierarchy; each class carries the exit code the CLI uses.

The library raises these; `rsched.cli.main` is the one place that turns them
into a message on stderr and an exit status.
"""

from __future__ import annotations

import sys
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILURE = 1
    USAGE = 2  # usage error or bad input
    NOT_FOUND = 3
    CONFLICT = 4
    UNAVAILABLE = 69  # Redis unreachable, authentication refused, or out of memory
    LOCKED = 75  # lock held (exec --if-locked fail)
    CONFIG = 78
    INTERRUPTED = 130


class RschedError(Exception):
    exit_code: int = ExitCode.FAILURE


class BadInput(RschedError, ValueError):
    """Input refused before anything was written. Names the field."""

    exit_code = ExitCode.USAGE

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")


class NotFound(RschedError, LookupError):
    exit_code = ExitCode.NOT_FOUND


class Conflict(RschedError):
    exit_code = ExitCode.CONFLICT


class StaleToken(Conflict):
    """An ack / retry / heartbeat / release whose claim token no longer matches."""


class RedisUnavailable(RschedError):
    exit_code = ExitCode.UNAVAILABLE


class RedisFull(RedisUnavailable):
    """Redis refused a write: used memory is over ``maxmemory`` and the policy is
    ``noeviction`` (the one rsched asks for). The refused command (a Lua script is
    refused at its first write) wrote nothing. Exit 69, like an unreachable Redis:
    nothing more can be written until memory is freed; loops wait it out."""

    def __init__(self, message: str = ""):
        super().__init__(message or FULL_MESSAGE)


#: What a refused write says (commands that wrote part of their work add what).
FULL_MESSAGE = (
    "Redis is out of memory (used memory is over maxmemory and maxmemory-policy "
    "noeviction refuses writes): free memory or raise maxmemory"
)


class LockHeld(RschedError):
    exit_code = ExitCode.LOCKED


class ConfigError(RschedError):
    exit_code = ExitCode.CONFIG


class WrongKeyType(ConfigError):
    """A key in rsched's namespace holds another type: the namespace collides with other data."""


# --- the one translation of Redis errors into this hierarchy ------------------

_ERROR_KINDS: dict[str, type[RschedError]] = {
    "RSCHED_CONFLICT": Conflict,
    "RSCHED_STALE": StaleToken,
    "RSCHED_NOTFOUND": NotFound,
    "RSCHED_BADINPUT": RschedError,  # replaced below with BadInput(field, msg)
    "RSCHED_LOCKED": LockHeld,
}

#: Error replies that mean the password (or user) was refused (as redis-py classifies them).
_AUTH_REPLIES = (
    "NOAUTH",
    "WRONGPASS",
    "ERR AUTH",
    "ERR Client sent AUTH",
    "ERR invalid password",
    "ERR invalid username-password",
)


def _map_reply(msg: str, exc: Exception) -> Exception:
    if "WRONGTYPE" in msg:
        import re

        # our scripts' own check says which key: "WRONGTYPE key K holds a T, not a U"
        m = re.search(r"WRONGTYPE key (.+) holds an? (\w+), not an? (\w+)", msg)
        which = f"key {m.group(1)!r} holds a {m.group(2)}, not a {m.group(3)}: " if m else ""
        return WrongKeyType(
            f"{which}a key in rsched's namespace holds another type of data "
            "(the namespace collides with something else; choose another --namespace)"
        )
    if msg.startswith(("CLUSTERDOWN", "MASTERDOWN")):  # an outage to wait out (exit 69)
        return RedisUnavailable(f"Redis Cluster cannot serve the keys now: {msg}")
    if "DB index is out of range" in msg:  # SELECT, or HELLO's AUTH+SELECT at connect
        return ConfigError(
            "--redis-url: the database number is out of range for this server "
            "(it has as many as its `databases` setting: 16 by default, 0 to 15)"
        )
    if msg.startswith("NOPERM") or "NOPERM" in msg[:40]:
        return ConfigError(f"the Redis user lacks a permission rsched needs: {msg}")
    for prefix, cls in _ERROR_KINDS.items():
        if msg.startswith(prefix):
            text = msg[len(prefix) :].strip()
            if prefix == "RSCHED_BADINPUT":
                field, _, rest = text.partition(" ")
                return BadInput(field, rest)
            return cls(text)
    return exc


def map_error(exc: Exception) -> Exception:
    """Translate a redis-py (or :mod:`rsched.core.resp`) exception into an rsched
    exception, or return it unchanged. Never imports redis-py itself."""
    if isinstance(exc, RschedError):
        return exc
    from rsched.core.resp import RespConnectionError, RespError

    if isinstance(exc, RespConnectionError):
        return RedisUnavailable(f"Redis unreachable: {exc}")
    if isinstance(exc, RespError):
        msg = str(exc)
        if msg.startswith("OOM "):
            return RedisFull()
        if msg.startswith(_AUTH_REPLIES):
            return RedisUnavailable(f"Redis refused authentication: {msg}")
        return _map_reply(msg, exc)
    rp = sys.modules.get("redis")
    if rp is None:  # not imported: exc cannot be one of its exceptions
        return exc
    if isinstance(exc, rp.AuthenticationError | rp.exceptions.AuthorizationError):
        return RedisUnavailable(f"Redis refused authentication: {exc}")
    if isinstance(exc, rp.ConnectionError | rp.TimeoutError):
        return RedisUnavailable(f"Redis unreachable: {exc}")
    if isinstance(exc, rp.exceptions.OutOfMemoryError):  # "OOM command not allowed ..."
        return RedisFull()
    if isinstance(exc, rp.exceptions.NoPermissionError):  # redis-py strips "NOPERM "
        return ConfigError(f"the Redis user lacks a permission rsched needs: {exc}")
    if isinstance(exc, rp.exceptions.ClusterDownError | rp.exceptions.TryAgainError):
        # redis-py strips the CLUSTERDOWN / MASTERDOWN / TRYAGAIN code: an outage (exit 69)
        return RedisUnavailable(f"Redis Cluster cannot serve the keys now: {exc}")
    if isinstance(exc, rp.ResponseError):
        return _map_reply(str(exc), exc)
    if isinstance(exc, rp.exceptions.ClusterError):  # "TTL exhausted": redirected too often
        return RedisUnavailable(
            f"Redis Cluster kept redirecting the command (a slot moving?): {exc}"
        )
    return exc
