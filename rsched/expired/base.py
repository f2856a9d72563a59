"""What the parts of :class:`~rsched.expired.runner.ExpiredRunner` share: its
state, declared once here, and its log. The runner is assembled from one part
per seam (each a mixin over this base): :mod:`~rsched.expired.topology` (the
nodes and the cluster's primaries), :mod:`~rsched.expired.fire` (the claim of a
firing), :mod:`~rsched.expired.subscribe` (the event path) and
:mod:`~rsched.expired.sweep` (the backup sweep); :mod:`~rsched.expired.runner`
sets this state up, starts the threads and runs the handlers."""

from __future__ import annotations

import queue as queue_mod
import random
import re
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rsched.core.keys import ExpiredKeys
from rsched.runtime.loop import LineLog

if TYPE_CHECKING:  # pragma: no cover
    from rsched.context import Context
    from rsched.expired.model import Firing, Node

#: Redis outage backoff cap.
RECONNECT_MAX_S = 5.0


class RunnerBase:
    """The state every part of the runner reads (set by ``ExpiredRunner.__init__``)."""

    rs: Context
    pattern: str
    _match: Callable[[str], re.Match[str] | None]
    cluster: bool
    db: int
    backup_sweep: bool
    set_notify: bool
    claim_window_ms: int
    sweep_grace_ms: int
    id: str
    channel: str
    #: the single-Redis keys (a cluster's are per slot: ``_slot_keys``)
    keys: ExpiredKeys
    _slot_keys: dict[int, ExpiredKeys]
    nodes: list[Node]
    _nodes_lock: threading.Lock
    _retired: list[Node]
    _redirect_nodes: dict[tuple[str, int], Node]
    _seeds: list[tuple[str, int]]
    _template: dict[str, Any]
    _conn_class: Any
    _topo_kick: threading.Event
    _stop: threading.Event
    _wake: threading.Event
    _work: queue_mod.SimpleQueue[Firing | None]
    _lock: threading.Lock
    _pending: int
    _foreign_warned: bool
    _rnd: random.Random
    _logger: LineLog
    stats: Any

    def _log(self, level: str, message: str) -> None:
        self._logger(level, message)

    def _node_log(self, node: Node) -> Callable[[str, str], None]:
        """Log lines about one node: named on a cluster."""
        if not self.cluster:
            return self._log
        return lambda level, message: self._log(level, f"{node.name}: {message}")

    def _start_node(self, n: Node) -> None:
        """Start a node's subscription (and sweeper): the runner's."""
        raise NotImplementedError
