"""What runs a claimed task: the consumer's handler table (task type -> handler).

Handlers are decided by the consumer's own configuration (task type ->
handler), never by what is stored in Redis:

* a command (argv list, or a string split like a shell would, never run by
  one): the task ID is appended as the last argument, ``RSCHED_*`` variables
  describe the task, the payload JSON arrives on stdin, exit status 0 acks;
  the process group is killed on timeout, on a lost lease and at the end of
  the shutdown grace period;

  an ID is data, and one that begins with ``-`` would reach the program as an
  option (``--output=FILE`` made ``sort`` write a file, ``--help`` made an
  argparse handler exit 0 and the task was acked unprocessed). So by default
  (``id_arg = "auto"``) such an ID gets the end-of-options marker before it,
  ``-- -ID``, which getopt, argparse, click and the coreutils all honour; any
  other ID is passed exactly as before (``./close-order 1001``), and the ID is
  always the last argument. ``"none"`` passes no ID argument (the handler
  reads ``RSCHED_TASK_ID``); ``"plain"`` opts out (the ID as is, even
  ``--help``: only for a program that takes no options);
* a Python callable ``fn(task)`` (or ``"module:function"`` /
  ``"python:module:function"``; ``async def`` too): returning acks, raising
  fails; past its timeout it is stopped and recorded ``timeout``
  (:mod:`rsched.runtime.pycall`: a plain function with a timeout runs in a
  forked child that is killed, a coroutine is cancelled).

``*`` catches every type without its own handler, and a key with ``*``
inside (``report.*``) matches like a shell glob. A consumer claims only the
types it can run: ``claim-18`` gets its handlers as anchored Lua patterns
and leaves every other due task due, *parked* in its type's lane of the
sched set (see rsched/core/keys.py), where a consumer that runs that type (or a
``*`` one) takes it with one range read and the others never read it again.
The types each consumer runs are registered beside it (``handles``), so
``rsched queues`` shows the due tasks no live consumer can run.

A command runs through :mod:`rsched.runtime.handlers` (the one runner every
loop uses): :func:`command_for` builds its argv, environment and stdin. Its
stdout and stderr tails are the run's log, written by ``log-put-3`` in one
pipeline per settled batch right after ``ack-9``/``fail-10``; a run that wrote
nothing keeps none (and costs no round trip).
"""

from __future__ import annotations

import fnmatch
import importlib
import os
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rsched.core import validate
from rsched.core.errors import BadInput, ConfigError
from rsched.core.keys import logical_queue
from rsched.core.keys import member as make_member
from rsched.core.timeutil import iso
from rsched.runtime.handlers import Command, check_progress
from rsched.runtime.proc import DEFAULT_CAPTURE_BYTES, split_command

# --------------------------------------------------------------------------- tasks


@dataclass(slots=True)
class Task:
    """What a handler is given: one claimed run of a task."""

    type: str
    id: str
    queue: str
    payload: Any
    attempt: int
    max_attempts: int
    due_ms: int
    token: str
    payload_json: str = "null"
    last_error: str | None = None
    #: Set when the task is cancelled (``rsched cancel``) while it runs; a Python
    #: handler checks :attr:`cancelled` (or waits on this event) and stops early.
    cancel_event: threading.Event = field(default_factory=threading.Event, repr=False)
    #: Told each progress report (set by the consumer: a ProgressWriter).
    reporter: Callable[[float, str], None] | None = field(default=None, repr=False)

    def progress(self, fraction: float, message: str = "") -> None:
        """Report how far the run is: ``fraction`` from 0 to 1 and a short message
        (at most 200 characters kept), shown by ``rsched show`` / ``list`` and kept in
        the run's history record. ValueError for a fraction outside 0..1."""
        f, text = check_progress(fraction, message)
        if self.reporter is not None:
            self.reporter(f, text)

    @property
    def due_at(self) -> str:
        return iso(self.due_ms) or ""

    @property
    def cancelled(self) -> bool:
        """True once ``rsched cancel`` removed this task: its result will not count."""
        return self.cancel_event.is_set()

    @property
    def member(self) -> str:
        return make_member(self.type, self.id)


#: How a command handler gets the task ID as an argument (see the module doc).
ID_ARGS = ("auto", "plain", "none")


def check_id_arg(value: Any, field: str = "--id-arg") -> str:
    if value not in ID_ARGS:
        raise BadInput(
            field,
            f"{value!r} is not one of {', '.join(ID_ARGS)} (auto: -- before an ID that begins "
            "with -; plain: the ID as is; none: no ID argument, RSCHED_TASK_ID only)",
        )
    return str(value)


