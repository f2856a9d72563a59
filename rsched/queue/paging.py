"""Tasks of a queue, one page at a time, resumed from an opaque cursor.

``rsched list`` reads the first N tasks; a console needs the page after the
one it shows without reading what came before. The tasks of a queue sit in
sorted sets (``proc``, ``sched``, ``dead``, see :mod:`rsched.core.keys`); a
page walks *groups* in a fixed order: processing, then due (the unparked
scores ``0..now``, then each parked type's lane, by type), then scheduled
(``(now..+inf``), then dead. A group has one *segment* per stored queue (the
queue, or each of its partitions), merged on the server in (due, member)
order: a k-way merge of each partition's ZRANGE windows, so a partitioned
queue's pages read like one queue's.

The cursor is where the last page stopped: the group and, per partition that
gave rows of it, the (score, member) of its last row. Resuming costs, per
partition, one pipelined ``ZSCORE`` + ``ZRANK`` (is that member still there,
with that score?) and one ``ZRANGE`` by rank, O(log N + page) whatever the
queue's size; when the member is gone (run,
cancelled), the page resumes after its score (``ZRANGEBYSCORE (score``,
which may skip a task of exactly that score: a live view, not a snapshot).
A type filter reads at most :data:`SCAN_BUDGET` members per page and then
hands back a cursor, so a rare type never makes one request read a whole
queue (such a page may be short, with a next page).

Measured on a 1,000,000-task queue (``tests/integration/web/bench_web.py``,
median of 25, on a loaded 2-core machine): the console's queue page renders in
3.9 ms (first page) and 6.5 ms (a cursor at the middle of the queue);
``/api/tasks?limit=100`` 6.0 ms. A merged page of 50 from a 16-partition
queue of 30,000 tasks: 3 ms (each partition's first window in one pipelined
round trip, ``ceil(page / partitions) + 8`` rows each).
"""

from __future__ import annotations

import base64
import json
from collections import deque
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

ORDER = ("processing", "due", "scheduled", "waiting", "dead")


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

    def order(self, score: float) -> float:
        """The merge key of a score: a parked lane's scores are shifted due times."""
        return float(K.due_of_score(score)) if self.lane else score


#: a group of segments merged by (due, member): (state, lane) -> one segment per stored queue
Group = tuple[tuple[str, str], list[_Segment]]


def _rank(ident: tuple[str, str]) -> tuple[int, int, str]:
    """A group's place in the page order (due: unparked first, then lanes by type)."""
    state, lane = ident
    return ORDER.index(state), 1 if lane else 0, lane


def _groups(rs: Context, query: TaskQuery, now: int) -> list[Group]:
    states = ORDER if query.state == "all" else (query.state,)
    stored = P.names(rs, query.queue)
    qs = [(name, rs.keys.queue(name)) for name in stored]
    out: list[Group] = []
    for st in states:
        if st == "processing":
            out.append(((st, ""), [_Segment(n, st, "", q.proc, "-inf", "+inf") for n, q in qs]))
        elif st == "dead":
            out.append(((st, ""), [_Segment(n, st, "", q.dead, "-inf", "+inf") for n, q in qs]))
        elif st == "waiting":
            out.append(((st, ""), [_Segment(n, st, "", q.waiting, "-inf", "+inf") for n, q in qs]))
        elif st == "scheduled":
            out.append(((st, ""), [_Segment(n, st, "", q.sched, f"({now}", "+inf") for n, q in qs]))
        else:
            out.append(((st, ""), [_Segment(n, st, "", q.sched, 0, now) for n, q in qs]))
            pipe = rs.redis.pipeline(transaction=False)
            for _, q in qs:
                pipe.hgetall(q.lanes)
            lanes_of = [got or {} for got in pipe.execute()]
            types = sorted({t for lanes in lanes_of for t in lanes if t != "#"})
            for t in types:
                if query.type is not None and t != query.type:
                    continue
                segs = []
                for (n, q), lanes in zip(qs, lanes_of, strict=True):
                    if t in lanes:
                        lo, hi = K.lane_bounds(int(lanes[t]))
                        segs.append(_Segment(n, st, t, q.sched, lo, hi))
                out.append(((st, t), segs))
    return out


