"""Defaults every layer shares (no imports: anything may import this)."""

from __future__ import annotations

import socket

#: Execution records kept per queue / cron / lock (a capped stream).
HISTORY_MAXLEN = 10_000
#: Events kept per queue / cron / lock (a capped stream; see rsched/tools/events.py).
EVENTS_MAXLEN = 1_000
#: Max attempts for tasks added without --max-attempts, unless the queue's config says otherwise.
DEFAULT_MAX_ATTEMPTS = 5


def host_id() -> str:
    """This host's name as records, heartbeats and lock owners show it."""
    return socket.gethostname()
