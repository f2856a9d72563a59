"""Task specs: every input of an add validated into a TaskSpec before any
Redis I/O (flags, library arguments and ``add --from`` lines alike)."""

from __future__ import annotations

import json
from typing import Any

from rsched.core import validate
from rsched.core.errors import BadInput
from rsched.core.timeutil import duration_ms, parse_time
from rsched.queue.model import STATES, TaskQuery, TaskRef, TaskSpec


def _at(value: Any, field: str, tz: str | None) -> int:
    from datetime import datetime

    if isinstance(value, bool):
        raise BadInput(field, f"{value!r} is not a time")
    if isinstance(value, int):
        return value
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise BadInput(field, "a datetime without tzinfo is ambiguous")
        return int(value.timestamp() * 1000)
    return parse_time(value, field, tz)


_FLAG_FIELDS = {
    "type": "TYPE",
    "id": "ID",
    "queue": "--queue",
    "in": "--in",
    "at": "--at",
    "payload": "--payload",
    "max_attempts": "--max-attempts",
    "priority": "--priority",
    "after": "--after",
}


#: The compact JSON of validate.payload_value, with one encoder built once.
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def _payload(value: Any, field: str) -> str:
    """validate.payload_value, faster for the common case: ASCII text needs no
    UTF-8 check and its length is its size in bytes."""
    try:
        text = _COMPACT(value)
    except (TypeError, ValueError):
        return validate.payload_value(value, field)  # raises, with its message
    if text.isascii() and len(text) <= validate.MAX_PAYLOAD_BYTES:
        return text
    return validate.payload_value(value, field)


def make_spec(
    task_type: str,
    task_id: str,
    *,
    queue: str = "default",
    delay: Any = None,
    at: Any = None,
    payload: Any = None,
    payload_json: str | bytes | None = None,
    max_attempts: Any = None,
    priority: Any = None,
    after: Any = None,
    tz: str | None = None,
    fields: dict[str, str] | None = None,
) -> TaskSpec:
    """Validate one task's inputs. ``fields`` renames fields in error messages."""
    f = {**_FLAG_FIELDS, **fields} if fields else _FLAG_FIELDS
    validate.task_type(task_type, f["type"])
    # Fast path of validate.task_id (every whitespace character but " " is unprintable).
    if not (
        type(task_id) is str
        and 0 < len(task_id) <= 256
        and task_id.isprintable()
        and " " not in task_id
    ):
        validate.task_id(task_id, f["id"])
    if queue != "default":
        validate.queue(queue, f["queue"])
    if delay is not None and at is not None:
        # f["in"] may be "line 3: in": the message names the fields without the line again.
        short_in, short_at = f["in"].rsplit(": ", 1)[-1], f["at"].rsplit(": ", 1)[-1]
        raise BadInput(f["in"], f"give either {short_in} or {short_at}, not both")
    spec = TaskSpec(task_type, task_id, queue)
    if delay is not None:
        spec.delay_ms = duration_ms(delay, f["in"])
    elif at is not None:
        spec.at_ms = _at(at, f["at"], tz)
    if payload_json is not None:
        spec.payload_json = validate.payload_text(payload_json, f["payload"])
    elif payload is not None:
        spec.payload_json = _payload(payload, f["payload"])
    if max_attempts is not None:
        spec.max_attempts = validate.max_attempts(max_attempts, f["max_attempts"])
    if priority is not None and priority != 0:
        spec.priority = validate.priority(priority, f["priority"])
    if after:
        spec.after = _after(after, spec.member, f["after"])
    return spec


def _after(value: Any, member: str, field: str) -> tuple[str, ...]:
    """``after``: (TYPE, ID) pairs of the parents, in the same queue -> their members."""
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        raise BadInput(field, 'give a list of [TYPE, ID] pairs: [["order.open", "1001"]]')
    out: list[str] = []
    for pair in value:
        if isinstance(pair, (str, bytes)) or not hasattr(pair, "__len__") or len(pair) != 2:
            raise BadInput(field, f"{pair!r} is not a [TYPE, ID] pair")
        t, i = pair
        validate.task_type(t, f"{field} TYPE")
        validate.task_id(i, f"{field} ID")
        m = f"{t} {i}"
        if m == member:
            raise BadInput(field, f"a task cannot wait for itself ({m})")
        if m not in out:
            out.append(m)
    return tuple(out)


def task_ref(task_type: str, task_id: str, queue: str = "default") -> TaskRef:
    """A validated reference to one task (``cancel``, ``show``)."""
    validate.task_type(task_type)
    validate.task_id(task_id)
    validate.queue(queue)
    return TaskRef(task_type, task_id, queue)