@dataclass(frozen=True)
class CommandHandler:
    argv: tuple[str, ...]
    id_arg: str = "auto"

    def __str__(self) -> str:
        return " ".join(self.argv)

    def command(self, task_id: str) -> list[str]:
        """The argv for one task: the ID last, safe from being read as an option."""
        if self.id_arg == "none":
            return list(self.argv)
        if self.id_arg == "auto" and task_id.startswith("-"):
            return [*self.argv, "--", task_id]
        return [*self.argv, task_id]


@dataclass(frozen=True)
class PythonHandler:
    fn: Callable[[Task], Any]
    name: str
    #: its own timeout (``@app.task(timeout=...)``); None: the queue's
    timeout_ms: int | None = None

    def __str__(self) -> str:
        return f"python:{self.name}"


Handler = CommandHandler | PythonHandler


def load_callable(spec: str, field: str = "--call") -> PythonHandler:
    """``"package.module:function"`` -> the callable (imported now, so errors show early)."""
    obj = load_object(spec, field, "MODULE:FUNCTION (like reports.jobs:run_daily)")
    if not callable(obj):
        raise BadInput(field, f"{spec!r} is not callable")
    return PythonHandler(obj, spec.strip())


def load_object(spec: str, field: str, form: str = "MODULE:ATTR (like shop.tasks:app)") -> Any:
    """``"package.module:attr"`` -> the object, imported with the current directory on
    the import path (as ``python -m`` would: handlers next to the config work)."""
    mod_name, sep, attr = spec.strip().partition(":")
    if not sep or not mod_name or not attr:
        raise BadInput(field, f"{spec!r} is not {form}")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)  # as `python -m` would: handlers next to the config work
    try:
        obj: Any = importlib.import_module(mod_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is bad input
        raise BadInput(field, f"cannot import {mod_name!r} ({type(exc).__name__}: {exc})") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise BadInput(field, f"{mod_name!r} has no attribute {attr!r}") from None
    return obj


def make_handler(spec: Any, field: str = "--handler", id_arg: str | None = None) -> Handler:
    """A handler from a callable, an argv list, ``"python:mod:fn"``, a command string,
    or a table ``{"command": ..., "id_arg": "auto" | "plain" | "none"}``. ``id_arg``:
    the default for a command that does not set its own."""
    if isinstance(spec, CommandHandler | PythonHandler):
        return spec
    if isinstance(spec, Mapping):
        unknown = set(spec) - {"command", "id_arg"}
        if unknown or "command" not in spec:
            raise BadInput(
                field,
                "a handler table takes command (required) and id_arg"
                + (f", not {sorted(unknown)[0]}" if unknown else ""),
            )
        mode = check_id_arg(spec.get("id_arg", id_arg or "auto"), f"{field}.id_arg")
        cmd = spec["command"]
        if not isinstance(cmd, str | list | tuple):
            raise BadInput(f"{field}.command", "is not a command string or an argument list")
        return CommandHandler(tuple(split_command(cmd, field)), mode)
    if callable(spec):
        name = f"{getattr(spec, '__module__', '?')}:{getattr(spec, '__qualname__', repr(spec))}"
        return PythonHandler(spec, name)
    if isinstance(spec, str) and spec.strip().startswith("python:"):
        return load_callable(spec.strip()[len("python:") :], field)
    if isinstance(spec, str | list | tuple):
        mode = check_id_arg(id_arg, "--id-arg") if id_arg is not None else "auto"
        return CommandHandler(tuple(split_command(spec, field)), mode)
    raise BadInput(field, f"{spec!r} is not a command, an argument list or a Python callable")


def check_pattern(pattern: str, field: str) -> str:
    """A handler table's key: a task type, a glob of types, or ``*``."""
    if pattern == "*":
        return pattern
    if "*" in pattern or "?" in pattern:
        validate.task_type(pattern.replace("*", "x").replace("?", "x"), field)
        return pattern
    return validate.task_type(pattern, field)


class HandlerTable:
    """Task type -> handler: exact types first, then glob patterns (longest
    first), then ``*``."""

    def __init__(self, handlers: Mapping[str, Any], field: str = "--handler"):
        self.exact: dict[str, Handler] = {}
        self.patterns: list[tuple[str, Handler]] = []
        self.fallback: Handler | None = None
        for pattern, spec in handlers.items():
            check_pattern(pattern, field)
            h = make_handler(spec, f"{field} {pattern}")
            if pattern == "*":
                self.fallback = h
            elif "*" in pattern or "?" in pattern:
                self.patterns.append((pattern, h))
            else:
                self.exact[pattern] = h
        self.patterns.sort(key=lambda p: -len(p[0]))
        self._cache: dict[str, Handler | None] = {}

    def __len__(self) -> int:
        return len(self.exact) + len(self.patterns) + (self.fallback is not None)

    @property
    def has_commands(self) -> bool:
        every = [*self.exact.values(), *(h for _, h in self.patterns)]
        if self.fallback is not None:
            every.append(self.fallback)
        return any(isinstance(h, CommandHandler) for h in every)

    def get(self, task_type: str) -> Handler | None:
        try:
            return self._cache[task_type]
        except KeyError:
            pass
        h = self.exact.get(task_type)
        if h is None:
            for pattern, ph in self.patterns:
                if fnmatch.fnmatchcase(task_type, pattern):
                    h = ph
                    break
        if h is None:
            h = self.fallback
        if len(self._cache) < 10_000:
            self._cache[task_type] = h
        return h

    def describe(self) -> str:
        items = [*self.exact, *(p for p, _ in self.patterns)]
        if self.fallback is not None:
            items.append("*")
        return ", ".join(items)

    def globs(self) -> list[str]:
        """The types this table runs, as the globs ``rsched queues`` matches: ``["*"]``
        with a fallback."""
        if self.fallback is not None:
            return ["*"]
        return [*self.exact, *(p for p, _ in self.patterns)]

    def lua_patterns(self) -> list[str]:
        """The types this table runs, as anchored Lua patterns for ``claim-18``; empty
        with a fallback (every type)."""
        if self.fallback is not None:
            return []
        return [lua_pattern(g) for g in self.globs()]


def lua_pattern(glob: str) -> str:
    """A type glob (``*``, ``?``, and type characters) -> an anchored Lua pattern that
    matches the same types as ``fnmatch.fnmatchcase``."""
    out = ["^"]
    for ch in glob:
        if ch == "*":
            out.append(".*")
        elif ch == "?":
            out.append(".")
        elif ch.isalnum() or ch == "_":
            out.append(ch)
        else:
            out.append("%" + ch)  # . - : and anything else: literal
    out.append("$")
    return "".join(out)


def config_handlers(handlers: Mapping[str, Any], id_arg: str | None = None) -> dict[str, Handler]:
    """The config file's ``[handlers]`` (a refusal is a ConfigError naming the entry)."""
    table: dict[str, Handler] = {}
    for t, spec in handlers.items():
        try:
            check_pattern(t, f"handlers.{t}")
            table[t] = make_handler(spec, f"handlers.{t}", id_arg)
        except BadInput as exc:
            raise ConfigError(f"config: {exc}") from None
    return table


def command_handler(task_type: str, command: str, id_arg: str | None = None) -> Handler:
    """``--handler TYPE=COMMAND``: the program must be an executable here or on PATH."""
    import shutil

    check_pattern(task_type, "--handler")
    h = make_handler(command, f"--handler {task_type}", id_arg)
    if isinstance(h, CommandHandler) and shutil.which(h.argv[0]) is None:
        raise BadInput(
            f"--handler {task_type}",
            f"{h.argv[0]!r} is not an executable file here or on PATH",
        )
    return h


def call_handler(task_type: str, spec: str) -> PythonHandler:
    """``--call TYPE=MODULE:FUNCTION``: imported now, so that errors show early."""
    check_pattern(task_type, "--call")
    return load_callable(spec, f"--call {task_type}")


def handler_table(handlers: Mapping[str, Any] | HandlerTable | None) -> HandlerTable:
    """The table, refused when empty."""
    table = handlers if isinstance(handlers, HandlerTable) else HandlerTable(handlers or {})
    if not len(table):
        raise BadInput(
            "--handler",
            "no handlers: give --handler TYPE=COMMAND, --call TYPE=MODULE:FUNCTION "
            "or a [handlers] section in the config file",
        )
    return table


def command_for(
    task: Task,
    handler: CommandHandler,
    timeout_ms: int | None,
    *,
    log_bytes: int = DEFAULT_CAPTURE_BYTES,
    on_output: Callable[[str, bytes], None] | None = None,
    on_progress: Callable[[float, str], None] | None = None,
) -> Command:
    """How a command handler runs ``task``: the ID last in argv, ``RSCHED_*`` in the
    environment, the payload JSON on stdin; its output kept (``log_bytes`` of each
    stream, the run log) and told to ``on_output`` as it comes (the live log)."""
    return Command(
        handler.command(task.id),
        env={
            "RSCHED_QUEUE": logical_queue(task.queue),
            "RSCHED_TASK_TYPE": task.type,
            "RSCHED_TASK_ID": task.id,
            "RSCHED_ATTEMPT": str(task.attempt),
            "RSCHED_MAX_ATTEMPTS": str(task.max_attempts),
            "RSCHED_DUE_AT": task.due_at,
            "RSCHED_CLAIM_TOKEN": task.token,
        },
        stdin=task.payload_json.encode("utf-8") + b"\n",
        timeout_s=timeout_ms / 1000.0 if timeout_ms else None,
        log_bytes=log_bytes,
        on_output=on_output,
        on_progress=on_progress,
    )
