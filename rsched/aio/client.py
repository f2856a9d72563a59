"""The asyncio client: ``await rs.add(...)`` from an event loop (a FastAPI or
Starlette handler, an aiohttp app) without blocking it.

>>> rs = Rsched.from_url("redis://localhost:6379/0")
>>> res = await rs.add("order.close", "1001", delay="30m", payload={"order": 1001})
>>> await rs.close()

Same arguments, same validation (before any I/O) and the same result objects
as the synchronous :class:`rsched.Rsched` (``AddResult``, ``Task``,
``QueueStats``, the state a cancel removed).

**Adds are pipelined under the hood.** ``add`` validates, queues the task and
awaits its result; one flusher task per client sends every task queued
meanwhile in one round trip (grouped per stored queue, up to
:data:`BATCH` tasks per ``add-7`` call, the queues' registration in the same
pipeline), so a thousand concurrent ``await rs.add()`` cost a handful of
round trips, not a thousand. A task alone waits for nothing: the flusher is
scheduled with ``call_soon`` and runs as soon as the caller yields. Each
add-7 call is one Lua script: atomic per call, as for ``add_many``; a refused
call fails only its own tasks' awaits.

On ``redis.asyncio``: ``add``, ``cancel``, ``show`` (the Lua core through
:mod:`rsched.lua.acalls`). ``list`` and ``queues`` (reads that decode many
keys) run the synchronous library's code on a worker thread
(``asyncio.to_thread``) with a client of their own, so their decoding is the
one the CLI uses. Every URL form of the synchronous client
(:mod:`rsched.aio.conn`): ``redis://``, ``rediss://``, ``unix://``, Redis
Cluster (``redis+cluster://``, or a plain URL to a node, found out on first
use) and Sentinel (``redis+sentinel://``). On a cluster each ``add-5`` call
of a flush goes to its queue's slot (a queue's keys share one hash tag), the
calls of one flush to every primary concerned in one pipeline round.

Partitioned queues: adds and cancels go to the partition the stored count
(``queue-config``) says, read once per flush for the queues not known to be
partitioned (a count > 1 is kept). A queue the config file partitions
(``[queues.Q] partitions``) that Redis does not know yet is partitioned as the
synchronous client does it (:func:`rsched.queue.queues.count`, on a worker
thread, once); a stored count that differs from the config's is refused
(``ConfigError``), as there.
"""

from __future__ import annotations

import asyncio
import builtins
from typing import TYPE_CHECKING, Any

from rsched.core import errors, validate
from rsched.core import keys as K
from rsched.core.defaults import HISTORY_MAXLEN, host_id
from rsched.core.errors import map_error
from rsched.lua import acalls

if TYPE_CHECKING:  # pragma: no cover
    from rsched.context import Context
    from rsched.core.config import Settings
    from rsched.queue.model import AddResult, QueueStats, Task, TaskSpec

#: Tasks per ``add-7`` call of a flush.
BATCH = 500


