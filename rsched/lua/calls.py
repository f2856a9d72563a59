"""One typed function per Lua script: the only place that builds KEYS/ARGV.

Each function takes the context (or a client/pipeline where a call is
pipelined), named keys from :mod:`rsched.core.keys` and typed arguments, and
returns the script's reply as Python values. The script's header
(``rsched/lua/NAME-K.lua``) documents every KEYS/ARGV entry; the function's
signature is that header in Python. Nothing outside ``rsched/lua`` calls
``Context.scripts`` (``tests/unit/test_layers.py`` checks it).

Sections, one per domain (each kept in the order of the script names):
queue, consumer, cron, locks, expired.
"""

from __future__ import annotations

from typing import Any, Protocol

from rsched.lua.loader import Scripts


class Ctx(Protocol):
    """What a call needs of :class:`rsched.context.Context` (the Lua layer sits
    below the context, so it names only these attributes)."""

    redis: Any
    scripts: Scripts


# === queue: add-5, cancel-5, purge-2, retry-4, requeue-stale-6 ================
#
# (the queue's calls go here)
#
#
#
#
#
#
# === end of queue =============================================================


# === consumer: claim-11, ack-4, fail-7, heartbeat-2, release-4 ================
#
# (the consumer's calls go here)
#
#
#
#
#
#
# === end of consumer ==========================================================


# === cron: cron-tick-8, cron-start-5, cron-finish-5, cron-heartbeat-1,
#     cron-pause-2, cron-shard-7 ===============================================
#
# (the cron runner's calls go here)
#
#
#
#
#
#
# === end of cron ==============================================================


# === locks: lock-acquire-2, lock-renew-1, lock-release-3, lock-unlock-2,
#     exec-acquire-3 ===========================================================
#
# (the locks' calls go here)
#
#
#
#
#
#
# === end of locks =============================================================


# === expired: expired-arm-3, expired-disarm-3, expired-due-1, expired-fire-4 ===
#
# (the expired runner's calls go here)
#
#
#
#
#
#
# === end of expired ===========================================================
