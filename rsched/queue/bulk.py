"""Bulk adds: many validated specs, grouped per queue (per partition), ``batch``
tasks per ``add-7`` call, all calls of a batch in one pipeline; and ``add --from``
(JSON lines parsed, validated and written in batches, with a writer thread and
retries through an outage). One task at a time is :func:`rsched.queue.ops.add_spec`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from rsched.core import keys as K
from rsched.core.errors import BadInput
from rsched.lua import calls
from rsched.queue import queues as P
from rsched.queue.model import AddResult, TaskSpec
from rsched.queue.ops import _args, _check_if_exists, _exec, _results, add_spec
from rsched.queue.specs import spec_from_line

if TYPE_CHECKING:  # pragma: no cover
    from rsched.context import Context


def _add_calls(
    rs: Context,
    specs: Iterable[TaskSpec],
    if_exists: str,
    reply: str,
    batch: int,
    partitions: int | None = None,
) -> tuple[list[TaskSpec], list[tuple[list[TaskSpec], Any]]]:
    """Group specs per queue (per partition), ``batch`` tasks per ``add-7`` call,
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
    checked = P.known(rs).checked
    for q, items in by_queue.items():
        keys = rs.keys.queue(q)
        checks = "" if q in checked else "t"
        for i in range(0, len(items), batch):
            part = items[i : i + batch]
            rows = [_args(s) for s in part]
            how = checks
            if any(s.priority for s in part):  # every group of 5, with its priority
                how += "P"
                rows = [(*r, 0) if len(r) == 4 else r for r in rows]
            calls.add(rs, keys, if_exists, reply, rows, checks=how, client=pipe)
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
    checked.update(by_queue)
    # Registered after the scripts succeeded, so refused input writes nothing.
    _exec(rs.redis.pipeline(transaction=False).sadd(rs.keys.queues, *counts))
    return order, pairs


class _Partial(Exception):
    """Some ``add-7`` calls of one pipeline were refused (``error``), the others
    (``ok``: chunk, reply) wrote their tasks. Never leaves this module."""

    def __init__(self, error: Exception, ok: list[tuple[list[TaskSpec], Any]], reply: str):
        super().__init__(str(error))
        self.error, self.ok, self.reply = error, ok, reply
        #: what earlier calls of the same batch wrote (before a task with ``after``)
        self.base: dict[str, int] = {}

    def counts(self) -> dict[str, int]:
        """What the calls that went through wrote ({"added", "kept", "replaced"})."""
        out = {"added": 0, "kept": 0, "replaced": 0, **self.base}
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
    calls pipelined. With ``if_exists="error"`` each call is all-or-nothing. A spec
    with ``after`` is added alone (:func:`rsched.queue.ops.add_spec`), after the
    specs before it, so that it may name them as parents."""
    out: list[AddResult] = []
    for plain, waiting in _runs(specs):
        if plain:
            try:
                order, pairs = _add_calls(rs, plain, if_exists, "tasks", batch, partitions)
            except _Partial as p:
                raise p.error from None
            results: dict[int, AddResult] = {}
            for part, r in pairs:
                for s, ar in zip(part, _results(part, r), strict=True):
                    results[id(s)] = ar
            out.extend(results[id(s)] for s in order)
        if waiting is not None:
            out.append(add_spec(rs, waiting, if_exists=if_exists, partitions=partitions))
    return out


def _runs(specs: Iterable[TaskSpec]) -> Iterable[tuple[list[TaskSpec], TaskSpec | None]]:
    """``specs`` as runs of specs without ``after``, each with the spec with ``after``
    that ends it (None for the last run)."""
    plain: list[TaskSpec] = []
    for s in specs:
        if s.after:
            yield plain, s
            plain = []
        else:
            plain.append(s)
    if plain:
        yield plain, None


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
    """:func:`add_counts`, raising :class:`_Partial` when some calls were refused
    (a spec with ``after``: added alone, after those before it)."""
    counts = {"added": 0, "kept": 0, "replaced": 0}
    for plain, waiting in _runs(specs):
        if plain:
            try:
                _, pairs = _add_calls(rs, plain, if_exists, "counts", batch, partitions)
            except _Partial as p:
                p.base = dict(counts)
                raise
            for _, (a, k, r) in pairs:
                counts["added"] += int(a)
                counts["kept"] += int(k)
                counts["replaced"] += int(r)
        if waiting is not None:
            st = add_spec(rs, waiting, if_exists=if_exists, partitions=partitions).status
            counts[st] += 1
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
    (each call of ``add-7`` is written whole or, refused, not at all)."""
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
