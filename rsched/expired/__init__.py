"""`rsched run expired`: keyspace expiry triggers fired once per key across subscribers.

``arm``/``disarm`` are the library calls that register a key for the backup sweep.
The runner (:mod:`rsched.expired.runner`) is assembled from one module per seam:
arming, options, notify, topology, fire, subscribe, sweep (see its docstring).
"""

from rsched.expired.arming import arm, disarm

__all__ = ["arm", "disarm"]
