"""Queue operations: add, cancel, show, list, queue stats, stale recovery,
dead-letter handling, pause/resume. Writes go through the Lua core
(``rsched/lua``); reads are plain commands. The record format is in
:mod:`rsched.queue.model`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from rsched.core import keys as K
from rsched.core import validate
from rsched.core.errors import BadInput, Conflict, NotFound, RedisFull
from rsched.queue import queues as P
from rsched.queue.model import BATCH, IF_EXISTS, STATES, AddResult, QueueStats, Task, TaskSpec
from rsched.queue.specs import make_spec, spec_from_line

if TYPE_CHECKING:  # pragma: no cover
    from rsched.context import Context


def _args(spec: TaskSpec) -> tuple[str, str, str, int]:
    due = f"+{spec.delay_ms or 0}" if spec.at_ms is None else str(spec.at_ms)
    return (spec.member, due, spec.payload_json, spec.max_attempts)


def _queue_keys(rs: Context, queue: str) -> list[str]:
    q = rs.keys.queue(queue)
    return [q.sched, q.proc, q.dead, q.tasks, q.wake]


def _check_if_exists(if_exists: str) -> None:
    if if_exists not in IF_EXISTS:
        raise BadInput("--if-exists", f"{if_exists!r} is not one of {', '.join(IF_EXISTS)}")


def _results(specs: list[TaskSpec], flat: list[Any]) -> list[AddResult]:
    out = []
    for i, s in enumerate(specs):
        status, state, due = flat[3 * i : 3 * i + 3]
        task = Task(
            s.type,
            s.id,
            s.queue,
            state,
            int(due),
            0,
            s.max_attempts or None,
            json.loads(s.payload_json),
            None,
        )
        out.append(AddResult(status, task))
    return out


def add(
    rs: Context, task_type: str, task_id: str, *, if_exists: str = "keep", **kw: Any
) -> AddResult:
    """Schedule one task. ``delay`` (ms or "30m") or ``at`` (epoch ms, ISO text,
    aware datetime); neither = due now. Existing task: ``if_exists``."""
    _check_if_exists(if_exists)
    want = kw.pop("partitions", None)
    spec = make_spec(task_type, task_id, **kw)
    stored = P.of_task(rs, spec.queue, spec.type, spec.id, want)
    what = f"task {spec.type} {spec.id} in queue {spec.queue}"
    try:
        flat = rs.scripts("add-5", _queue_keys(rs, stored), [if_exists, "tasks", *_args(spec)])
    except RedisFull as exc:
        raise RedisFull(f"{exc}; {what} was not added") from exc
    # Registered after the script succeeded, so refused input writes nothing.
    try:
        _exec(rs.redis.pipeline(transaction=False).sadd(rs.keys.queues, spec.queue))
    except RedisFull as exc:  # the task's own write took the last room
        raise RedisFull(
            f"{exc}; {what} was added, but its queue could not be entered in the list "
            "of queues (`rsched queues`); adding it again keeps the task and does that"
        ) from exc
    result = _results([spec], flat)[0]
    if result.status == "kept":
        result.task = show(rs, spec.type, spec.id, spec.queue)
    return result


def _add_calls(
    rs: Context,
    specs: Iterable[TaskSpec],
    if_exists: str,
    reply: str,
    batch: int,
    partitions: int | None = None,
) -> tuple[list[TaskSpec], list[tuple[list[TaskSpec], Any]]]:
    """Group specs per queue (per partition), ``batch`` tasks per ``add-5`` call,
    all calls in one pipeline. Returns the specs in order and (chunk, reply) pairs.
    ``partitions``: the count every queue named must have (see rsched.queue.queues)."""
    _check_if_exists(if_exists)
    by_queue: dict[str, list[TaskSpec]] = {}
    order: list[TaskSpec] = []
    counts: dict[str, int] = {}  # partitions per queue, asked once per call
    for s in specs:
        n = counts.get(s.queue)
        if n is None:
            n = counts[s.queue] = P.count(rs, s.queue, partitions)
        stored = (
            s.queue if n == 1 else K.partition_name(s.queue, K.partition_index(s.type, s.id, n))
        )
        items = by_queue.get(stored)
        if items is None:
            items = by_queue[stored] = []
        items.append(s)
        order.append(s)
    if not order:
        return order, []
    pipe = rs.redis.pipeline(transaction=False)
    chunks: list[list[TaskSpec]] = []
    for q, items in by_queue.items():
        keys = _queue_keys(rs, q)
        for i in range(0, len(items), batch):
            part = items[i : i + batch]
            args: list[Any] = [if_exists, reply]
            for s in part:
                args.extend(_args(s))
            rs.scripts("add-5", keys, args, client=pipe)
            chunks.append(part)
    from rsched.core.errors import map_error

    try:
        res = pipe.execute(raise_on_error=False)
    except Exception as exc:
        raise map_error(exc) from exc
    pairs = list(zip(chunks, res, strict=True))
    failed = [r for _, r in pairs if isinstance(r, Exception)]
    if failed:
        # Each call is one Lua script: a refused one (out of memory, say) wrote
        # nothing, the others wrote all of theirs. Say which did.
        ok = [(c, r) for c, r in pairs if not isinstance(r, Exception)]
        if ok:
            try:  # best effort: Redis may refuse this write too
                _exec(rs.redis.pipeline(transaction=False).sadd(rs.keys.queues, *counts))
            except Exception:  # noqa: BLE001 - the error below is the one to report
                pass
        raise _Partial(map_error(failed[0]), ok, reply)
    # Registered after the scripts succeeded, so refused input writes nothing.
    _exec(rs.redis.pipeline(transaction=False).sadd(rs.keys.queues, *counts))
    return order, pairs


class _Partial(Exception):
    """Some ``add-5`` calls of one pipeline were refused (``error``), the others
    (``ok``: chunk, reply) wrote their tasks. Never leaves this module."""

    def __init__(self, error: Exception, ok: list[tuple[list[TaskSpec], Any]], reply: str):
        super().__init__(str(error))
        self.error, self.ok, self.reply = error, ok, reply

    def counts(self) -> dict[str, int]:
        """What the calls that went through wrote ({"added", "kept", "replaced"})."""
        out = {"added": 0, "kept": 0, "replaced": 0}
        for chunk, r in self.ok:
            if self.reply == "counts":
                for k, v in zip(("added", "kept", "replaced"), r, strict=True):
                    out[k] += int(v)
            else:
                for ar in _results(chunk, r):
                    out[ar.status] = out.get(ar.status, 0) + 1
        return out


def add_many(
    rs: Context,
    specs: Iterable[TaskSpec],
    *,
    if_exists: str = "keep",
    batch: int = 500,
    partitions: int | None = None,
) -> list[AddResult]:
    """Add validated specs, grouped per queue, ``batch`` tasks per Lua call, all
    calls pipelined. With ``if_exists="error"`` each call is all-or-nothing."""
    try:
        order, pairs = _add_calls(rs, specs, if_exists, "tasks", batch, partitions)
    except _Partial as p:
        raise p.error from None
    results: dict[int, AddResult] = {}
    for part, r in pairs:
        for s, ar in zip(part, _results(part, r), strict=True):
            results[id(s)] = ar
    return [results[id(s)] for s in order]


def add_counts(
    rs: Context,
    specs: Iterable[TaskSpec],
    *,
    if_exists: str = "keep",
    batch: int = 1000,
    partitions: int | None = None,
) -> dict[str, int]:
    """:func:`add_many` for bulk loads: only ``{"added", "kept", "replaced"}`` counts
    come back (no per-task reply to build or parse)."""
    try:
        return _counts(rs, specs, if_exists, batch, partitions)
    except _Partial as p:
        raise p.error from None


def _counts(
    rs: Context, specs: Iterable[TaskSpec], if_exists: str, batch: int, partitions: int | None
) -> dict[str, int]:
    """:func:`add_counts`, raising :class:`_Partial` when some calls were refused."""
    _, pairs = _add_calls(rs, specs, if_exists, "counts", batch, partitions)
    counts = {"added": 0, "kept": 0, "replaced": 0}
    for _, (a, k, r) in pairs:
        counts["added"] += int(a)
        counts["kept"] += int(k)
        counts["replaced"] += int(r)
    return counts


def add_lines(
    rs: Context | Callable[[], Context],
    lines: Iterable[bytes | str],
    *,
    if_exists: str = "keep",
    batch: int = 10_000,
    progress: Any = None,
    partitions: int | None = None,
    retry_s: float = 0.0,
    on_retry: Callable[[BaseException, float], None] | None = None,
    tz: str | None = None,
) -> dict[str, int]:
    """``add --from``: JSON lines -> tasks, ``batch`` lines validated, then written
    in one pipeline. A bad line raises :class:`BadInput` naming it; nothing of
    its batch is written (earlier batches are, and the message says how many).
    ``progress(counts)`` is called after each batch. ``rs`` may be a function
    that connects: it is called on the first batch (bad input needs no Redis).

    A batch is written by a helper thread while the next one is parsed, so the
    server's work overlaps the parsing (one batch in flight at a time).

    ``retry_s``: a batch whose write meets an outage (:data:`rsched.core.transient.TRANSIENT`:
    Redis restarting, loading, a Sentinel or Cluster failover) is written again,
    with backoff, for up to that many seconds from the first error, and
    ``on_retry(error, seconds_left)`` is told. Writing a batch again is safe with
    ``keep`` and ``replace`` (re-adding the same task is idempotent); a task the
    lost attempt had already written then counts as kept. Never with ``error``:
    a batch that was half written would report conflicts for its own tasks.
    A full Redis (``maxmemory`` reached) is such an outage too: it lasts until
    memory is freed. When the outage outlasts ``retry_s`` the error says how many
    tasks were written, counting the calls of the last batch that went through
    (each call of ``add-5`` is written whole or, refused, not at all)."""
    import threading
    import time

    from rsched.core.transient import TRANSIENT

    _check_if_exists(if_exists)
    counts = {"added": 0, "kept": 0, "replaced": 0}
    pending: list[TaskSpec] = []
    conn: list[Context] = []
    sent = [0, 0]  # tasks handed to the writer so far, and the line number of the last one
    inflight: list[tuple[threading.Thread, dict[str, Any]]] = []

    def wait() -> None:
        if not inflight:
            return
        thread, box = inflight.pop()
        thread.join()
        for k, v in box.get("counts", {}).items():
            counts[k] += v
        if "error" in box:
            exc = box["error"]
            if isinstance(exc, TRANSIENT):
                from rsched.core.errors import map_error

                err = map_error(exc)
                done = sum(counts.values())
                raise type(err)(
                    f"{err}; add --from wrote {done} of the first {sent[0]} tasks (lines 1-"
                    f"{sent[1]}: added {counts['added']}, kept {counts['kept']}, replaced "
                    f"{counts['replaced']}) and nothing after them; adding the same lines "
                    "again keeps what was written"
                ) from exc
            raise exc
        if progress is not None:
            progress(counts)

    retry = retry_s > 0 and if_exists != "error"

    def write(specs: list[TaskSpec], box: dict[str, Any]) -> None:
        give_up = 0.0
        delay = 0.1
        while True:
            try:
                box["counts"] = _counts(conn[0], specs, if_exists, 1000, partitions)
                return
            except _Partial as p:  # some of its calls were written, then one was refused
                box["counts"], failure = p.counts(), p.error
            except TRANSIENT as exc:
                box.pop("counts", None)
                failure = exc
            except BaseException as exc:  # noqa: BLE001 - re-raised by wait() in the caller
                box["error"] = exc
                return
            now = time.monotonic()
            give_up = give_up or now + retry_s
            if not isinstance(failure, TRANSIENT) or not retry or now >= give_up:
                box["error"] = failure
                return
            # Written again whole: what the failed attempt wrote then counts as kept.
            box.pop("counts", None)
            if on_retry is not None:
                from rsched.core.errors import map_error

                on_retry(map_error(failure), give_up - now)
            time.sleep(min(delay, give_up - now))
            delay = min(delay * 2, 2.0)

    def flush(lineno: int) -> None:
        if not pending:
            return
        if not conn:
            conn.append(rs() if callable(rs) else rs)
        wait()
        box: dict[str, Any] = {}
        thread = threading.Thread(target=write, args=(pending[:], box), daemon=True)
        sent[0] += len(pending)
        sent[1] = lineno
        pending.clear()
        thread.start()
        inflight.append((thread, box))

    parse = spec_from_line if tz is None else functools.partial(spec_from_line, tz=tz)
    lineno = 0
    try:
        for lineno, raw in enumerate(lines, 1):
            if not raw.strip():
                continue
            try:
                pending.append(parse(raw, lineno))
            except BadInput as exc:
                wait()
                done = sum(counts.values())
                if done:
                    raise BadInput(
                        str(exc.field),
                        f"{str(exc).split(': ', 1)[-1]} "
                        f"({done} tasks from earlier lines were written; nothing from this batch)",
                    ) from None
                raise
            if len(pending) >= batch:
                flush(lineno)
        flush(lineno)
    except BaseException:
        for thread, _ in inflight:  # never leave a writer running behind an error
            thread.join()
        raise
    wait()
    return counts


def cancel(rs: Context, task_type: str, task_id: str, queue: str = "default") -> str:
    """Remove a task; returns the state it was in. A running task's handler is
    stopped by its consumer (told on the queue's cancel channel) and the run is
    recorded ``cancelled``."""
    validate.task_type(task_type)
    validate.task_id(task_id)
    validate.queue(queue)
    stored = P.of_task(rs, queue, task_type, task_id)
    q = rs.keys.queue(stored)
    ident = rs.identity()
    state = rs.scripts(
        "cancel-5",
        [q.sched, q.proc, q.dead, q.tasks, q.history],
        [
            K.member(task_type, task_id),
            rs.history_maxlen,
            stored,
            q.cancel_channel,
            f"{ident['host']} pid {ident['pid']}",
        ],
    )
    if not state:
        raise NotFound(f"no task {task_type} {task_id} in queue {queue}")
    return str(state)


#: A record's positions when left out (see the module docstring).
_REC_DEFAULTS = ["null", 0, 0, "", "", None]


def _decode(
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
    )


def show(rs: Context, task_type: str, task_id: str, queue: str = "default") -> Task:
    validate.task_type(task_type)
    validate.task_id(task_id)
    validate.queue(queue)
    q = rs.keys.queue(P.of_task(rs, queue, task_type, task_id))
    m = K.member(task_type, task_id)
    pipe = rs.redis.pipeline(transaction=False)
    # A cluster pipeline refuses keyless commands (TIME): ask for the time first.
    clustered = _is_cluster(rs.redis)
    if not clustered:
        pipe.time()
    pipe.hget(q.tasks, m)
    pipe.zscore(q.sched, m)
    pipe.zscore(q.proc, m)
    pipe.zscore(q.dead, m)
    if clustered:
        now = rs.now_ms()
        raw, s, p, d = _exec(pipe)
    else:
        (sec, usec), raw, s, p, d = _exec(pipe)
        now = int(sec) * 1000 + int(usec) // 1000
    if raw is None:
        raise NotFound(f"no task {task_type} {task_id} in queue {queue}")
    if s is not None:
        state, score = ("due" if s <= now else "scheduled"), s
    elif p is not None:
        state, score = "processing", p
    elif d is not None:
        state, score = "dead", d
    else:
        state, score = "orphan", None
    task = _decode(rs, queue, m, raw, state, score)
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
    validate.queue(queue)
    if state not in (*STATES, "all"):
        raise BadInput("--state", f"{state!r} is not one of {', '.join((*STATES, 'all'))}")
    if task_type is not None:
        validate.task_type(task_type, "--type")
    if limit < 1:
        raise BadInput("--limit", f"{limit} is not a positive whole number")
    stored = P.names(rs, queue)
    if len(stored) > 1:  # each partition's first `limit`, merged in the same order
        rank = {"processing": 0, "due": 1, "scheduled": 2, "dead": 3}
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
    order = ["processing", "due", "scheduled", "dead"] if state == "all" else [state]
    out: list[Task] = []
    prefix = f"{task_type} " if task_type else None
    for st in order:
        want = limit - len(out)
        if st == "due":
            rows = _due_rows(rs, q, now, want, task_type)
        else:
            key = {"processing": q.proc, "scheduled": q.sched, "dead": q.dead}[st]
            lo, hi = (f"({now}", "+inf") if st == "scheduled" else ("-inf", "+inf")
            rows = _range_rows(rs, key, lo, hi, want, prefix)
        if rows:
            raws = rs.redis.hmget(q.tasks, [m for m, _ in rows])
            for (m, sc), raw in zip(rows, raws, strict=True):
                t = _decode(rs, queue, m, raw, st, sc)
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
    if lanes:
        rows.sort(key=lambda r: (K.due_of_score(r[1]), r[0]))
    return rows[:limit]


def known_queues(rs: Context) -> list[str]:
    return sorted(rs.redis.smembers(rs.keys.queues))


def _stored_names(rs: Context, queues: list[str]) -> list[str]:
    """Queues -> the stored queues behind them (partitions in order)."""
    return [name for q in queues for name in P.names(rs, q)]


def _runs(globs: set[str], task_type: str) -> bool:
    import fnmatch

    return any(g == "*" or fnmatch.fnmatchcase(task_type, g) for g in globs)


def queue_stats(rs: Context, queues: list[str] | None = None) -> list[QueueStats]:
    """One row per queue; a partitioned queue's partitions summed into its row.

    Two pipelined round trips: the counts, the lanes of parked types and the live
    consumers' registered types, then per parked type its count and oldest task
    (tasks a consumer could not run; see rsched/core/keys.py)."""
    names = queues if queues is not None else known_queues(rs)
    stored = {name: P.names(rs, name) for name in names}
    now = rs.now_ms()
    pipe = rs.redis.pipeline(transaction=False)
    for name in names:
        for part in stored[name]:
            q = rs.keys.queue(part)
            pipe.zcard(q.sched)
            pipe.zcount(q.sched, "-inf", now)
            pipe.zcard(q.proc)
            pipe.zcount(q.proc, "-inf", now)
            pipe.zcard(q.dead)
            pipe.zrangebyscore(q.sched, 0, "+inf", start=0, num=1, withscores=True)
            pipe.zrangebyscore(q.sched, f"({now}", "+inf", start=0, num=1, withscores=True)
            pipe.zrangebyscore(q.consumers, f"({now}", "+inf")
            pipe.exists(q.paused)
            pipe.hgetall(q.lanes)
            pipe.hgetall(q.handles)
    res = _exec(pipe) if names else []
    # Round two: every parked type's count and oldest task.
    lanes_of: list[list[tuple[str, int]]] = []
    pipe = rs.redis.pipeline(transaction=False)
    flat = [part for name in names for part in stored[name]]
    for j, part in enumerate(flat):
        sched_key = rs.keys.queue(part).sched
        lanes = [(t, int(v)) for t, v in res[11 * j + 9].items() if t != "#"]
        lanes_of.append(lanes)
        for _, lane in lanes:
            lo, hi = K.lane_bounds(lane)
            pipe.zcount(sched_key, lo, hi)
            pipe.zrangebyscore(sched_key, lo, hi, start=0, num=1, withscores=True)
    parked = _exec(pipe) if any(lanes_of) else []
    out = []
    i = 0
    k = 0
    for name in names:
        total = due = proc = stale = dead = lag = consumers = 0
        nxt_ms: int | None = None
        paused = False
        unrunnable = unrunnable_lag = 0
        unrunnable_types: set[str] = set()
        for _ in stored[name]:
            t, d, pr, st, de, first, nxt, live, pa, _lanes, handles = res[11 * i : 11 * i + 11]
            lanes = lanes_of[i]
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
            )
        )
    return out


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
            rq, rd, more = rs.scripts(
                "requeue-stale-6",
                [q.sched, q.proc, q.dead, q.tasks, q.history, q.wake],
                [BATCH, "1" if dry_run else "0", rs.history_maxlen, name, dm],
            )
            total["requeued"] += int(rq)
            total["dead"] += int(rd)
            if not int(more):
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
        n += int(rs.scripts("retry-4", [q.dead, q.sched, q.tasks, q.wake], members))
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
            n += int(rs.scripts("retry-4", [q.dead, q.sched, q.tasks, q.wake], members))
    return n


def purge_dead(rs: Context, queue: str | None = None, older_than_ms: int | None = None) -> int:
    names = [validate.queue(queue)] if queue else known_queues(rs)
    n = 0
    for name in _stored_names(rs, names):
        q = rs.keys.queue(name)
        while True:
            deleted, more = rs.scripts(
                "purge-2",
                [q.dead, q.tasks],
                [-1 if older_than_ms is None else older_than_ms, BATCH],
            )
            n += int(deleted)
            if not int(more):
                break
    return n


def dead_tasks(rs: Context, queue: str | None = None, limit: int = 100) -> list[Task]:
    names = [validate.queue(queue)] if queue else known_queues(rs)
    out: list[Task] = []
    for name in names:
        out.extend(list_tasks(rs, name, state="dead", limit=limit))
    out.sort(key=lambda t: t.lease_ms or 0, reverse=True)
    return out[:limit]


def pause(rs: Context, queue: str) -> bool:
    """Pause ``queue``'s consumers; returns whether the queue was known before."""
    validate.queue(queue)
    pipe = rs.redis.pipeline(transaction=False)
    pipe.sadd(rs.keys.queues, queue)
    for name in P.names(rs, queue):
        pipe.set(rs.keys.queue(name).paused, "1")
    return not int(_exec(pipe)[0])


def resume(rs: Context, queue: str) -> bool:
    """Resume ``queue``; returns whether it was paused."""
    validate.queue(queue)
    was = False
    for name in P.names(rs, queue):
        q = rs.keys.queue(name)
        pipe = rs.redis.pipeline(transaction=True)
        pipe.delete(q.paused)
        pipe.zadd(q.wake, {"w": 0})
        was = bool(int(_exec(pipe)[0])) or was
    return was
