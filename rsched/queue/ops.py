"""Queue operations: add, cancel, show, list, queue stats, stale recovery,
dead-letter handling, pause/resume. Writes go through the Lua core
(``rsched/lua``); reads are plain commands. The record format is in
:mod:`rsched.queue.model`.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from rsched.core import keys as K
from rsched.core import validate
from rsched.core.conn import time_reply_ms
from rsched.core.errors import BadInput, Conflict, NotFound, RedisFull, WrongKeyType, map_error
from rsched.core.timeutil import iso
from rsched.lua import calls
from rsched.queue import queues as P
from rsched.queue.model import (
    BATCH,
    IF_EXISTS,
    AddResult,
    QueueStats,
    Task,
    TaskQuery,
    TaskRef,
    TaskSpec,
)
from rsched.queue.specs import make_spec, task_query, task_ref

if TYPE_CHECKING:  # pragma: no cover
    from rsched.context import Context


def _args(spec: TaskSpec) -> tuple[Any, ...]:
    due = f"+{spec.delay_ms or 0}" if spec.at_ms is None else str(spec.at_ms)
    if spec.priority:
        return (spec.member, due, spec.payload_json, spec.max_attempts, spec.priority)
    return (spec.member, due, spec.payload_json, spec.max_attempts)


def _check_if_exists(if_exists: str) -> None:
    if if_exists not in IF_EXISTS:
        raise BadInput("--if-exists", f"{if_exists!r} is not one of {', '.join(IF_EXISTS)}")


def _results(specs: list[TaskSpec], flat: list[Any]) -> list[AddResult]:
    out = []
    for i, s in enumerate(specs):
        status, state, due = flat[3 * i : 3 * i + 3]
        out.append(AddResult(status, _spec_task(s, state, due)))
    return out


def _spec_task(s: TaskSpec, state: str, due: Any) -> Task:
    """The task a spec was written as (its record is the spec's)."""
    return Task(
        s.type,
        s.id,
        s.queue,
        state,
        int(due),
        0,
        s.max_attempts or None,
        None if s.payload_json == "null" else json.loads(s.payload_json),
        None,
        priority=s.priority,
    )


def add(
    rs: Context, task_type: str, task_id: str, *, if_exists: str = "keep", **kw: Any
) -> AddResult:
    """Schedule one task. ``delay`` (ms or "30m") or ``at`` (epoch ms, ISO text,
    aware datetime); neither = due now. Existing task: ``if_exists``."""
    _check_if_exists(if_exists)
    want = kw.pop("partitions", None)
    return add_spec(rs, make_spec(task_type, task_id, **kw), if_exists=if_exists, partitions=want)


def add_spec(
    rs: Context, spec: TaskSpec, *, if_exists: str = "keep", partitions: int | None = None
) -> AddResult:
    """Schedule one validated task (``if_exists`` one of :data:`IF_EXISTS`) in one
    round trip: ``add-7`` (which answers what a kept task's result needs, and the
    server's clock, :attr:`AddResult.now_ms`) and the queue's entry in the list
    of queues, pipelined, with the ``queue-config`` read that checks an
    unpartitioned queue is still one (see :mod:`rsched.queue.queues`).

    The keys' types are checked on the first add of a queue per connection
    (:class:`~rsched.core.errors.WrongKeyType` naming the key)."""
    queue = spec.queue
    if spec.after:
        return _add_after(rs, spec, if_exists, partitions)
    n = P.resolve(rs, queue, partitions)
    known = P.known(rs)
    if n is None:  # taken to be unpartitioned: add-7 refuses if it is not
        # queue-config is read on this context's first add to the queue (a queue
        # partitioned by an earlier version has no "#partitions" field to refuse by)
        first = queue not in known.ready
        before = [("HGET", rs.keys.queue_config, queue)] if first else []
        stored_n, reply, registered = _add_one(rs, spec, queue, if_exists, "p", before)
        P.learn(rs, queue, stored_n)
        if reply[0] != "partitioned":
            if stored_n is None or int(stored_n) <= 1:
                known.ready.add(queue)
                return _add_result(rs, spec, queue, reply, registered)
            # Partitioned by an earlier version: the task went to the unpartitioned
            # keys. Take it back, and mark the queue.
            _unmark_stray(rs, queue, spec, reply, int(stored_n))
        n = P.count(rs, queue, partitions)  # known now, or the slow way
    stored = queue if n == 1 else K.partition_name(queue, K.partition_index(spec.type, spec.id, n))
    _, reply, registered = _add_one(rs, spec, stored, if_exists, "", [])
    return _add_result(rs, spec, stored, reply, registered)


def _add_one(
    rs: Context, spec: TaskSpec, stored: str, if_exists: str, checks: str, before: list[Any]
) -> tuple[Any, Any, Any]:
    """One pipelined add: (the ``before`` reply or None, add-7's, SADD's); add-7's
    refusal raised, a refusal of the SADD returned (the task is written)."""
    known = P.known(rs)
    if stored not in known.checked:
        checks += "t"
    q = known.keys.get(stored)
    if q is None:
        q = known.keys[stored] = rs.keys.queue(stored)
    res = calls.add_one(
        rs,
        q,
        if_exists,
        _args(spec),
        checks=checks + "P" if spec.priority else checks,
        before=before,
        after=[("SADD", rs.keys.queues, spec.queue)],
    )
    first = res[0] if before else None
    reply, registered = res[-2], res[-1]
    if isinstance(reply, Exception):
        err = map_error(reply)
        if isinstance(registered, int) and registered == 1 and isinstance(err, WrongKeyType):
            try:  # registered by this call, for a queue that cannot hold tasks: undo
                rs.redis.execute_command("SREM", rs.keys.queues, spec.queue)
            except Exception:  # noqa: BLE001 - the error below is the one to report
                pass
        if isinstance(err, RedisFull):
            what = f"task {spec.type} {spec.id} in queue {spec.queue}"
            raise RedisFull(f"{err}; {what} was not added") from reply
        if err is reply:
            raise reply
        raise err from reply
    if isinstance(first, Exception):
        raise map_error(first) from first
    known.checked.add(stored)
    return first, reply, registered


def after_refused(queue: str, n: int) -> BadInput:
    """The refusal of ``--after`` on a partitioned queue: a task and its parents sit
    in partitions picked by their own TYPE ID, so in different slots in general,
    and one Lua script (one slot) must see both to release or kill atomically."""
    return BadInput(
        "--after",
        f"queue {queue} is partitioned ({n} partitions): a task with --after must be in "
        "an unpartitioned queue, with its parents",
    )


def _add_after(rs: Context, spec: TaskSpec, if_exists: str, partitions: int | None) -> AddResult:
    """Add one task that waits for ``spec.after`` (``add-after-9``); a parent not
    in the queue: :class:`NotFound` naming it, nothing written."""
    queue = spec.queue
    if partitions is not None and partitions > 1:
        raise after_refused(queue, partitions)
    n = P.count(rs, queue, partitions)
    if n > 1:
        raise after_refused(queue, n)
    q = rs.keys.queue(queue)
    due = f"+{spec.delay_ms or 0}" if spec.at_ms is None else str(spec.at_ms)
    reply = calls.add_after(
        rs,
        q,
        if_exists,
        spec.member,
        due,
        spec.payload_json,
        spec.max_attempts,
        spec.priority,
        spec.after,
    )
    what = reply[0]
    if what == "missing":
        raise NotFound(f"--after: no task {reply[1]} in queue {queue}; nothing was added")
    if what == "partitioned":
        raise after_refused(queue, int(reply[1]))
    rs.redis.execute_command("SADD", rs.keys.queues, queue)
    if what == "kept":
        return _add_result(rs, spec, queue, reply, 0)
    state, due_ms, now = reply[1:4]
    task = _spec_task(spec, str(state), due_ms)
    if state == "waiting":
        task.waiting_for = list(spec.after)
    else:  # a parent was dead already: so is the task
        task.last_error = f"parent {reply[4]} is dead"
    return AddResult(str(what), task, now_ms=int(now), stored_queue=queue)


def _unmark_stray(rs: Context, queue: str, spec: TaskSpec, reply: Any, parts: int) -> None:
    """Undo an add to the unpartitioned keys of a partitioned queue, and give the
    queue its "#partitions" field so that add-7 refuses the next such add."""
    q = rs.keys.queue(queue)
    pipe = rs.redis.pipeline(transaction=False)
    if reply[0] == "added":  # (kept or replaced: it was there before; leave it)
        pipe.execute_command("HDEL", q.tasks, spec.member)
        pipe.execute_command("ZREM", q.sched, spec.member)
    pipe.execute_command("HSET", q.tasks, P.PARTITIONS_FIELD, parts)
    _exec(pipe)


def _add_result(
    rs: Context, spec: TaskSpec, stored: str, reply: list[Any], registered: Any
) -> AddResult:
    if reply[0] == "kept":
        status, state, _, now, raw, score = reply
        task = decode_task(rs, spec.queue, spec.member, raw, state, float(score))
        assert task is not None
    else:
        status, due, now = reply
        task = _spec_task(spec, "due" if due <= now else "scheduled", due)
    result = AddResult(status, task, now_ms=int(now), stored_queue=stored)
    if isinstance(registered, Exception):
        err = map_error(registered)
        if not isinstance(err, RedisFull):
            raise err from registered
        # The task's own write took the last room.
        what = f"task {spec.type} {spec.id} in queue {spec.queue}"
        raise RedisFull(
            f"{err}; {what} was added, but its queue could not be entered in the list "
            "of queues (`rsched queues`); adding it again keeps the task and does that"
        ) from registered
    return result


def cancel(rs: Context, task_type: str, task_id: str, queue: str = "default") -> str:
    """Remove a task; returns the state it was in. A running task's handler is
    stopped by its consumer (told on the queue's cancel channel) and the run is
    recorded ``cancelled``."""
    return cancel_ref(rs, task_ref(task_type, task_id, queue))


def cancel_ref(rs: Context, ref: TaskRef) -> str:
    """:func:`cancel` of a validated reference."""
    stored = P.of_task(rs, ref.queue, ref.type, ref.id)
    ident = rs.identity()
    state = calls.cancel(
        rs,
        rs.keys.queue(stored),
        ref.member,
        rs.history_maxlen,
        stored,
        f"{ident['host']} pid {ident['pid']}",
    )
    if not state:
        raise NotFound(f"no task {ref.type} {ref.id} in queue {ref.queue}")
    return str(state)


#: A record's positions when left out (see the module docstring).
_REC_DEFAULTS = ["null", 0, 0, "", "", None, 0, 0, None, None]


def _progress(value: Any) -> dict[str, Any] | None:
    """A record's progress entry [fraction, message, at_ms] -> its JSON form."""
    if not isinstance(value, list) or len(value) != 3:
        return None
    at = int(value[2])
    return {"fraction": value[0], "message": value[1], "at": iso(at), "at_ms": at}


def decode_task(
    rs: Context, queue: str, m: str, raw: str | None, state: str, score: float | None
) -> Task | None:
    if raw is None:
        return None
    t, i = K.split_member(m)
    r = json.loads(raw)
    r.extend(_REC_DEFAULTS[len(r) :])
    try:
        payload = json.loads(r[0])
    except (TypeError, ValueError):
        payload = r[0]
    in_record = int(r[5]) if r[5] else None
    if state in ("processing", "dead") or score is None:
        due = in_record
    else:
        due = K.due_of_score(score)  # a parked task's score is in its type's lane
    return Task(
        type=t,
        id=i,
        queue=queue,
        state=state,
        due_ms=due,
        attempts=int(r[1] or 0),
        max_attempts=int(r[2] or 0) or None,
        payload=payload,
        last_error=r[4] or None,
        lease_ms=int(score) if score is not None and state in ("processing", "dead") else None,
        priority=int(r[7] or 0),
        progress=_progress(r[8]),
        waiting_for=list(r[9]) if isinstance(r[9], list) else [],
    )


def show(rs: Context, task_type: str, task_id: str, queue: str = "default") -> Task:
    return show_ref(rs, task_ref(task_type, task_id, queue))


def show_ref(rs: Context, ref: TaskRef) -> Task:
    """:func:`show` of a validated reference."""
    task_type, task_id, queue = ref.type, ref.id, ref.queue
    q = rs.keys.queue(P.of_task(rs, queue, task_type, task_id))
    m = ref.member
    pipe = rs.redis.pipeline(transaction=False)
    # A cluster pipeline refuses keyless commands (TIME): ask for the time first.
    clustered = _is_cluster(rs.redis)
    if not clustered:
        pipe.time()
    pipe.hget(q.tasks, m)
    pipe.zscore(q.sched, m)
    pipe.zscore(q.proc, m)
    pipe.zscore(q.dead, m)
    pipe.zscore(q.ready, m)
    pipe.zscore(q.waiting, m)
    if clustered:
        now = rs.now_ms()
        raw, s, p, d, rd, w = _exec(pipe)
    else:
        t, raw, s, p, d, rd, w = _exec(pipe)
        now = time_reply_ms(t)
    if raw is None:
        raise NotFound(f"no task {task_type} {task_id} in queue {queue}")
    if s is not None:
        state, score = ("due" if s <= now else "scheduled"), s
    elif rd is not None:
        state, score = "due", float(K.ready_due(rd)[0])
    elif p is not None:
        state, score = "processing", p
    elif d is not None:
        state, score = "dead", d
    elif w is not None:
        state, score = "waiting", w
    else:
        state, score = "orphan", None
    task = decode_task(rs, queue, m, raw, state, score)
    assert task is not None
    return task


def _is_cluster(client: Any) -> bool:
    import sys

    rc = sys.modules.get("redis.cluster")  # never imported for the one-shot client
    return rc is not None and isinstance(client, rc.RedisCluster)


def _exec(pipe: Any) -> list[Any]:
    from rsched.core.errors import map_error

    try:
        return pipe.execute()
    except Exception as exc:
        raise map_error(exc) from exc


def list_tasks(
    rs: Context,
    queue: str = "default",
    *,
    state: str = "all",
    task_type: str | None = None,
    limit: int = 100,
) -> list[Task]:
    """Tasks soonest first, at most ``limit``; reads in pages, never a whole queue."""
    return list_query(rs, task_query(queue, state=state, task_type=task_type, limit=limit))


def list_query(rs: Context, query: TaskQuery) -> list[Task]:
    """:func:`list_tasks` of a validated query."""
    queue, state, task_type, limit = query.queue, query.state, query.type, query.limit
    stored = P.names(rs, queue)
    if len(stored) > 1:  # each partition's first `limit`, merged in the same order
        rank = {"processing": 0, "due": 1, "scheduled": 2, "waiting": 3, "dead": 4}
        merged: list[Task] = []
        for name in stored:
            for t in _list_stored(rs, name, state, task_type, limit):
                t.queue = queue
                merged.append(t)
        key = rank.get if state == "all" else None
        merged.sort(key=lambda t: (key(t.state, 9) if key else 0, t.due_ms or 0))
        return merged[:limit]
    return _list_stored(rs, queue, state, task_type, limit)


def _list_stored(
    rs: Context, queue: str, state: str, task_type: str | None, limit: int
) -> list[Task]:
    q = rs.keys.queue(queue)
    now = rs.now_ms()
    order = ["processing", "due", "scheduled", "waiting", "dead"] if state == "all" else [state]
    out: list[Task] = []
    prefix = f"{task_type} " if task_type else None
    for st in order:
        want = limit - len(out)
        if st == "due":
            rows = _due_rows(rs, q, now, want, task_type)
        else:
            key = {
                "processing": q.proc,
                "scheduled": q.sched,
                "dead": q.dead,
                "waiting": q.waiting,
            }[st]
            lo, hi = (f"({now}", "+inf") if st == "scheduled" else ("-inf", "+inf")
            rows = _range_rows(rs, key, lo, hi, want, prefix)
        if rows:
            raws = rs.redis.hmget(q.tasks, [m for m, _ in rows])
            for (m, sc), raw in zip(rows, raws, strict=True):
                t = decode_task(rs, queue, m, raw, st, sc)
                if t is not None and len(out) < limit:
                    out.append(t)
        if len(out) >= limit:
            break
    return out


def _range_rows(
    rs: Context, key: str, lo: Any, hi: Any, limit: int, prefix: str | None
) -> list[tuple[str, float]]:
    """Up to ``limit`` (member, score) of ``key`` in [lo, hi], in score order, of
    members starting with ``prefix``; read in pages, never the whole set at once."""
    out: list[tuple[str, float]] = []
    offset = 0
    page = max(limit, 200)
    while len(out) < limit:
        rows = rs.redis.zrangebyscore(key, lo, hi, start=offset, num=page, withscores=True)
        if not rows:
            break
        offset += len(rows)
        out.extend((m, sc) for m, sc in rows if prefix is None or m.startswith(prefix))
        if len(rows) < page:
            break
    return out[:limit]


def _due_rows(
    rs: Context, q: Any, now: int, limit: int, task_type: str | None
) -> list[tuple[str, float]]:
    """The ``limit`` soonest due tasks by their real due time: the unparked ones
    (scores 0..now) merged with each parked type's lane (scores below 0, see
    ``lua/_lanes.lua``), each read up to ``limit``."""
    prefix = f"{task_type} " if task_type else None
    rows = _range_rows(rs, q.sched, 0, now, limit, prefix)
    lanes = {t: int(v) for t, v in (rs.redis.hgetall(q.lanes) or {}).items() if t != "#"}
    for t, lane in lanes.items():
        if task_type is not None and t != task_type:
            continue
        lo, hi = K.lane_bounds(lane)
        rows += _range_rows(rs, q.sched, lo, hi, limit, prefix)
    ready = [
        (m, float(K.ready_due(sc)[0]))
        for m, sc in _range_rows(rs, q.ready, "-inf", "+inf", limit, prefix)
    ]
    if ready:
        rows += ready
    if lanes or ready:
        rows.sort(key=lambda r: (K.due_of_score(r[1]), r[0]))
    return rows[:limit]


def known_queues(rs: Context) -> list[str]:
    return sorted(rs.redis.execute_command("SMEMBERS", rs.keys.queues))


# Plain commands below, their replies read by these: the one-shot client of
# rsched.core.resp (`rsched queues` starts without redis-py) answers as RESP2
# does; redis-py may speak RESP3 and convert some replies itself.


def _scored(reply: Any) -> list[tuple[str, float]]:
    """A ``Z*`` reply ``WITHSCORES``: flat (RESP2) or pairs (RESP3, redis-py's tuples)."""
    if reply and isinstance(reply[0], list | tuple):
        return [(m, float(sc)) for m, sc in reply]
    return [(reply[i], float(reply[i + 1])) for i in range(0, len(reply or ()), 2)]


def _hash(reply: Any) -> dict[str, Any]:
    """An ``HGETALL`` reply: a dict (redis-py) or a flat list (RESP2)."""
    if isinstance(reply, dict):
        return reply
    return dict(zip(reply[0::2], reply[1::2], strict=True)) if reply else {}


def _stored_names(rs: Context, queues: list[str]) -> list[str]:
    """Queues -> the stored queues behind them (partitions in order)."""
    stored = P.names_many(rs, queues)
    return [name for q in queues for name in stored[q]]


def _runs(globs: set[str], task_type: str) -> bool:
    import fnmatch

    return any(g == "*" or fnmatch.fnmatchcase(task_type, g) for g in globs)


#: Commands per partition in queue_stats' first round trip.
ROW = 12


def queue_stats(rs: Context, queues: list[str] | None = None) -> list[QueueStats]:
    """One row per queue; a partitioned queue's partitions summed into its row.

    One pipelined round trip of 11 commands per partition (``ROW``): the counts,
    the lowest score, the next due task, the live consumers, the pause switch,
    the due tasks of a priority other than 0 (``ready``) and the rate limit.
    Only a partition whose lowest score is below 0 holds parked tasks (tasks a
    consumer could not run; see rsched/core/keys.py): for those alone, two more
    round trips read the lanes of parked types, the live consumers' registered
    types and the oldest unparked task, then per parked type its count and
    oldest task."""
    names = queues if queues is not None else known_queues(rs)
    stored = P.names_many(rs, names)
    flat = [part for name in names for part in stored[name]]
    now = rs.now_ms()
    pipe = rs.redis.pipeline(transaction=False)
    for part in flat:
        q = rs.keys.queue(part)
        cmd = pipe.execute_command
        cmd("ZCARD", q.sched)
        cmd("ZCOUNT", q.sched, "-inf", now)
        cmd("ZCARD", q.proc)
        cmd("ZCOUNT", q.proc, "-inf", now)
        cmd("ZCARD", q.dead)
        cmd("ZRANGE", q.sched, 0, 0, "WITHSCORES")
        cmd("ZRANGEBYSCORE", q.sched, f"({now}", "+inf", "LIMIT", 0, 1, "WITHSCORES")
        cmd("ZRANGEBYSCORE", q.consumers, f"({now}", "+inf")
        cmd("EXISTS", q.paused)
        cmd("ZCARD", q.ready)
        cmd("GET", q.ratelimit)
        cmd("ZCARD", q.waiting)
    res = _exec(pipe) if flat else []
    rows = [res[ROW * j : ROW * j + ROW] for j in range(len(flat))]
    for row in rows:
        row[5], row[6] = _scored(row[5]), _scored(row[6])
    # Partitions with parked tasks: their lanes, consumers' types, oldest unparked task.
    parked_parts = [j for j, row in enumerate(rows) if row[5] and row[5][0][1] < 0]
    lanes_of: list[list[tuple[str, int]]] = [[] for _ in flat]
    handles_of: list[dict[str, Any]] = [{} for _ in flat]
    for row in rows:
        row.append(row[5] if row[5] and row[5][0][1] >= 0 else [])  # [ROW]: oldest unparked
    if parked_parts:
        pipe = rs.redis.pipeline(transaction=False)
        for j in parked_parts:
            q = rs.keys.queue(flat[j])
            pipe.execute_command("HGETALL", q.lanes)
            pipe.execute_command("HGETALL", q.handles)
            pipe.execute_command("ZRANGEBYSCORE", q.sched, 0, "+inf", "LIMIT", 0, 1, "WITHSCORES")
        got = _exec(pipe)
        for n, j in enumerate(parked_parts):
            lanes_of[j] = [(t, int(v)) for t, v in _hash(got[3 * n]).items() if t != "#"]
            handles_of[j] = _hash(got[3 * n + 1])
            rows[j][ROW] = _scored(got[3 * n + 2])
    # Every parked type's count and oldest task.
    pipe = rs.redis.pipeline(transaction=False)
    for j, part in enumerate(flat):
        sched_key = rs.keys.queue(part).sched
        for _, lane in lanes_of[j]:
            lo, hi = K.lane_bounds(lane)
            pipe.execute_command("ZCOUNT", sched_key, lo, hi)
            pipe.execute_command("ZRANGEBYSCORE", sched_key, lo, hi, "LIMIT", 0, 1, "WITHSCORES")
    parked = _exec(pipe) if any(lanes_of) else []
    for j in range(1, len(parked), 2):
        parked[j] = _scored(parked[j])
    out = []
    i = 0
    k = 0
    part_names = flat
    for name in names:
        total = due = proc = stale = dead = lag = consumers = 0
        nxt_ms: int | None = None
        paused = False
        unrunnable = unrunnable_lag = 0
        unrunnable_types: set[str] = set()
        rate_text, throttled = None, False
        type_rates: dict[str, str] = {}
        throttled_types: set[str] = set()
        waiting = 0
        for _ in stored[name]:
            t, d, pr, st, de, _lowest, nxt, live, pa, rd, rl, wt, first = rows[i]
            waiting += wt
            queue_rate, per_type = _stored_rates(rl)
            if queue_rate is not None:
                rate_text = queue_rate[2]
                throttled = throttled or _throttled(rs, part_names[i], queue_rate, now)
            for ttype, n, w, text in per_type:
                type_rates[ttype] = text
                if _type_throttled(rs, part_names[i], ttype, n, w, now):
                    throttled_types.add(ttype)
            t, d = t + rd, d + rd  # due tasks of a priority other than 0 (out of sched)
            lanes, handles = lanes_of[i], handles_of[i]
            i += 1
            total, due, proc, stale, dead = total + t, due + d, proc + pr, stale + st, dead + de
            if first and first[0][1] <= now:
                lag = max(lag, now - int(first[0][1]))
            if nxt:
                nxt_ms = int(nxt[0][1]) if nxt_ms is None else min(nxt_ms, int(nxt[0][1]))
            consumers = max(consumers, len(live))  # a consumer registers in every partition
            paused = paused or bool(pa)
            # What the live consumers run (one of an older version registers nothing:
            # it takes every type).
            globs: set[str] = set()
            for cid in live:
                try:
                    globs.update(json.loads(handles[cid]))
                except (KeyError, TypeError, ValueError):
                    globs.add("*")
            unparked = d
            for task_type, _ in lanes:
                count, oldest = parked[k], parked[k + 1]
                k += 2
                if not count:
                    continue
                unparked -= count
                age = now - K.due_of_score(oldest[0][1])
                lag = max(lag, age)
                if not _runs(globs, task_type):
                    unrunnable += count
                    unrunnable_lag = max(unrunnable_lag, age)
                    unrunnable_types.add(task_type)
            if not live and unparked > 0:  # nobody at all: every due task waits
                unrunnable += unparked
                unrunnable_lag = max(unrunnable_lag, now - int(first[0][1]))
        n = len(stored[name])
        out.append(
            QueueStats(
                queue=name,
                scheduled=total - due,
                due=due,
                processing=proc,
                stale=stale,
                dead=dead,
                next_due_ms=nxt_ms,
                lag_ms=lag,
                consumers=consumers,
                paused=paused,
                extra={"partitions": n} if n > 1 else {},
                unrunnable=unrunnable,
                unrunnable_lag_ms=unrunnable_lag,
                unrunnable_types=sorted(unrunnable_types),
                rate_limit=rate_text,
                throttled=throttled,
                waiting=waiting,
                type_rate_limits=type_rates,
                throttled_types=sorted(throttled_types),
            )
        )
    return out


_RATE_LINE = re.compile(r"(\d+) (\d+) (.+)")
_TYPE_RATE_LINE = re.compile(r"(\d+) (\d+) (\S+) (.+)")


def _stored_rates(
    raw: str | None,
) -> tuple[tuple[int, int, str] | None, list[tuple[str, int, int, str]]]:
    """The limits the consumers stored (claim-18's ARGV[12]): the queue's (N, window
    ms, text) or None, and each type's (type, N, window ms, text); a line that is not
    of that form (the key is someone else's) is left out, as the claim script does."""
    if not raw:
        return None, []
    queue_line, *type_lines = raw.split("\n")
    m = _RATE_LINE.fullmatch(queue_line)
    queue_rate = (int(m[1]), int(m[2]), m[3]) if m else None
    per_type = [
        (m[3], int(m[1]), int(m[2]), m[4]) for m in map(_TYPE_RATE_LINE.fullmatch, type_lines) if m
    ]
    return queue_rate, per_type


def _throttled(rs: Context, stored: str, rate: tuple[int, int, str], now: int) -> bool:
    """Whether the window of a stored queue's rate limit is full (its claims score
    below K.LANE_MS in the window ZSET; the types' above)."""
    n, w = rate[0], rate[1]
    used = rs.redis.execute_command(
        "ZCOUNT", rs.keys.queue(stored).rate, f"({now - w}", f"({K.LANE_MS}"
    )
    return int(used) >= n


def _type_throttled(rs: Context, stored: str, task_type: str, n: int, w: int, now: int) -> bool:
    """Whether a type's window (``type_rate_limits``) is full: its claims score its
    lane * K.LANE_MS + when claimed (claim-18)."""
    q = rs.keys.queue(stored)
    lane = rs.redis.execute_command("HGET", q.lanes, task_type)
    if lane is None:
        return False
    base = int(lane) * K.LANE_MS
    used = rs.redis.execute_command("ZCOUNT", q.rate, f"({base + now - w}", base + now)
    return int(used) >= n


def requeue_stale(
    rs: Context, queue: str | None = None, *, dry_run: bool = False, default_max: int | None = None
) -> dict[str, int]:
    """Move tasks whose lease expired back to due (dead after their last attempt)."""
    names = [validate.queue(queue)] if queue else known_queues(rs)
    total = {"requeued": 0, "dead": 0}
    for name in _stored_names(rs, names):
        q = rs.keys.queue(name)
        dm = default_max or rs.default_max_attempts(K.logical_queue(name))
        while True:
            rq, rd, more = calls.requeue_stale(rs, q, BATCH, dry_run, rs.history_maxlen, name, dm)
            total["requeued"] += rq
            total["dead"] += rd
            if not more:
                break
    return total


def retry(rs: Context, queue: str, items: list[tuple[str, str]]) -> int:
    validate.queue(queue)
    by_stored: dict[str, list[str]] = {}
    for t, i in items:
        m = K.member(validate.task_type(t), validate.task_id(i))
        by_stored.setdefault(P.of_task(rs, queue, t, i), []).append(m)
    n = 0
    for name, members in by_stored.items():
        q = rs.keys.queue(name)
        n += calls.retry(rs, q, members)
    if n == 0 and len(items) == 1:
        t, i = items[0]
        if rs.redis.hexists(q.tasks, members[0]):
            raise Conflict(f"task {t} {i} in queue {queue} is not dead")
        raise NotFound(f"no task {t} {i} in queue {queue}")
    return n


def retry_all(rs: Context, queue: str | None = None) -> int:
    names = [validate.queue(queue)] if queue else known_queues(rs)
    n = 0
    for name in _stored_names(rs, names):
        q = rs.keys.queue(name)
        while True:
            members = rs.redis.zrange(q.dead, 0, BATCH - 1)
            if not members:
                break
            n += calls.retry(rs, q, members)
    return n


def purge_dead(rs: Context, queue: str | None = None, older_than_ms: int | None = None) -> int:
    names = [validate.queue(queue)] if queue else known_queues(rs)
    n = 0
    for name in _stored_names(rs, names):
        q = rs.keys.queue(name)
        while True:
            deleted, more = calls.purge(rs, q, older_than_ms, BATCH)
            n += deleted
            if not more:
                break
    return n


def dead_tasks(rs: Context, queue: str | None = None, limit: int = 100) -> list[Task]:
    names = [validate.queue(queue)] if queue else known_queues(rs)
    out: list[Task] = []
    for name in names:
        out.extend(list_tasks(rs, name, state="dead", limit=limit))
    out.sort(key=lambda t: t.lease_ms or 0, reverse=True)
    return out[:limit]


def pause(rs: Context, queue: str, *, create: bool = True) -> bool:
    """Pause ``queue``'s consumers; returns whether the queue was known before.
    ``create=False``: a queue that is not in the registry (no task was ever added
    to it) is refused (NotFound) and nothing is written."""
    validate.queue(queue)
    if not create:
        _check_known(rs, queue, "paused")
    pipe = rs.redis.pipeline(transaction=False)
    pipe.sadd(rs.keys.queues, queue)
    for name in P.names(rs, queue):
        pipe.set(rs.keys.queue(name).paused, "1")
    return not int(_exec(pipe)[0])


def resume(rs: Context, queue: str, *, create: bool = True) -> bool:
    """Resume ``queue``; returns whether it was paused. ``create=False``: an unknown
    queue is refused (NotFound)."""
    validate.queue(queue)
    if not create:
        _check_known(rs, queue, "resumed")
    was = False
    for name in P.names(rs, queue):
        q = rs.keys.queue(name)
        pipe = rs.redis.pipeline(transaction=True)
        pipe.delete(q.paused)
        pipe.zadd(q.wake, {"w": 0})
        was = bool(int(_exec(pipe)[0])) or was
    return was


def _check_known(rs: Context, queue: str, verb: str) -> None:
    """NotFound unless ``queue`` is in the queue registry."""
    if not int(rs.redis.execute_command("SISMEMBER", rs.keys.queues, queue)):
        raise NotFound(
            f'no queue "{queue}": no task was ever added to it; nothing was {verb} '
            f"(--create {verb[:-1]}s it anyway)"
        )


#: Members per ZSCAN page and per ``cancel-batch-9`` call of :func:`cancel_all`.
CANCEL_PAGE = 500


def cancel_all(
    rs: Context,
    task_type: str,
    queue: str = "default",
    *,
    state: str = "all",
    dry_run: bool = False,
) -> int:
    """Cancel every task of ``task_type`` in ``queue`` (every partition) in
    ``state`` ("all": any), each as :func:`cancel` does (a running one's handler
    is stopped); returns how many (``dry_run``: how many would be, nothing written).

    Paged on the server: each of the queue's sets is read with ``ZSCAN MATCH "TYPE *"``,
    :data:`CANCEL_PAGE` members at a time, and each page cancelled by one
    ``cancel-batch-9`` call, which checks each task's state by the server's clock.
    A dry run counts the same pages, by the server's clock at its start (ZSCAN may
    return a member twice while Redis resizes a large set: a dry run then counts it
    twice; a real run cancels it once)."""
    query = task_query(queue, state=state, task_type=task_type, limit=1)
    if query.type is None:
        raise BadInput("--type", "is required with --all (cancel every task of one type)")
    ident = rs.identity()
    by = f"{ident['host']} pid {ident['pid']}"
    want = "" if query.state == "all" else query.state
    match = f"{query.type} *"
    total = 0
    for stored in P.names(rs, query.queue):
        q = rs.keys.queue(stored)
        now = rs.now_ms() if dry_run else 0
        sets = {
            "": [q.sched, q.ready, q.proc, q.dead, q.waiting],
            "scheduled": [q.sched],
            "due": [q.sched, q.ready],
            "processing": [q.proc],
            "dead": [q.dead],
            "waiting": [q.waiting],
        }[want]
        for key in sets:
            cursor: Any = 0
            while True:
                cursor, rows = rs.redis.zscan(key, cursor, match=match, count=CANCEL_PAGE)
                if dry_run:
                    total += sum(1 for _m, sc in rows if _in_state(key, q, sc, want, now))
                elif rows:
                    members = [m for m, _sc in rows]
                    for i in range(0, len(members), CANCEL_PAGE):
                        n, _running = calls.cancel_batch(
                            rs, q, members[i : i + CANCEL_PAGE], want, rs.history_maxlen, stored, by
                        )
                        total += n
                if not int(cursor):
                    break
    return total


def _in_state(key: str, q: K.QueueKeys, score: float, want: str, now: int) -> bool:
    """Whether a member of ``key`` with ``score`` is in state ``want`` ("" any)."""
    if want in ("scheduled", "due") and key == q.sched:
        return (score <= now) == (want == "due")
    return True
