"""Tasks of a queue, one page at a time, resumed from an opaque cursor.

``rsched list`` reads the first N tasks; a console needs the page after the
one it shows without reading what came before. The tasks of a queue sit in
sorted sets (``proc``, ``sched``, ``dead``, see :mod:`rsched.core.keys`); a
page walks *segments* in a fixed order: per stored queue (the queue, or each
of its partitions), processing, then due (the unparked scores ``0..now``,
then each parked type's lane, by type), then scheduled (``(now..+inf``),
then dead. Within a segment the order is the set's (score, member).

The cursor is where the last page stopped: the segment and the (score,
member) of its last row. Resuming costs one pipelined ``ZSCORE`` + ``ZRANK``
(is that member still there, with that score?) and one ``ZRANGE`` by rank,
O(log N + page) whatever the queue's size; when the member is gone (run,
cancelled), the page resumes after its score (``ZRANGEBYSCORE (score``,
which may skip a task of exactly that score: a live view, not a snapshot).
A type filter reads at most :data:`SCAN_BUDGET` members per page and then
hands back a cursor, so a rare type never makes one request read a whole
queue (such a page may be short, with a next page).

Measured on a 1,000,000-task queue (``tests/integration/web/bench_web.py``,
median of 25): the console's queue page renders in 6.1 ms (first page) and
3.6 ms (a cursor at the middle of the queue); ``/api/tasks?limit=100`` 2.1 ms.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rsched.core import keys as K
from rsched.core.errors import BadInput
from rsched.queue import queues as P
from rsched.queue.model import Task, TaskQuery
from rsched.queue.ops import decode_task

if TYPE_CHECKING:  # pragma: no cover
    from rsched.context import Context

#: Members read per page at most when filtering by type.
SCAN_BUDGET = 5000

ORDER = ("processing", "due", "scheduled", "dead")


@dataclass
class Page:
    tasks: list[Task]
    #: where the next page starts, or None after the last one
    cursor: str | None


@dataclass(frozen=True)
class _Segment:
    stored: str  # the stored queue (the queue or one partition)
    state: str
    lane: str  # the parked type of a due lane, "" otherwise
    key: str
    lo: Any
    hi: Any

    @property
    def ident(self) -> list[str]:
        return [self.stored, self.state, self.lane]


def _segments(rs: Context, query: TaskQuery, now: int) -> list[_Segment]:
    out = []
    states = ORDER if query.state == "all" else (query.state,)
    for stored in P.names(rs, query.queue):
        q = rs.keys.queue(stored)
        for st in states:
            if st == "processing":
                out.append(_Segment(stored, st, "", q.proc, "-inf", "+inf"))
            elif st == "dead":
                out.append(_Segment(stored, st, "", q.dead, "-inf", "+inf"))
            elif st == "scheduled":
                out.append(_Segment(stored, st, "", q.sched, f"({now}", "+inf"))
            else:
                out.append(_Segment(stored, st, "", q.sched, 0, now))
                lanes = rs.redis.hgetall(q.lanes) or {}
                for t in sorted(lanes):
                    if t == "#" or (query.type is not None and t != query.type):
                        continue
                    lo, hi = K.lane_bounds(int(lanes[t]))
                    out.append(_Segment(stored, st, t, q.sched, lo, hi))
    return out


def _below(score: float, hi: Any) -> bool:
    """``score`` within the upper bound ``hi`` (a number, ``+inf`` or ``(N``)."""
    if hi == "+inf":
        return True
    if isinstance(hi, str) and hi.startswith("("):
        return score < float(hi[1:])
    return score <= float(hi)


def encode_cursor(ident: list[str], score: float, member: str) -> str:
    raw = json.dumps([*ident, score, member], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[list[str], float, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        stored, state, lane, score, member = json.loads(raw)
        if not all(isinstance(x, str) for x in (stored, state, lane, member)):
            raise ValueError
        return [stored, state, lane], float(score), member
    except (ValueError, TypeError):
        raise BadInput("cursor", "is not a cursor this server handed out") from None


def _rows(
    rs: Context, seg: _Segment, after: tuple[float, str] | None, n: int
) -> list[tuple[str, float]]:
    """Up to ``n`` (member, score) of ``seg`` after ``after`` (or from its start)."""
    r = rs.redis
    if after is None:
        return r.zrangebyscore(seg.key, seg.lo, seg.hi, start=0, num=n, withscores=True)
    score, member = after
    pipe = r.pipeline(transaction=False)
    pipe.zscore(seg.key, member)
    pipe.zrank(seg.key, member)
    now_score, rank = pipe.execute()
    if now_score is not None and rank is not None and float(now_score) == score:
        rows = r.zrange(seg.key, rank + 1, rank + n, withscores=True)
        out = []
        for m, sc in rows:
            if not _below(sc, seg.hi):
                break
            out.append((m, sc))
        return out
    return r.zrangebyscore(seg.key, f"({score!r}", seg.hi, start=0, num=n, withscores=True)


def page(rs: Context, query: TaskQuery, cursor: str | None = None) -> Page:
    """``query.limit`` tasks of ``query`` from ``cursor`` on, and the next page's cursor."""
    now = rs.now_ms()
    segs = _segments(rs, query, now)
    start, after = 0, None
    if cursor:
        ident, score, member = decode_cursor(cursor)
        idents = [s.ident for s in segs]
        if ident in idents:
            start, after = idents.index(ident), (score, member)
        else:  # a lane that emptied: go on from the first segment after its place
            later = [i for i, s in enumerate(segs) if s.ident[:2] >= ident[:2]]
            start = later[0] if later else len(segs)
    prefix = f"{query.type} " if query.type else None
    want = query.limit
    # (segment, member, score), one more than a page: is there a next one?
    picked: list[tuple[_Segment, str, float]] = []
    scanned = 0
    last: tuple[_Segment, str, float] | None = None
    for seg in segs[start:]:
        pos = after
        after = None
        while len(picked) <= want:
            n = want + 1 - len(picked) if prefix is None else max(200, want + 1)
            rows = _rows(rs, seg, pos, n)
            if not rows:
                break
            for m, sc in rows:
                scanned += 1
                last = (seg, m, sc)
                if prefix is None or m.startswith(prefix):
                    picked.append((seg, m, sc))
                    if len(picked) > want:
                        break
            pos = (rows[-1][1], rows[-1][0])
            if len(rows) < n or (prefix is not None and scanned >= SCAN_BUDGET):
                break
        if len(picked) > want or (prefix is not None and scanned >= SCAN_BUDGET):
            break
    more = len(picked) > want
    picked = picked[:want]
    tasks = _decode_all(rs, query.queue, picked)
    nxt = None
    if more:
        seg, m, sc = picked[-1]
        nxt = encode_cursor(seg.ident, sc, m)
    elif prefix is not None and scanned >= SCAN_BUDGET and last is not None:
        seg, m, sc = last
        nxt = encode_cursor(seg.ident, sc, m)
    return Page(tasks, nxt)


def _decode_all(rs: Context, queue: str, picked: list[tuple[_Segment, str, float]]) -> list[Task]:
    by_key: dict[str, list[int]] = {}
    for i, (seg, _, _) in enumerate(picked):
        by_key.setdefault(rs.keys.queue(seg.stored).tasks, []).append(i)
    raws: list[Any] = [None] * len(picked)
    for key, idx in by_key.items():
        for i, raw in zip(idx, rs.redis.hmget(key, [picked[i][1] for i in idx]), strict=True):
            raws[i] = raw
    out = []
    for (seg, m, sc), raw in zip(picked, raws, strict=True):
        t = decode_task(rs, queue, m, raw, seg.state, sc)
        if t is not None:
            out.append(t)
    return out
