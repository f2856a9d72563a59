"""What a queue holds and answers: Task, TaskSpec (one task to add), AddResult,
QueueStats. Plain values: no Redis I/O here.

A task is identified by (queue, TYPE, ID). Its record, stored in the queue's
``tasks`` hash under the member ``"TYPE ID"``, is a JSON array with its
trailing defaults left out (``rsched/lua/_record.lua`` reads and writes it)::

    [payload_json_text, attempts=0, max_attempts=0 (0 = consumer default),
     claim_token="", last_error="", due_ms, 0, priority=0, progress=null,
     after=null]

``progress`` is ``[fraction, message, at_ms]``: the running (or last failed)
attempt's last report (``task.progress()``, ``RSCHED_PROGRESS_FD``).
``after`` is ``["TYPE ID", ...]``: the parents a waiting task (``add --after``)
still waits for (``rsched/lua/_after.lua``).

A task that was never claimed is stored as ``[payload]`` (``[payload,0,N]``
with its own max attempts): its due time is its score in the ``sched`` set,
and the first claim writes ``due_ms`` into the record. Records written by
earlier versions (a seventh entry, ``created_ms``) are read the same way; the
reverse is not true (an earlier consumer cannot claim ``[payload]``), so
upgrade consumers before the code that adds tasks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rsched.core import keys as K
from rsched.core.timeutil import iso

STATES = ("scheduled", "due", "processing", "dead", "waiting")
IF_EXISTS = ("keep", "replace", "error")
#: Entries handled per Lua call by bulk operations (keeps each call short).
BATCH = 1000


@dataclass
class Task:
    type: str
    id: str
    queue: str
    state: str
    due_ms: int | None
    attempts: int = 0
    max_attempts: int | None = None
    payload: Any = None
    last_error: str | None = None
    lease_ms: int | None = None  # processing: lease expiry; dead: when it died
    priority: int = 0
    #: the last progress report: {"fraction", "message", "at", "at_ms"}, or None
    progress: dict[str, Any] | None = None
    #: the parents ("TYPE ID") a waiting task still waits for (``add --after``)
    waiting_for: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "id": self.id,
            "queue": self.queue,
            "state": self.state,
            "due_at": iso(self.due_ms),
            "due_ms": self.due_ms,
            "attempts": self.attempts,
            "max_attempts": self.max_attempts,
            "payload": self.payload,
            "last_error": self.last_error,
            "priority": self.priority,
            "progress": self.progress,
            "waiting_for": self.waiting_for,
        }


@dataclass
class AddResult:
    status: str  # added | kept | replaced
    task: Task
    #: The server's clock when the task was written (ms), for showing its due time.
    now_ms: int | None = field(default=None, compare=False, repr=False)
    #: The stored queue written (the task's partition in a partitioned queue).
    stored_queue: str | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class TaskRef:
    """One task's (type, id, queue), validated (:func:`rsched.queue.specs.task_ref`)."""

    type: str
    id: str
    queue: str = "default"

    @property
    def member(self) -> str:
        return K.member(self.type, self.id)


@dataclass(frozen=True)
class TaskQuery:
    """What ``list`` asks, validated (:func:`rsched.queue.specs.task_query`)."""

    queue: str = "default"
    state: str = "all"
    type: str | None = None
    limit: int = 100


@dataclass
class TaskSpec:
    """One task to add; validated on construction."""

    type: str
    id: str
    queue: str = "default"
    delay_ms: int | None = None
    at_ms: int | None = None
    payload_json: str = "null"
    max_attempts: int = 0
    priority: int = 0
    #: the parents ("TYPE ID", same queue) it waits for (``add --after``)
    after: tuple[str, ...] = ()

    @property
    def member(self) -> str:
        return K.member(self.type, self.id)


@dataclass
class QueueStats:
    queue: str
    scheduled: int
    due: int
    processing: int
    stale: int
    dead: int
    next_due_ms: int | None
    lag_ms: int
    consumers: int
    paused: bool
    extra: dict[str, Any] = field(default_factory=dict)
    #: Due tasks that no live consumer can run (no handler for their type), the age of
    #: the oldest of them, and the types of those parked (sorted). With no live
    #: consumer at all: every due task.
    unrunnable: int = 0
    unrunnable_lag_ms: int = 0
    unrunnable_types: list[str] = field(default_factory=list)
    #: the rate limit the consumers enforce (``rate_limit``, as configured), and
    #: whether it holds claims back now (no permit left in the window)
    rate_limit: str | None = None
    throttled: bool = False
    #: tasks waiting for their parents (``add --after``): not due until they finish ok
    waiting: int = 0
    #: per-type rate limits (``type_rate_limits``: type -> "N/DUR" as configured), and the
    #: types whose window is full now
    type_rate_limits: dict[str, str] = field(default_factory=dict)
    throttled_types: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "scheduled": self.scheduled,
            "due": self.due,
            "processing": self.processing,
            "stale": self.stale,
            "dead": self.dead,
            "next_due_at": iso(self.next_due_ms),
            "next_due_ms": self.next_due_ms,
            "lag_ms": self.lag_ms,
            "consumers": self.consumers,
            "paused": self.paused,
            "unrunnable": self.unrunnable,
            "unrunnable_lag_ms": self.unrunnable_lag_ms,
            "unrunnable_types": self.unrunnable_types,
            "rate_limit": self.rate_limit,
            "throttled": self.throttled,
            "waiting": self.waiting,
            "type_rate_limits": self.type_rate_limits,
            "throttled_types": self.throttled_types,
        }