def task_query(
    queue: str = "default", *, state: str = "all", task_type: str | None = None, limit: int = 100
) -> TaskQuery:
    """A validated ``list`` query."""
    validate.queue(queue)
    if state not in (*STATES, "all"):
        raise BadInput("--state", f"{state!r} is not one of {', '.join((*STATES, 'all'))}")
    if task_type is not None:
        validate.task_type(task_type, "--type")
    if limit < 1:
        raise BadInput("--limit", f"{limit} is not a positive whole number")
    return TaskQuery(queue, state, task_type, limit)


#: Fields of one ``add --from`` JSON line.
LINE_FIELDS = frozenset(
    ("type", "id", "queue", "in", "at", "payload", "max_attempts", "priority", "after")
)


def spec_from_line(raw: bytes | str, lineno: int, tz: str | None = None) -> TaskSpec:
    """One ``add --from`` JSON line -> a validated spec. Errors name the line and field.
    ``tz``: the zone of an ``at`` written without an offset (``add --from F --tz Z``)."""
    where = f"line {lineno}"
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise BadInput(where, "is not valid UTF-8") from None
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise BadInput(where, f"is not a JSON object ({exc.msg})") from None
    if type(obj) is not dict:
        raise BadInput(
            where, 'is not a JSON object like {"type": "order.close", "id": "1001", "in": "30m"}'
        )
    if not obj.keys() <= LINE_FIELDS:
        unknown = sorted(set(obj) - LINE_FIELDS)[0]
        raise BadInput(
            f"{where}: {unknown}", f"unknown field (known: {', '.join(sorted(LINE_FIELDS))})"
        )
    for req in ("type", "id"):
        if req not in obj:
            raise BadInput(f"{where}: {req}", "is required")
    task_type = obj["type"]
    task_id = obj["id"]
    delay = obj.get("in")
    at = obj.get("at")
    max_attempts = obj.get("max_attempts")
    priority = obj.get("priority")
    if priority is not None and type(priority) is not int:
        raise BadInput(
            f"{where}: priority",
            f"{_shown(priority)} is not {validate.PRIORITY_RULE} (a JSON number)",
        )
    if (
        type(task_type) is not str
        or type(task_id) is not str
        or (delay is not None and type(delay) is not str)
        or (at is not None and type(at) is not str)
        or (max_attempts is not None and type(max_attempts) not in (int, str))
    ):
        raise _line_type_error(where, obj)
    kw: dict[str, Any] = dict(
        queue=obj.get("queue", "default"),
        delay=delay,
        at=at,
        payload=obj.get("payload"),
        max_attempts=max_attempts,
        priority=priority,
        after=obj.get("after"),
        tz=tz,
    )
    try:
        return make_spec(task_type, task_id, **kw)
    except BadInput:
        # The common case pays for no per-line field names; a bad line is checked
        # again so that the message names "line N: FIELD".
        fields = {k: f"{where}: {k}" for k in LINE_FIELDS}
        return make_spec(task_type, task_id, fields=fields, **kw)


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a JSON boolean"
    if isinstance(value, int | float):
        return "a JSON number"
    if isinstance(value, list):
        return "a JSON array"
    if isinstance(value, dict):
        return "a JSON object"
    return "not a string"


def _line_type_error(where: str, obj: dict[str, Any]) -> BadInput:
    """The first field of a JSON line whose JSON type is wrong. A line follows the
    flags' rules: numbers are not read as milliseconds (``"in": 1800`` would be
    1.8 s, ``"at": 1796040000`` a time in 1970), IDs are strings."""
    from rsched.core.timeutil import DURATION_FORM, TIME_FORM

    task_type = obj["type"]
    if type(task_type) is not str:
        return BadInput(
            f"{where}: type",
            f"{_shown(task_type)} is {_json_kind(task_type)}; a task type is a string "
            f'({validate.TYPE_RULE}), like "order.close"',
        )
    task_id = obj["id"]
    if type(task_id) is not str:
        hint = f'; write "{task_id}"' if type(task_id) is int else ""
        return BadInput(
            f"{where}: id",
            f"{_shown(task_id)} is {_json_kind(task_id)}; task IDs are strings "
            f"({validate.ID_RULE}){hint}",
        )
    delay = obj.get("in")
    if delay is not None and type(delay) is not str:
        return BadInput(
            f"{where}: in",
            f"{_shown(delay)} is {_json_kind(delay)}; give a string: {DURATION_FORM}",
        )
    at = obj.get("at")
    if at is not None and type(at) is not str:
        return BadInput(
            f"{where}: at", f"{_shown(at)} is {_json_kind(at)}; give a string: {TIME_FORM}"
        )
    ma = obj.get("max_attempts")
    return BadInput(
        f"{where}: max_attempts",
        f"{_shown(ma)} is not a whole number from 1 to {validate.MAX_ATTEMPTS_LIMIT}",
    )
