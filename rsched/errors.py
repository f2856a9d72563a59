"""One exception hierarchy; each class carries the exit code the CLI uses.

The library raises these; `rsched.cli.main` is the one place that turns them
into a message on stderr and an exit status.
"""

from __future__ import annotations

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