class Rsched:
    """An asyncio client of one namespace; see the module doc."""

    def __init__(
        self,
        client: Any,
        namespace: str = "rsched",
        *,
        settings: Settings | None = None,
        history_maxlen: int = HISTORY_MAXLEN,
    ):
        validate.name(namespace, "namespace")
        self.redis: Any = client
        self.namespace = namespace
        self.keys = K.Keys(namespace)
        self.settings = settings
        self.history_maxlen = history_maxlen
        self._pending: list[tuple[TaskSpec, str, asyncio.Future[AddResult]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._counts: dict[str, int] = {}  # queue -> partitions (> 1 only: kept)
        self._checked: set[str] = set()  # stored queues whose key types add-7 checked
        self._sync: Context | None = None
        self._ask = False  # ask the server whether it is a cluster node (_ready)
        self._ask_lock = asyncio.Lock()
        import os

        self._by = f"{host_id()} pid {os.getpid()}"

    def __repr__(self) -> str:
        return f"aio.Rsched(namespace={self.namespace!r})"

    @classmethod
    def from_url(cls, url: str, namespace: str = "rsched", **kwargs: Any) -> Rsched:
        from rsched.core.config import Settings

        return cls.from_settings(Settings(redis_url=url, namespace=namespace), **kwargs)

    @classmethod
    def from_settings(cls, settings: Settings, **kwargs: Any) -> Rsched:
        """Every URL form of the synchronous client (:mod:`rsched.aio.conn`): plain,
        TLS, unix, Redis Cluster, Sentinel."""
        from rsched.aio.conn import client_for

        client, ask = client_for(settings)
        rs = cls(client, settings.namespace, settings=settings, **kwargs)
        rs._ask = ask
        return rs

    async def _ready(self) -> None:
        """On first use with ``cluster = "auto"``: ask the server whether it is a
        cluster node (and switch to the cluster client if so), once."""
        if not self._ask:
            return
        async with self._ask_lock:
            if self._ask:
                from rsched.aio.conn import probe

                assert self.settings is not None
                self.redis = await probe(self.settings, self.redis)
                self._ask = False

    async def __aenter__(self) -> Rsched:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Send what is queued, then close the connections."""
        if self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)
        await self.redis.aclose()
        if self._sync is not None:
            self._sync.close()
            self._sync = None

    # --- adds ------------------------------------------------------------------------
    async def add(
        self, task_type: str, task_id: str, *, if_exists: str = "keep", **kw: Any
    ) -> AddResult:
        """Schedule one task (the arguments of :meth:`rsched.Rsched.add`)."""
        from rsched.queue.ops import _check_if_exists
        from rsched.queue.specs import make_spec

        _check_if_exists(if_exists)
        if kw.pop("partitions", None) is not None:
            raise errors.BadInput(
                "partitions", "rsched.aio adds by the count stored in Redis; give none"
            )
        spec = make_spec(task_type, task_id, **kw)
        if spec.after:  # (its batches are add-7 calls; add-after-9 is one task a call)
            raise errors.BadInput(
                "after", "rsched.aio does not add tasks with after; use rsched.Rsched"
            )
        fut: asyncio.Future[AddResult] = asyncio.get_running_loop().create_future()
        self._pending.append((spec, if_exists, fut))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush())
        return await fut

    async def _flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                await self._send(batch)
            except BaseException as exc:  # noqa: BLE001 - each waiter gets the error
                for _, _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise

    async def _count(self, queue: str) -> int:
        await self._ready()
        return (await self._counts_of({queue}))[queue]

    async def _counts_of(self, queues: set[str]) -> dict[str, int]:
        """Each queue's partition count (1: not partitioned, read again every flush:
        another process may partition it), one pipeline for those not known."""
        out = {q: self._counts[q] for q in queues if q in self._counts}
        ask = [q for q in queues if q not in out]
        if ask:
            pipe = self.redis.pipeline(transaction=False)
            for q in ask:
                pipe.hget(self.keys.queue_config, q)
            try:
                got = await pipe.execute()
            except Exception as exc:
                raise map_error(exc) from exc
            for q, stored in zip(ask, got, strict=True):
                want = self._want(q)
                if stored is None and want is not None and want > 1:
                    # The config file partitions it, Redis does not know yet: partition it
                    # as the synchronous client does (its checks: no tasks held
                    # unpartitioned, no consumers running unpartitioned; first one wins).
                    from rsched.queue import queues as Q

                    n = await asyncio.to_thread(Q.count, self._ctx(), q, want)
                else:
                    n = int(stored) if stored is not None else 1
                    if want is not None and want != n:
                        from rsched.queue import queues as Q

                        Q._agree(self, q, want, n)  # type: ignore[arg-type]
                out[q] = n
                if n > 1:
                    self._counts[q] = n
        return out

    def _want(self, queue: str) -> int | None:
        """The config file's ``[queues.Q] partitions`` (checked), None when not set."""
        if self.settings is None:
            return None
        want = self.settings.queue_options(queue).get("partitions")
        if want is None:
            return None
        from rsched.queue.queues import check_count

        return check_count(want, f"queues.{queue}.partitions")

    async def _stored(self, queue: str, task_type: str, task_id: str) -> str:
        n = await self._count(queue)
        return (
            queue if n == 1 else K.partition_name(queue, K.partition_index(task_type, task_id, n))
        )

    async def _send(self, batch: builtins.list[tuple[TaskSpec, str, Any]]) -> None:
        from rsched.queue.ops import _args, _results

        await self._ready()
        groups: dict[tuple[str, str], builtins.list[tuple[TaskSpec, Any]]] = {}
        queues = {spec.queue for spec, _, _ in batch}
        counts = await self._counts_of(queues)  # one round trip for the queues of the batch
        for spec, if_exists, fut in batch:
            n = counts[spec.queue]
            stored = (
                spec.queue
                if n == 1
                else K.partition_name(spec.queue, K.partition_index(spec.type, spec.id, n))
            )
            groups.setdefault((stored, if_exists), []).append((spec, fut))
        calls: builtins.list[acalls.AddCall] = []
        chunks: builtins.list[builtins.list[tuple[TaskSpec, Any]]] = []
        for (stored, if_exists), items in groups.items():
            checks = "" if stored in self._checked else "t"
            q = self.keys.queue(stored)
            for i in range(0, len(items), BATCH):
                part = items[i : i + BATCH]
                calls.append((q, if_exists, "text", [_args(s) for s, _ in part], checks))
                chunks.append(part)
        res = await acalls.add_batch(self, calls, after=[("SADD", self.keys.queues, *queues)])
        for (q, *_), part, reply in zip(calls, chunks, res, strict=False):
            if isinstance(reply, Exception):
                err = map_error(reply)
                for _, fut in part:
                    if not fut.done():
                        fut.set_exception(err)
                continue
            self._checked.add(q.name)
            flat = reply.split(" ")  # reply "text": "status state due" per task
            for (_, fut), ar in zip(part, _results([s for s, _ in part], flat), strict=True):
                ar.stored_queue = q.name
                if not fut.done():
                    fut.set_result(ar)

    # --- one task ---------------------------------------------------------------------
    async def cancel(self, task_type: str, task_id: str, queue: str = "default") -> str:
        """Remove a task; returns the state it was in (NotFound when there was none)."""
        from rsched.queue.specs import task_ref

        ref = task_ref(task_type, task_id, queue)
        stored = await self._stored(ref.queue, ref.type, ref.id)
        state = await acalls.cancel(
            self, self.keys.queue(stored), ref.member, self.history_maxlen, stored, self._by
        )
        if not state:
            raise errors.NotFound(f"no task {ref.type} {ref.id} in queue {ref.queue}")
        return str(state)

    async def show(self, task_type: str, task_id: str, queue: str = "default") -> Task:
        """The task as it is now (NotFound when there is none)."""
        from rsched.core.conn import time_reply_ms
        from rsched.queue.ops import decode_task
        from rsched.queue.specs import task_ref

        ref = task_ref(task_type, task_id, queue)
        q = self.keys.queue(await self._stored(ref.queue, ref.type, ref.id))
        m = ref.member
        cluster = _is_cluster(self.redis)
        pipe = self.redis.pipeline(transaction=False)
        if not cluster:
            pipe.time()
        pipe.hget(q.tasks, m)
        pipe.zscore(q.sched, m)
        pipe.zscore(q.proc, m)
        pipe.zscore(q.dead, m)
        pipe.zscore(q.waiting, m)
        try:
            # (a cluster pipeline takes keyed commands only: TIME on its own)
            t = await self.redis.time() if cluster else None
            got = await pipe.execute()
        except Exception as exc:
            raise map_error(exc) from exc
        if not cluster:
            t, *got = got
        raw, s, p, d, w = got
        if raw is None:
            raise errors.NotFound(f"no task {ref.type} {ref.id} in queue {ref.queue}")
        now = time_reply_ms(t)
        state, score = (
            (("due" if s <= now else "scheduled"), s)
            if s is not None
            else ("processing", p)
            if p is not None
            else ("dead", d)
            if d is not None
            else ("waiting", w)
            if w is not None
            else ("orphan", None)
        )
        task = decode_task(self, ref.queue, m, raw, state, score)  # type: ignore[arg-type]
        assert task is not None
        return task

    # --- reads on a thread -------------------------------------------------------------
    def _ctx(self) -> Context:
        if self._sync is None:
            from rsched.context import Context
            from rsched.core.config import Settings
            from rsched.core.conn import connect

            s = self.settings or Settings(redis_url="redis://localhost:6379/0")
            self._sync = Context(
                connect(s), self.namespace, settings=s, history_maxlen=self.history_maxlen
            )
        return self._sync

    async def list(self, queue: str = "default", **kw: Any) -> builtins.list[Task]:
        """:meth:`rsched.Rsched.list`."""
        from rsched.queue import ops

        return await asyncio.to_thread(lambda: ops.list_tasks(self._ctx(), queue, **kw))

    async def queues(self) -> builtins.list[QueueStats]:
        """:meth:`rsched.Rsched.queues`."""
        from rsched.queue import ops

        return await asyncio.to_thread(lambda: ops.queue_stats(self._ctx()))


def _is_cluster(client: Any) -> bool:
    from redis.asyncio.cluster import RedisCluster

    return isinstance(client, RedisCluster)


__all__ = ["Rsched"]
