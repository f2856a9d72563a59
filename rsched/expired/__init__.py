"""`rsched run expired`: keyspace expiry triggers fired once per key across subscribers.

``arm``/``disarm`` are the library calls that register a key for the backup sweep.
"""

from rsched.expired.runner import arm, disarm

__all__ = ["arm", "disarm"]
