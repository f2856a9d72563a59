"""Execution records: every cron fire, `exec` run and task run.

Each cron (``{c:NAME}:history``), lock used by `exec` (``{l:NAME}:history``)
and queue (``{q:QUEUE}:history``) has a capped stream (``XADD ... MAXLEN ~``);
each entry's field ``j`` holds one JSON object:

    kind (cron|exec|task), name, queue, type, id, fire_ms, started_ms,
    finished_ms, duration_ms, result (ok|failed|timeout|lost|skipped|missed|cancelled),
    exit_code, host, pid, attempt, token, error (stderr tail on failure),
    cause (absent for a scheduled tick; "manual", "after NAME"), after_token, triggered_by;
    a task's also claimed_ms (the server's clock at the claim) and progress (the last report)

Reading is newest first, paged with XREVRANGE (never the whole stream).
``has_log``: the run's log is kept (``HEXISTS`` on the ``logs`` hash beside
the stream, by token; one pipelined round trip for the records read).
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rsched.core import validate
from rsched.core.timeutil import iso
from rsched.queue import queues as partitions

if TYPE_CHECKING:  # pragma: no cover
    from rsched.api import Rsched

RESULTS = ("ok", "failed", "timeout", "lost", "skipped", "missed", "cancelled")
FAILED_RESULTS = frozenset({"failed", "timeout", "lost"})
PAGE = 200


@dataclass
class Record:
    stream_id: str
    data: dict[str, Any] = field(default_factory=dict)
    #: the stream it was read from, and whether its run log is kept
    stream: str = ""
    has_log: bool = False

    def get(self, k: str) -> Any:
        return self.data.get(k)

    @property
    def sort_key(self) -> tuple[int, int]:
        ms, _, seq = self.stream_id.partition("-")
        return int(ms), int(seq or 0)

    @property
    def failed(self) -> bool:
        return self.data.get("result") in FAILED_RESULTS

    def to_json(self) -> dict[str, Any]:
        d = self.data

        def ms(k: str) -> int | None:
            v = d.get(k)
            return int(v) if isinstance(v, int | float) else None

        out: dict[str, Any] = {
            "kind": d.get("kind"),
            "name": d.get("name"),
            "queue": d.get("queue"),
            "type": d.get("type"),
            "id": d.get("id"),
            "fire_at": iso(ms("fire_ms")),
            "fire_ms": ms("fire_ms"),
            "started_at": iso(ms("started_ms")),
            "started_ms": ms("started_ms"),
            "finished_at": iso(ms("finished_ms")),
            "finished_ms": ms("finished_ms"),
            "duration_ms": d.get("duration_ms"),
            "result": d.get("result"),
            "exit_code": d.get("exit_code"),
            "host": d.get("host"),
            "pid": d.get("pid"),
            "attempt": d.get("attempt"),
            "token": d.get("token"),
            "error": d.get("error") or None,
            "cause": d.get("cause") or None,
            "triggered_by": d.get("triggered_by") or None,
            "after_token": d.get("after_token"),
            "has_log": self.has_log,
        }
        if d.get("kind") == "task":  # the server's clock at the claim (rate limits)
            out["claimed_at"] = iso(ms("claimed_ms"))
            out["claimed_ms"] = ms("claimed_ms")
        for extra in ("shard", "shard_total", "progress"):
            if extra in d:
                out[extra] = d[extra]
        return out


def short_error(text: str | None, width: int = 60) -> str | None:
    """A record's error for a table cell: its last line (the end of a stderr tail
    says most), at most ``width`` characters, with an ellipsis (…) where it was cut:
    in front when earlier lines were left out, at the end when the line was."""
    if not text:
        return None
    lines = [ln for ln in text.splitlines() if ln.strip()] or [text]
    last = lines[-1].strip()
    head = "…" if len(lines) > 1 else ""
    room = width - len(head)
    if len(last) > room:
        last = last[: room - 1] + "…"
    return head + last


def _parse(entry_id: str, fields: dict[str, str]) -> Record:
    try:
        data = json.loads(fields.get("j", "{}"))
        if not isinstance(data, dict):
            data = {"error": "unreadable record"}
    except (ValueError, TypeError):
        data = {"error": "unreadable record"}
    return Record(entry_id, data)


def _stream(rs: Rsched, key: str, page: int = PAGE) -> Iterator[Record]:
    """Records of one stream, newest first, read a page at a time."""
    end = "+"
    while True:
        entries = rs.redis.xrevrange(key, max=end, min="-", count=page)
        if not entries:
            return
        for eid, fields in entries:
            rec = _parse(eid, fields)
            rec.stream = key
            yield rec
        if len(entries) < page:
            return
        end = "(" + entries[-1][0]  # exclusive range (Redis >= 6.2)


def streams_for(rs: Rsched, name: str | None = None, queue: str | None = None) -> list[str]:
    """The history streams that ``rsched history [NAME | --queue Q]`` reads."""
    if queue is not None:
        validate.queue(queue)
        return [rs.keys.queue(q).history for q in partitions.names(rs, queue)]
    if name is not None:
        validate.name(name, "NAME")
        return [rs.keys.cron(name).history, rs.keys.lock(name).history]
    pipe = rs.redis.pipeline(transaction=False)
    pipe.smembers(rs.keys.crons)
    pipe.smembers(rs.keys.locks)
    pipe.smembers(rs.keys.queues)
    crons, locks, queues = pipe.execute()
    keys = [rs.keys.cron(n).history for n in sorted(crons)]
    keys += [rs.keys.lock(n).history for n in sorted(locks)]
    stored = partitions.names_many(rs, sorted(queues))
    keys += [rs.keys.queue(p).history for q in sorted(queues) for p in stored[q]]
    return keys


def read(
    rs: Rsched,
    name: str | None = None,
    *,
    queue: str | None = None,
    failed: bool = False,
    limit: int = 50,
    result: str | None = None,
    logs: bool = True,
) -> list[Record]:
    """The newest ``limit`` records (merged over streams), newest first.
    ``logs=False`` leaves :attr:`Record.has_log` unset (saves a command per record)."""
    if limit < 1:
        from rsched.core.errors import BadInput

        raise BadInput("--limit", f"{limit} is not a positive whole number")
    keys = streams_for(rs, name, queue)
    page = max(10, min(PAGE, limit))  # many streams: small first pages
    iters = [_stream(rs, k, page) for k in keys]
    merged = heapq.merge(*iters, key=lambda r: tuple(-x for x in r.sort_key))
    out: list[Record] = []
    for rec in merged:
        if failed and not rec.failed:
            continue
        if result and rec.get("result") != result:
            continue
        out.append(rec)
        if len(out) >= limit:
            break
    if logs:
        mark_logs(rs, out)
    return out


def mark_logs(rs: Rsched, records: list[Record]) -> None:
    """Set :attr:`Record.has_log` (one pipelined HEXISTS per record with a token)."""
    from rsched.core.keys import logs_of_history

    todo = [r for r in records if r.stream and r.get("token") not in (None, "")]
    if not todo:
        return
    pipe = rs.redis.pipeline(transaction=False)
    for r in todo:
        pipe.hexists(logs_of_history(r.stream), str(r.get("token")))
    for r, found in zip(todo, pipe.execute(), strict=True):
        r.has_log = bool(found)
