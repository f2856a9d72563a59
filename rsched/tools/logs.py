"""Run logs: what ``rsched logs`` reads.

A finished run's log is one field of the ``logs`` hash beside its history
stream (``{c:NAME}``, ``{l:NAME}`` or ``{q:QUEUE}``: the same hash slot), keyed
by the run's token, written by ``log-put-3`` right after the run's record and
trimmed to the history's cap (see :mod:`rsched.core.keys`). A run is found by
its history record (newest first, :mod:`rsched.tools.history`); its log is one
``HGET``. A running command's output is in its live stream
(``live:TOKEN``, chunks of ~1 s, capped, ended by an ``end`` entry when the log
is stored): :func:`follow` reads it with a blocking ``XREAD`` and returns once
the run ended.

Measured (``MEMORY USAGE`` of the hash and its index over 100-500 logs, per
kept log, JSON included): 144 bytes for an empty one, 296 B for 100 bytes of
output, 1,416 B for 1 KiB, 81,977 B for 64 KiB (the allocator's size class
rounds a large value up by up to 25%); a run that wrote nothing keeps no log. With the default 64 KiB per
stream and the default history cap, a cron whose every run fills both streams
keeps at most cap x 128 KiB: size ``[logs] max_bytes`` and the history cap to
the memory you give rsched.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rsched.core import validate
from rsched.core.errors import NotFound
from rsched.core.keys import logs_of_history, member
from rsched.queue import queues as partitions
from rsched.tools import history

if TYPE_CHECKING:  # pragma: no cover
    from rsched.api import Rsched


def _run(rec: history.Record, log: dict[str, Any] | None) -> dict[str, Any]:
    j = rec.to_json()
    log = log or {}
    return {
        "name": j["name"],
        "queue": j["queue"],
        "type": j["type"],
        "id": j["id"],
        "token": j["token"],
        "fire_at": j["fire_at"],
        "started_at": j["started_at"],
        "finished_at": j["finished_at"],
        "result": j["result"],
        "stdout": log.get("stdout", ""),
        "stderr": log.get("stderr", ""),
        "truncated": bool(log.get("truncated", False)),
    }


def runs(
    rs: Rsched,
    name: str | None = None,
    *,
    queue: str | None = None,
    task: tuple[str, str] | None = None,
    token: str | None = None,
    every: bool = False,
) -> list[dict[str, Any]]:
    """The runs asked for, newest first, each with its log (the latest only,
    unless ``every``). NotFound when there is none."""
    limit = max(rs.history_maxlen, 1)
    recs = history.read(rs, name, queue=queue, limit=limit) if (name or queue) else []
    if task is not None:
        recs = [r for r in recs if r.get("type") == task[0] and r.get("id") == task[1]]
    if token is not None:
        recs = [r for r in recs if str(r.get("token")) == token]
    what = (
        f"task {task[0]} {task[1]} of queue {queue!r}" if task else f"cron or lock {name!r}"
    ) + (f" (run {token})" if token else "")
    if not recs:
        raise NotFound(f"no recorded run of {what}")
    if not every:
        recs = recs[:1]
    pipe = rs.redis.pipeline(transaction=False)
    for r in recs:
        pipe.hget(logs_of_history(r.stream), str(r.get("token")))
    out = []
    for r, raw in zip(recs, pipe.execute(), strict=True):
        try:
            log = json.loads(raw) if raw else None
        except ValueError:
            log = None
        out.append(_run(r, log))
    return out


def running(
    rs: Rsched,
    name: str | None,
    *,
    queue: str | None = None,
    task: tuple[str, str] | None = None,
    token: str | None = None,
) -> tuple[Any, str] | None:
    """(keys, token) of the run in progress (cron, exec lock, or task), or None:
    the holder of the run lock (a task: of the lease); with ``token``, that run
    if it holds the lock or its live stream is open (a cron with ``--concurrency
    allow`` holds no lock)."""
    cands: list[tuple[Any, str | None]] = []
    if task is not None:
        assert queue is not None
        validate.queue(queue)
        m = member(*task)
        for p in partitions.names(rs, queue):
            qk = rs.keys.queue(p)
            tok = None
            if rs.redis.zscore(qk.proc, m) is not None:
                raw = rs.redis.hget(qk.tasks, m)
                try:
                    rec = json.loads(raw) if raw else []
                except ValueError:
                    rec = []
                tok = str(rec[3]) if len(rec) > 3 and rec[3] else None
            cands.append((qk, tok))
    else:
        assert name is not None
        ck, lk = rs.keys.cron(name), rs.keys.lock(name)
        for k, lock in ((ck, ck.run_lock), (lk, lk.lock)):
            tok = rs.redis.hget(lock, "token")
            cands.append((k, str(tok) if tok else None))
    for k, tok in cands:
        if tok is not None and (token is None or tok == token):
            return k, tok
    if token is not None:
        for k, _ in cands:
            if rs.redis.exists(k.live(token)) and not rs.redis.hexists(k.logs, token):
                return k, token
    return None


def follow(
    rs: Rsched,
    keys: Any,
    token: str,
    write: Callable[[str, str], None],
    alive: Callable[[], bool],
    poll_s: float = 1.0,
) -> None:
    """Write (stream, text) what run ``token`` wrote so far and as it comes, until
    it ends (its live stream's ``end``, or its log stored, or no sign of it)."""
    live = keys.live(token)
    last = "0-0"
    seen = False
    idle = 0
    while True:
        got = rs.redis.xread({live: last}, count=100, block=int(poll_s * 1000))
        if got:
            idle = 0
            for _key, entries in got:
                for eid, fields in entries:
                    last = eid
                    if "end" in fields:
                        return
                    seen = True
                    data = fields.get("d", "")
                    write(str(fields.get("s", "stdout")), data)
            continue
        raw = rs.redis.hget(keys.logs, token)
        if raw:
            if not seen:  # finished (its live stream gone) before we looked: its kept log
                log = json.loads(raw)
                write("stdout", log.get("stdout", ""))
                write("stderr", log.get("stderr", ""))
            return
        idle += 1
        if idle >= 2 and not alive():  # ended, wrote nothing, kept no log
            return


def so_far(rs: Rsched, keys: Any, token: str, count: int = 10_000) -> dict[str, str]:
    """What run ``token`` wrote so far, from its live stream (one ``XRANGE``, no
    blocking): ``{"stdout", "stderr", "ended"}`` (ended: the stream's ``end``)."""
    out = {"stdout": "", "stderr": ""}
    ended = False
    for _eid, fields in rs.redis.xrange(keys.live(token), count=count):
        if "end" in fields:
            ended = True
            break
        s = "stderr" if fields.get("s") == "stderr" else "stdout"
        out[s] += str(fields.get("d", ""))
    return {**out, "ended": ended}  # type: ignore[dict-item]
