"""A tiny ``sd_notify``: tell systemd (``Type=notify``) that a loop is ready,
alive (watchdog) or stopping. No dependency; a no-op outside systemd.

    from rsched.runtime import systemd
    systemd.ready("consuming queue default")
    ...
    if systemd.watchdog_interval_s():       # ping at half the interval
        systemd.watchdog()
    systemd.stopping()

``$NOTIFY_SOCKET`` is a filesystem path or an abstract socket (``@name``).
"""

from __future__ import annotations

import os
import socket


def _address() -> str | None:
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return None
    if addr.startswith("@"):
        return "\0" + addr[1:]  # abstract namespace
    if addr.startswith("/"):
        return addr
    return None  # vsock:... and other forms are not supported


def notify(*fields: str) -> bool:
    """Send ``KEY=VALUE`` lines to ``$NOTIFY_SOCKET``. True when a message was sent.

    Never raises: a notification that cannot be delivered must not stop the loop.
    """
    addr = _address()
    if addr is None or not fields:
        return False
    msg = "\n".join(f.replace("\n", " ") for f in fields).encode("utf-8")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(addr)
            sock.sendall(msg)
    except OSError:
        return False
    return True


def ready(status: str | None = None) -> bool:
    """``READY=1`` (and ``MAINPID``, so it also works from a child process)."""
    fields = ["READY=1", f"MAINPID={os.getpid()}"]
    if status:
        fields.append(f"STATUS={status}")
    return notify(*fields)


def stopping(status: str | None = None) -> bool:
    fields = ["STOPPING=1"]
    if status:
        fields.append(f"STATUS={status}")
    return notify(*fields)


def status(text: str) -> bool:
    return notify(f"STATUS={text}")


def watchdog_interval_s() -> float | None:
    """The watchdog period systemd expects pings within (``WATCHDOG_USEC``), or None.

    Honours ``WATCHDOG_PID``: when set and not our pid, the watchdog is someone else's.
    """
    usec = os.environ.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = os.environ.get("WATCHDOG_PID")
    if pid and pid.strip() != str(os.getpid()):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 1_000_000 if value > 0 else None


def watchdog() -> bool:
    """``WATCHDOG=1``, only when systemd asked for a watchdog (``WATCHDOG_USEC`` set)."""
    if watchdog_interval_s() is None:
        return False
    return notify("WATCHDOG=1")