def _below(score: float, hi: Any) -> bool:
    """``score`` within the upper bound ``hi`` (a number, ``+inf`` or ``(N``)."""
    if hi == "+inf":
        return True
    if isinstance(hi, str) and hi.startswith("("):
        return score < float(hi[1:])
    return score <= float(hi)


#: where a page stopped in each stored queue of its group: stored -> (score, member)
Positions = dict[str, tuple[float, str]]


def encode_cursor(ident: tuple[str, str] | list[str], positions: Positions) -> str:
    """A cursor: the group (state, lane) and, per stored queue that gave rows of
    it, the (score, member) of its last row (a stored queue not named starts at
    its segment's start: all its rows came after the page)."""
    at = [[name, sc, m] for name, (sc, m) in sorted(positions.items())]
    raw = json.dumps([ident[0], ident[1], at], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[tuple[str, str], Positions]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        state, lane, at = json.loads(raw)
        if state not in ORDER or not isinstance(lane, str) or not isinstance(at, list):
            raise ValueError
        positions: Positions = {}
        for name, score, member in at:
            if not isinstance(name, str) or not isinstance(member, str):
                raise ValueError
            positions[name] = (float(score), member)
        return (state, lane), positions
    except (ValueError, TypeError):
        raise BadInput("cursor", "is not a cursor this server handed out") from None


def _windows(
    rs: Context, asks: list[tuple[_Segment, tuple[float, str] | None]], n: int
) -> list[list[tuple[str, float]]]:
    """Up to ``n`` (member, score) of each segment after its position (or from its
    start): two pipelined round trips at most, however many segments."""
    r = rs.redis
    ranks: list[Any] = []
    resumed = [i for i, (_, after) in enumerate(asks) if after is not None]
    if resumed:
        pipe = r.pipeline(transaction=False)
        for i in resumed:
            seg, after = asks[i]
            assert after is not None
            pipe.zscore(seg.key, after[1])
            pipe.zrank(seg.key, after[1])
        got = pipe.execute()
        ranks = [None] * len(asks)
        for j, i in enumerate(resumed):
            now_score, rank = got[2 * j], got[2 * j + 1]
            after = asks[i][1]
            assert after is not None
            if now_score is not None and rank is not None and float(now_score) == after[0]:
                ranks[i] = rank
    pipe = r.pipeline(transaction=False)
    for i, (seg, after) in enumerate(asks):
        if after is None:
            pipe.zrangebyscore(seg.key, seg.lo, seg.hi, start=0, num=n, withscores=True)
        elif ranks[i] is not None:
            pipe.zrange(seg.key, ranks[i] + 1, ranks[i] + n, withscores=True)
        else:  # the member went away: after its score
            pipe.zrangebyscore(seg.key, f"({after[0]!r}", seg.hi, start=0, num=n, withscores=True)
    out = []
    for (seg, after), rows in zip(asks, pipe.execute(), strict=True):
        if after is not None:  # a range by rank: stop at the segment's end
            kept = []
            for m, sc in rows:
                if not _below(sc, seg.hi):
                    break
                kept.append((m, sc))
            rows = kept
        out.append(rows)
    return out


class _Merge:
    """The rows of one group's segments in (due, member) order: a k-way merge
    of each segment's ZRANGE windows, read ``chunk`` rows at a time."""

    def __init__(self, rs: Context, segs: list[_Segment], at: Positions, chunk: int):
        # several segments: each reads its share (and some), refilled when it runs out
        per = chunk if len(segs) == 1 else min(chunk, -(-chunk // len(segs)) + 8)
        self.rs, self.segs, self.chunk = rs, segs, per
        #: consumed up to (what the cursor keeps) and read up to (what Redis gave)
        self.at: Positions = {s.stored: at[s.stored] for s in segs if s.stored in at}
        self._read: dict[str, tuple[float, str] | None] = {
            s.stored: self.at.get(s.stored) for s in segs
        }
        self._buf: dict[str, deque[tuple[str, float]]] = {s.stored: deque() for s in segs}
        self._done: set[str] = set()
        self._started = False

    def next(self) -> tuple[_Segment, str, float] | None:
        if len(self.segs) == 1:  # one stored queue: nothing to merge
            seg = self.segs[0]
            buf = self._buf[seg.stored]
            if not buf and not self._fill(seg, buf):
                return None
            m, sc = buf.popleft()
            self.at[seg.stored] = (sc, m)
            return seg, m, sc
        if not self._started:  # every segment's first window in one batch
            self._started = True
            self._fill_all(self.segs)
        best: tuple[float, str, _Segment] | None = None
        for s in self.segs:
            buf = self._buf[s.stored]
            if not buf:
                self._fill(s, buf)
            if buf:
                m, sc = buf[0]
                k = (s.order(sc), m)
                if best is None or k < best[:2]:
                    best = (k[0], m, s)
        if best is None:
            return None
        seg = best[2]
        m, sc = self._buf[seg.stored].popleft()
        self.at[seg.stored] = (sc, m)
        return seg, m, sc

    def _fill(self, s: _Segment, buf: deque[tuple[str, float]]) -> bool:
        """Read the next window of ``s`` into ``buf``: whether it gave rows."""
        self._fill_all([s])
        return bool(buf)

    def _fill_all(self, segs: list[_Segment]) -> None:
        asks = [s for s in segs if s.stored not in self._done]
        if not asks:
            return
        windows = _windows(self.rs, [(s, self._read[s.stored]) for s in asks], self.chunk)
        for s, rows in zip(asks, windows, strict=True):
            if len(rows) < self.chunk:
                self._done.add(s.stored)
            if rows:
                self._buf[s.stored].extend(rows)
                self._read[s.stored] = (rows[-1][1], rows[-1][0])


def page(rs: Context, query: TaskQuery, cursor: str | None = None) -> Page:
    """``query.limit`` tasks of ``query`` from ``cursor`` on, and the next page's cursor.

    The stored queues of a partitioned queue are merged state by state (and
    parked lane by lane) in (due, member) order, so its pages read like one
    queue's; the cursor keeps each partition's place."""
    now = rs.now_ms()
    groups = _groups(rs, query, now)
    start = 0
    at: Positions = {}
    if cursor:
        ident, at = decode_cursor(cursor)
        idents = [g[0] for g in groups]
        if ident in idents:
            start = idents.index(ident)
        else:  # a lane that emptied: go on from the first group after its place
            later = [i for i, g in enumerate(groups) if _rank(g[0]) > _rank(ident)]
            start, at = (later[0] if later else len(groups)), {}
    prefix = f"{query.type} " if query.type else None
    want = query.limit
    chunk = want + 1 if prefix is None else max(200, want + 1)
    # (segment, member, score, the group's positions after it): one more than a page
    picked: list[tuple[_Segment, str, float, tuple[tuple[str, str], Positions]]] = []
    scanned = 0
    last: tuple[tuple[str, str], _Merge] | None = None  # its positions: after the last read
    for ident, segs in groups[start:]:
        merge = _Merge(rs, segs, at, chunk)
        at = {}
        while len(picked) <= want:
            got = merge.next()
            if got is None:
                break
            seg, m, sc = got
            scanned += 1
            last = (ident, merge)
            if prefix is None or m.startswith(prefix):
                picked.append((seg, m, sc, (ident, dict(merge.at))))
            if prefix is not None and scanned >= SCAN_BUDGET:
                break
        if len(picked) > want or (prefix is not None and scanned >= SCAN_BUDGET):
            break
    more = len(picked) > want
    picked = picked[:want]
    tasks = _decode_all(rs, query.queue, [(seg, m, sc) for seg, m, sc, _ in picked])
    nxt = None
    if more:
        nxt = encode_cursor(*picked[-1][3])
    elif prefix is not None and scanned >= SCAN_BUDGET and last is not None:
        nxt = encode_cursor(last[0], last[1].at)
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
