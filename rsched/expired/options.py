"""The options of ``run expired``, checked once, before any Redis I/O.

:func:`expired_options` takes what the caller gave (the CLI's flag text, or the
library's Python values) and returns an :class:`ExpiredOptions`; ``rsched run
expired`` builds it and hands it to :class:`~rsched.expired.runner.ExpiredRunner`,
the library's ``ExpiredRunner(...)`` builds it from its keyword arguments.
Only what needs the server (Redis Cluster has database 0 only) is checked by
the runner.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rsched.core.errors import BadInput
from rsched.core.timeutil import duration_ms
from rsched.expired.notify import check_pattern
from rsched.runtime.options import positive_int
from rsched.runtime.proc import split_command

#: How long the claim of an un-armed key's firing lasts (see rsched.expired.runner).
DEFAULT_CLAIM_WINDOW_MS = 10_000
#: The sweep leaves an expiry this long to the event path before firing it itself.
DEFAULT_SWEEP_GRACE_MS = 1_000
#: Running handlers get this long to finish after SIGTERM before they are killed.
DEFAULT_GRACE_MS = 30_000
#: Most handlers running at once.
CONCURRENCY_LIMIT = 1024


@dataclass(frozen=True)
class ExpiredOptions:
    pattern: str
    #: a command's argv, or a Python callable ``fn(firing)``
    handler: list[str] | Callable[[Any], Any]
    db: int | None  # None: the connection's
    backup_sweep: bool
    concurrency: int
    timeout_ms: int | None
    claim_window_ms: int
    sweep_grace_ms: int
    grace_ms: int
    set_notify: bool


def expired_options(
    pattern: str,
    handler: Any,
    *,
    db: Any = None,
    backup_sweep: bool = False,
    concurrency: Any = 1,
    timeout_ms: Any = None,
    claim_window_ms: Any = DEFAULT_CLAIM_WINDOW_MS,
    sweep_grace_ms: int = DEFAULT_SWEEP_GRACE_MS,
    grace_ms: int = DEFAULT_GRACE_MS,
    set_notify: bool = False,
    on_path: bool = False,
) -> ExpiredOptions:
    """Check every option. ``handler``: a Python callable, an argv list or a command
    string (split like a shell would, never run by one); ``on_path``: its program
    must be an executable here or on PATH (the CLI's check). Flag text (``"30s"``)
    is taken wherever a number is."""
    check_pattern(pattern)
    run: list[str] | Callable[[Any], Any]
    if callable(handler) and not isinstance(handler, str | list | tuple):
        run = handler
    else:
        run = split_command(handler, "--handler")
        if on_path and shutil.which(run[0]) is None:
            raise BadInput("--handler", f"{run[0]!r} is not an executable file here or on PATH")
    db_n = db
    if isinstance(db, str):
        try:
            db_n = int(db)
        except ValueError:
            db_n = -1
    if db_n is not None and (isinstance(db_n, bool) or not isinstance(db_n, int) or db_n < 0):
        raise BadInput("--db", f"{db!r} is not a database number (0 or more)")
    conc = positive_int(concurrency, "--concurrency", CONCURRENCY_LIMIT)
    timeout: int | None = None
    if isinstance(timeout_ms, str) or timeout_ms:  # the library's 0: no timeout
        timeout = duration_ms(timeout_ms, "--timeout")
    if claim_window_ms is None or claim_window_ms == "":
        window = DEFAULT_CLAIM_WINDOW_MS
    elif isinstance(claim_window_ms, str):
        window = duration_ms(claim_window_ms, "--claim-window")
    else:
        window = int(claim_window_ms)
    if window < 100:
        shown = repr(claim_window_ms) if isinstance(claim_window_ms, str) else f"{window}ms"
        raise BadInput("--claim-window", f"{shown} is too short; give at least 100ms")
    return ExpiredOptions(
        pattern,
        run,
        db_n,
        bool(backup_sweep),
        conc,
        timeout,
        window,
        int(sweep_grace_ms),
        int(grace_ms),
        bool(set_notify),
    )
