"""rsched: distributed scheduled tasks on Redis.

The library API (no click import here):

    from rsched import Rsched
    rs = Rsched.from_url("redis://localhost:6379/0")
    rs.add("order.close", "1001", delay="30m", payload={"order": 1001})

Applications declare work in code (``rsched.App``: ``@app.task``, ``@app.cron``,
``@app.locked``; ``rsched run worker MODULE:ATTR``), and ``rsched.aio`` is the
asyncio client.

Heavier pieces (consumer, locks, cron) are imported lazily so that the
command line stays cheap to start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["App", "LockHeld", "Rsched", "__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from rsched.api import Rsched
    from rsched.app.app import App
    from rsched.core.errors import LockHeld

_LAZY = {
    "Rsched": ("rsched.api", "Rsched"),
    "App": ("rsched.app.app", "App"),
    "LockHeld": ("rsched.core.errors", "LockHeld"),
    "Consumer": ("rsched.consumer.loop", "Consumer"),
    "Lock": ("rsched.locks.lock", "Lock"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(name)
