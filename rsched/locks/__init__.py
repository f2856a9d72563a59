"""Owned locks with fencing tokens and a watchdog; `rsched exec` runs a command under one."""

from rsched.locks.lock import Lock

__all__ = ["Lock"]
