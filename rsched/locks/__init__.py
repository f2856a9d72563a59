"""Owned locks with fencing tokens and a watchdog; `rsched exec` runs a command under one.

- :mod:`rsched.locks.lock`: :class:`Lock` (acquire, wait for a release, release);
- :mod:`rsched.locks.watchdog`: :class:`~rsched.locks.watchdog.Watchdog`, the lease renewal;
- :mod:`rsched.locks.admin`: ``list_locks`` / ``LockInfo``, ``unlock``;
- :mod:`rsched.locks.exec`: `rsched exec` (``make_exec_spec``, ``run_exec``).
"""

from rsched.locks.lock import Lock

__all__ = ["Lock"]
