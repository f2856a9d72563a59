"""`rsched bench`: how fast is this Redis for rsched?

Every figure is measured with real processes against one Redis: the configured
one (in a throwaway namespace that must be empty and is deleted afterwards) or
an embedded server started for the run (:func:`rsched.tools.server.prepare`).

Sections (``only`` picks some):

``enqueue``   ``add --from`` JSON lines: parsed and added in this process, and
              through a real ``rsched add --from -`` process (start to exit);
              one task per call with ``rs.add()`` (one round trip each), and
              beside it one plain redis-py ``ZADD`` per round trip, the limit of
              one round trip on this machine, and their ratio.
``drain``     one ``run consumer`` process draining due tasks, claim + ack
              included: a no-op Python callable, and the command ``true`` with
              ``--concurrency``.
``lateness``  an idle consumer and tasks due at random times over a window:
              how late each one started (Python) or had run (command), by the
              server's clock; ``early`` counts runs before their due time.
``cold``      wall time of one ``rsched add`` process, start to exit.
``idle``      Redis commands per second of an idle consumer and an idle cron
              runner (INFO commandstats deltas; against a shared server the
              other clients' rate, measured first, is subtracted).
``scale``     p50 latency of one claim and one add with a small and a large
              queue of scheduled tasks, and Redis memory per scheduled task;
              the claim p50 with priorities (tasks of priorities above and
              below 0 among as many due tasks of priority 0 as the queue's size).
``app``       the Python application API: ``.delay()`` of an ``@app.task``, one
              task per call (one round trip each); 1,000 concurrent ``await
              rs.add()`` from one process (``rsched.aio``, pipelined), in
              rounds; one ``rsched run worker`` process draining due tasks of a
              no-op plain function and of a no-op ``async def`` (claim, run,
              ack, history record included).
``locks``     lock hand-over: waiter processes blocked on one lock (the library's
              ``Lock(wait=...)``); each release wakes the next, which takes the
              lock and releases it at once. Hand-over = the waiter holding it
              minus the previous holder about to send its release (both
              ``CLOCK_MONOTONIC``, one machine), median and p99.

Throughput and lateness figures are medians of ``repeat`` runs.

Redis Cluster: every server-side figure is read from every primary (commandstats
and MONITOR per primary, summed, with a ``per_node`` breakdown) or from the
primary that holds the measured queue's slot (memory per task). With
``partitions`` > 1 the enqueue, drain, lateness, cold and idle queues are split
into that many partitions (spread over the primaries); scale measures one
queue (a partition is one). A figure that cannot be measured is ``None`` and
its section's ``unmeasured`` maps it to the reason.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rsched.core.conn import is_cluster, pool_connection
from rsched.core.errors import BadInput, Conflict, RschedError
from rsched.locks.lock import Lock
from rsched.lua import calls
from rsched.tools.sandbox import child_env, delete_namespace, namespace_keys, node_of, primaries

if TYPE_CHECKING:  # pragma: no cover
    from rsched.api import Rsched
    from rsched.core.config import Settings
    from rsched.core.keys import QueueKeys

SECTIONS = ("enqueue", "drain", "lateness", "cold", "idle", "scale", "locks", "app")

#: What the issue asks of rsched (shown next to the figures; benchmarks, not tests).
TARGETS: dict[str, tuple[str, float]] = {
    "enqueue.in_process_per_s": (">=", 50_000),
    "enqueue.process_per_s": (">=", 50_000),
    "enqueue.single_add_vs_zadd": (">=", 0.9),
    "drain.python_per_s": (">=", 20_000),
    "drain.command_per_s": (">=", 500),
    "lateness.python.p99_ms": ("<=", 5),
    "lateness.command.p99_ms": ("<=", 20),
    "lateness.python.early": ("<=", 0),
    "lateness.command.early": ("<=", 0),
    "cold.add_ms": ("<=", 120),
    "idle.consumer_requests_per_s": ("<=", 1),
    "idle.cron_requests_per_s": ("<=", 1),
    "scale.claim_ratio": ("<=", 1.5),
    "scale.claim_prio_ratio": ("<=", 1.5),
    "scale.memory_bytes_per_task": ("<=", 250),
    "locks.handover_p99_ms": ("<=", 50),
    "app.async_add_per_s": (">=", 30_000),
}


def noop(task: Any) -> None:
    """The Python handler the drain and lateness runs use: does nothing."""


#: The app the ``app`` section's worker runs (written to the bench's work directory).
BENCH_APP = """\
from rsched import App

app = App()


@app.task("bench.py", queue="bench-app-py")
def py(task):
    pass


@app.task("bench.async", queue="bench-app-async")
async def aio(task):
    pass
"""


@dataclass
class Params:
    """Sizes of one run; :meth:`quick` is the small variant (about a minute)."""

    enqueue_tasks: int = 100_000
    #: enqueue: single rs.add() calls (and as many plain ZADDs)
    single_adds: int = 20_000
    drain_tasks: int = 50_000
    command_tasks: int = 2_000
    concurrency: int = 16
    lateness_s: float = 10.0
    lateness_tasks: int = 200
    cold_runs: int = 10
    idle_s: float = 20.0
    scale_small: int = 1_000
    scale_large: int = 1_000_000
    scale_samples: int = 1_000
    #: lock hand-over: waiter processes per chain, and chains
    lock_waiters: int = 20
    lock_chains: int = 5
    #: app: single .delay() calls, rounds of concurrent aio adds, tasks per worker drain
    app_single_adds: int = 5_000
    app_async_rounds: int = 20
    app_async_concurrency: int = 1_000
    app_drain_tasks: int = 20_000
    app_concurrency: int = 8
    repeat: int = 3
    #: the bench's queues are split into this many partitions (1: plain queues)
    partitions: int = 1

    @classmethod
    def quick(cls) -> Params:
        return cls(
            enqueue_tasks=20_000,
            single_adds=5_000,
            drain_tasks=10_000,
            command_tasks=300,
            lateness_s=3.0,
            lateness_tasks=60,
            cold_runs=5,
            # an idle consumer or runner calls Redis every 10 s: a shorter window
            # could see no call at all and report 0
            idle_s=12.0,
            scale_large=100_000,
            scale_samples=300,
            lock_waiters=10,
            lock_chains=2,
            app_single_adds=2_000,
            app_async_rounds=5,
            app_drain_tasks=5_000,
            repeat=1,
        )


@dataclass
class Report:
    server: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "machine": self.machine,
            "params": self.params,
            **self.results,
            "targets": {k: {"op": op, "value": v} for k, (op, v) in TARGETS.items()},
            "met": self.met(),
            "seconds": round(self.seconds, 1),
        }

    def value(self, path: str) -> Any:
        node: Any = self.results
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node

    def met(self) -> dict[str, bool]:
        out = {}
        for path, (op, target) in TARGETS.items():
            v = self.value(path)
            if isinstance(v, int | float):
                out[path] = v >= target if op == ">=" else v <= target
        return out


# --------------------------------------------------------------------------- helpers


def _claim_opts(queue: str) -> dict[str, Any]:
    """calls.claim's options for the scale section's one-at-a-time claims."""
    from rsched.core.defaults import DEFAULT_MAX_ATTEMPTS

    return {
        "max_tasks": 1,
        "lease_ms": 60_000,
        "consumer": "bench",
        "registration_ttl_ms": 15_000,
        "reap_limit": 100,
        "history_maxlen": 0,
        "queue": queue,
        "default_max_attempts": DEFAULT_MAX_ATTEMPTS,
    }


def _pct(values: Sequence[float], p: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def machine_info() -> dict[str, Any]:
    mem_gb = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    mem_gb = round(int(line.split()[1]) / 1024 / 1024)
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "memory_gb": mem_gb,
        "python": sys.version.split()[0],
        "platform": sys.platform,
    }


def rsched_command() -> list[str]:
    """How an operator starts rsched here: the console script next to this
    interpreter, else ``python -m rsched``."""
    exe = Path(sys.executable).parent / "rsched"
    if exe.is_file() and os.access(exe, os.X_OK):
        return [str(exe)]
    found = shutil.which("rsched")
    return [found] if found else [sys.executable, "-m", "rsched"]


class _Procs:
    """The processes one bench run started; every one is stopped at the end."""

    def __init__(self, env: dict[str, str], workdir: str):
        self.env = env
        self.workdir = workdir
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def spawn(self, *args: str, python: bool = False) -> tuple[subprocess.Popen[bytes], Path]:
        """``rsched ARGS...`` (``python``: ``python ARGS...``) with its output in a log."""
        log = Path(self.workdir) / f"proc-{len(self.procs)}.log"
        with open(log, "wb") as fh:
            p = subprocess.Popen(
                [sys.executable, *args] if python else [sys.executable, "-m", "rsched", *args],
                env=self.env,
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append((p, log))
        return p, log

    @staticmethod
    def stop(p: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def close(self) -> None:
        for p, _ in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()


def _tail(path: Path, n: int = 5) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-n:])


def _server_s(node: Any) -> float:
    sec, usec = node.time()
    return int(sec) + int(usec) / 1e6


def _client_addrs(node: Any) -> set[str]:
    """Addresses of the connections a server has now (CLIENT LIST)."""
    return {str(c.get("addr")) for c in node.client_list()}


class _Monitor:
    """MONITOR on one server, read in a thread: the time stamps (that server's
    clock) of the requests sent by connections not in ``known`` (those opened
    after it was taken: the process under test's). A script's own commands
    (``lua`` lines) and the bench's INFO and TIME are left out."""

    def __init__(self, name: str, node: Any, known: set[str]):
        import threading

        self.name = name
        self.node = node
        self.known = known
        self.stamps: list[float] = []
        self.error: str | None = None
        self.ready = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)

    def start(self) -> None:
        self.thread.start()
        if not self.ready.wait(10) and self.error is None:
            self.error = f"MONITOR on {self.name} did not start"

    def _read(self) -> None:
        pool = self.node.connection_pool
        conn = pool_connection(pool)
        try:
            conn.send_command("MONITOR")
            conn.read_response()
            self.ready.set()
            while not self.done.is_set():
                line = str(conn.read_response())
                head, _, rest = line.partition(" ")
                if " lua] " in line[:40] or self.done.is_set():
                    continue
                where, _, call = rest.partition("] ")
                if where.rpartition(" ")[2] in self.known:  # another client, or the bench
                    continue
                cmd = call.split(" ", 1)[0].strip('"').upper()
                if cmd not in ("INFO", "TIME"):  # the bench's own
                    self.stamps.append(float(head))
        except Exception as exc:  # noqa: BLE001 - reported as the figure's reason
            if not self.done.is_set():
                text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                self.error = f"MONITOR on {self.name}: {text}"
        finally:
            self.ready.set()
            conn.disconnect()
            pool.release(conn)

    def stop(self) -> None:
        self.done.set()
        if self.thread.is_alive():
            try:
                self.node.time()  # one more line for the reader to see `done`
            except Exception:  # noqa: BLE001 - the join below bounds the wait
                pass
            self.thread.join(10)


# --------------------------------------------------------------------------- the bench


class Bench:
    def __init__(
        self,
        rs: Rsched,
        settings: Settings,
        params: Params,
        workdir: str,
        *,
        embedded: bool,
        say: Callable[[str], None],
    ):
        self.rs = rs
        self.settings = settings
        self.p = params
        self.workdir = workdir
        self.embedded = embedded
        self.say = say
        self.env = env = child_env(settings, rs.namespace, workdir, embedded=embedded)
        self.procs = _Procs(env, workdir)
        self.cluster = is_cluster(rs.redis)
        self.parts = max(1, params.partitions)
        self.nodes = primaries(rs.redis)

    # -------------------------------------------------------------- utilities

    def _names(self, queue: str, parted: bool = True) -> list[str]:
        """The stored queues behind one of the bench's queues: itself, or its
        partitions (the count is stored in Redis on first use, as `add` does)."""
        if self.parts == 1 or not parted:
            return [queue]
        from rsched.queue import queues as P

        return P.names(self.rs, queue, self.parts)

    def _want(self) -> int | None:
        return self.parts if self.parts > 1 else None

    def _part_args(self) -> list[str]:
        return ["--partitions", str(self.parts)] if self.parts > 1 else []

    def _clear_queue(self, queue: str, parted: bool = True) -> None:
        for name in self._names(queue, parted):
            q = self.rs.keys.queue(name)
            self.rs.redis.unlink(
                q.sched, q.proc, q.dead, q.tasks, q.wake, q.seq, q.paused, q.consumers, q.history
            )
            self.rs.redis.unlink(q.stats, q.lanes, q.handles, q.prio, q.ready)

    def _fill(
        self,
        queue: str,
        n: int,
        task_type: str,
        *,
        delay: Callable[[int], int] | None,
        parted: bool = True,
    ) -> None:
        """Add ``n`` tasks straight through the library (no per-line parsing);
        ``parted``: into the queue's partitions (with ``--partitions``)."""
        from rsched.queue.bulk import add_counts
        from rsched.queue.model import TaskSpec

        step = 20_000
        for start in range(0, n, step):
            specs = [
                TaskSpec(
                    task_type,
                    str(i),
                    queue,
                    delay_ms=delay(i) if delay else None,
                    payload_json=f'{{"n":{i}}}',
                )
                for i in range(start, min(n, start + step))
            ]
            add_counts(self.rs, specs, batch=1000, partitions=self._want() if parted else None)

    def _wait(self, cond: Callable[[], bool], timeout: float, what: str, proc: Any = None) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if proc is not None and proc[0].poll() is not None:
                raise RschedError(f"bench: {what}: the process exited ({_tail(proc[1])})")
            if time.monotonic() > deadline:
                raise RschedError(f"bench: timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.005)

    def _consumer(
        self, queue: str, *handler_args: str, loop: Sequence[str] = ("run", "consumer")
    ) -> tuple[Any, Path]:
        names = self._names(queue)
        proc = self.procs.spawn("-q", *loop, "--queue", queue, *self._part_args(), *handler_args)
        # a consumer of a partitioned queue registers in every partition
        k = self.rs.keys.queue(names[-1])
        self._wait(
            lambda: self.rs.redis.zcard(k.consumers) > 0,
            60,
            f"the consumer of {queue} to register",
            proc,
        )
        return proc

    def _tasks_left(self, queue: str) -> int:
        return sum(int(self.rs.redis.hlen(self.rs.keys.queue(n).tasks)) for n in self._names(queue))

    def _commands(self) -> dict[str, int]:
        """Commands each primary has run (INFO commandstats; INFO itself left out)."""
        out = {}
        for name, node in self.nodes:
            stats = node.info("commandstats")
            out[name] = sum(
                int(v["calls"])
                for k, v in stats.items()
                if k.startswith("cmdstat_") and k not in ("cmdstat_info",)
            )
        return out

    # -------------------------------------------------------------- enqueue

    def _lines(self, n: int, tag: str) -> bytes:
        rnd = random.Random(1)
        return b"".join(
            json.dumps(
                {
                    "type": "bench.enqueue",
                    "id": f"{tag}-{i}",
                    "queue": "bench-enqueue",
                    "in": f"{rnd.randint(60, 86_400)}s",
                    "payload": {"n": i},
                },
                separators=(",", ":"),
            ).encode()
            + b"\n"
            for i in range(n)
        )

    def enqueue(self) -> dict[str, Any]:
        from rsched.queue.bulk import add_lines

        n = self.p.enqueue_tasks
        inproc: list[float] = []
        viaproc: list[float] = []
        cmd = rsched_command()
        for r in range(self.p.repeat):
            data = self._lines(n, f"a{r}")
            t0 = time.perf_counter()
            counts = add_lines(self.rs, data.splitlines(keepends=True), partitions=self._want())
            dt = time.perf_counter() - t0
            if counts.get("added") != n:
                raise RschedError(f"bench: enqueue added {counts} of {n}")
            inproc.append(n / dt)
            self._clear_queue("bench-enqueue")
            data = self._lines(n, f"p{r}")
            t0 = time.perf_counter()
            res = subprocess.run(
                [*cmd, "-q", "add", "--from", "-", *self._part_args(), "--json"],
                input=data,
                env=self.env,
                cwd=self.workdir,
                capture_output=True,
            )
            dt = time.perf_counter() - t0
            if res.returncode != 0 or json.loads(res.stdout).get("added") != n:
                raise RschedError(
                    f"bench: rsched add --from - exited {res.returncode}: "
                    f"{res.stderr.decode(errors='replace').strip()}"
                )
            viaproc.append(n / dt)
            self._clear_queue("bench-enqueue")
        single, zadd = self._single_adds(self.p.single_adds)
        return {
            "tasks": n,
            "in_process_per_s": round(_median(inproc)),
            "process_per_s": round(_median(viaproc)),
            "single_tasks": self.p.single_adds,
            "single_add_per_s": round(single),
            "zadd_per_s": round(zadd),
            "single_add_vs_zadd": round(single / zadd, 2) if zadd else None,
        }

    def _single_adds(self, n: int) -> tuple[float, float]:
        """Medians over the repeats of: ``n`` ``rs.add()`` calls, one task each; ``n``
        plain redis-py ``ZADD`` calls on one key, one per round trip. Alternated
        within each repeat, so that both see the same machine."""
        adds: list[float] = []
        zadds: list[float] = []
        key = f"{self.rs.namespace}:bench-zadd"
        want = self._want()
        r = self.rs.redis
        for rep in range(self.p.repeat):
            t0 = time.perf_counter()
            for i in range(n):
                self.rs.add(
                    "bench.one", f"{rep}-{i}", queue="bench-enqueue", delay=60_000, partitions=want
                )
            adds.append(n / (time.perf_counter() - t0))
            self._clear_queue("bench-enqueue")
            t0 = time.perf_counter()
            for i in range(n):
                r.zadd(key, {f"{rep}-{i}": i})
            zadds.append(n / (time.perf_counter() - t0))
            r.delete(key)
        return _median(adds), _median(zadds)

    # -------------------------------------------------------------- drain

    def _drain(
        self,
        queue: str,
        n: int,
        task_type: str,
        handler_args: list[str],
        loop: Sequence[str] = ("run", "consumer"),
    ) -> list[float]:
        from rsched.queue import ops as tasks

        rates = []
        self._names(queue)  # a partition count is stored before pausing them all
        tasks.pause(self.rs, queue)
        proc = self._consumer(queue, *handler_args, loop=loop)
        try:
            for _ in range(self.p.repeat):
                self._fill(queue, n, task_type, delay=None)
                t0 = time.perf_counter()
                tasks.resume(self.rs, queue)
                self._wait(
                    lambda: self._tasks_left(queue) == 0,
                    60 + n / 50,
                    f"the consumer to drain {queue}",
                    proc,
                )
                rates.append(n / (time.perf_counter() - t0))
                tasks.pause(self.rs, queue)
        finally:
            self.procs.stop(proc[0])
            self._clear_queue(queue)
        return rates

    def drain(self) -> dict[str, Any]:
        true = shutil.which("true") or "/bin/true"
        py = self._drain(
            "bench-drain-py",
            self.p.drain_tasks,
            "bench.drain",
            ["--call", "bench.drain=rsched.tools.bench:noop"],
        )
        cmd = self._drain(
            "bench-drain-cmd",
            self.p.command_tasks,
            "bench.drain",
            ["--handler", f"bench.drain={true}", "--concurrency", str(self.p.concurrency)],
        )
        return {
            "python_tasks": self.p.drain_tasks,
            "python_per_s": round(_median(py)),
            "command_tasks": self.p.command_tasks,
            "command_concurrency": self.p.concurrency,
            "command_per_s": round(_median(cmd)),
        }

    # -------------------------------------------------------------- app

    def app(self) -> dict[str, Any]:
        import asyncio

        from rsched.aio import Rsched as AsyncRsched
        from rsched.app import App

        p = self.p
        app = App()
        app.configure(self.settings)

        @app.task("bench.one", queue="bench-app-add")
        def one(task: Any) -> None:  # pragma: no cover - never run: only scheduled
            pass

        self._names("bench-app-add")  # (a partition count stored first, as `add` does)
        single: list[float] = []
        for rep in range(p.repeat):
            t0 = time.perf_counter()
            for i in range(p.app_single_adds):
                one.delay(f"{rep}-{i}", delay=60_000)  # type: ignore[attr-defined]
            single.append(p.app_single_adds / (time.perf_counter() - t0))
            self._clear_queue("bench-app-add")
        app.close()

        async def concurrent(rep: int) -> float:
            ars = AsyncRsched.from_settings(self.settings)
            try:
                await ars.add("bench.aio", "warm-up", queue="bench-app-add", delay=60_000)
                t0 = time.perf_counter()
                for r in range(p.app_async_rounds):
                    await asyncio.gather(
                        *(
                            ars.add(
                                "bench.aio", f"{rep}-{r}-{i}", queue="bench-app-add", delay=60_000
                            )
                            for i in range(p.app_async_concurrency)
                        )
                    )
                return p.app_async_rounds * p.app_async_concurrency / (time.perf_counter() - t0)
            finally:
                await ars.close()

        aio_rates = []
        for rep in range(p.repeat):
            aio_rates.append(asyncio.run(concurrent(rep)))
            self._clear_queue("bench-app-add")
        Path(self.workdir, "rsched_benchapp.py").write_text(BENCH_APP)
        worker = ("run", "worker", "rsched_benchapp:app", "--no-crons")
        conc = ["--concurrency", str(p.app_concurrency)]
        py = self._drain("bench-app-py", p.app_drain_tasks, "bench.py", conc, loop=worker)
        aw = self._drain("bench-app-async", p.app_drain_tasks, "bench.async", conc, loop=worker)
        return {
            "single_tasks": p.app_single_adds,
            "single_add_per_s": round(_median(single)),
            "async_tasks": p.app_async_rounds * p.app_async_concurrency,
            "async_concurrency": p.app_async_concurrency,
            "async_add_per_s": round(_median(aio_rates)),
            "drain_tasks": p.app_drain_tasks,
            "drain_concurrency": p.app_concurrency,
            "drain_python_per_s": round(_median(py)),
            "drain_async_per_s": round(_median(aw)),
        }

    # -------------------------------------------------------------- lateness

    def _lateness_once(self, queue: str, handler_args: list[str], use_finish: bool) -> list[int]:
        from rsched.queue.bulk import add_counts
        from rsched.queue.model import TaskSpec

        proc = self._consumer(queue, *handler_args)
        try:
            time.sleep(0.5)  # let it go idle: the point is waking up on time
            window_ms = int(self.p.lateness_s * 1000)
            rnd = random.Random()
            specs = [
                TaskSpec("bench.late", str(i), queue, delay_ms=rnd.randint(300, window_ms))
                for i in range(self.p.lateness_tasks)
            ]
            add_counts(self.rs, specs, partitions=self._want())
            self._wait(
                lambda: self._tasks_left(queue) == 0,
                self.p.lateness_s + 60,
                f"the tasks of {queue} to run",
                proc,
            )
        finally:
            self.procs.stop(proc[0])
        late = []
        # each record's due and start times are read from its partition's own
        # primary, so clocks of different nodes are never compared
        for name in self._names(queue):
            history = self.rs.redis.xrange(self.rs.keys.queue(name).history, "-", "+")
            for _id, fields in history:
                rec = json.loads(fields["j"])
                if rec.get("result") != "ok":
                    continue
                at = rec["finished_ms"] if use_finish else rec["started_ms"]
                late.append(int(at) - int(rec["fire_ms"]))
        self._clear_queue(queue)
        if len(late) != self.p.lateness_tasks:
            raise RschedError(f"bench: {len(late)} of {self.p.lateness_tasks} late tasks ran")
        return late

    def lateness(self) -> dict[str, Any]:
        true = shutil.which("true") or "/bin/true"
        out: dict[str, Any] = {"window_s": self.p.lateness_s, "tasks": self.p.lateness_tasks}
        for name, args, fin in (
            ("python", ["--call", "bench.late=rsched.tools.bench:noop"], False),
            ("command", ["--handler", f"bench.late={true}"], True),
        ):
            runs = [
                self._lateness_once(f"bench-late-{name}", args, fin) for _ in range(self.p.repeat)
            ]
            out[name] = {
                "p50_ms": round(_median([_pct(r, 50) for r in runs]), 1),
                "p99_ms": round(_median([_pct(r, 99) for r in runs]), 1),
                "max_ms": round(_median([max(r) for r in runs]), 1),
                "early": sum(1 for r in runs for v in r if v < 0),
                "measured_at": "handler exited" if fin else "handler started",
            }
        return out

    # -------------------------------------------------------------- cold start

    def cold(self) -> dict[str, Any]:
        cmd = rsched_command()
        times = []
        for i in range(self.p.cold_runs + 1):
            t0 = time.perf_counter()
            res = subprocess.run(
                [*cmd, "add", "--in", "1h", "--queue", "bench-cold", *self._part_args()]
                + ["bench.cold", f"c{i}"],
                env=self.env,
                cwd=self.workdir,
                capture_output=True,
            )
            dt = time.perf_counter() - t0
            if res.returncode != 0:
                raise RschedError(
                    f"bench: rsched add exited {res.returncode}: "
                    f"{res.stderr.decode(errors='replace').strip()}"
                )
            if i:  # the first run warms the page cache
                times.append(dt * 1000)
        # every add went where the library looks for it (on a cluster: the slot's primary)
        stored = self._tasks_left("bench-cold")
        if stored != self.p.cold_runs + 1:
            raise RschedError(f"bench: {stored} of {self.p.cold_runs + 1} cold adds were stored")
        self._clear_queue("bench-cold")
        return {
            "add_ms": round(_median(times), 1),
            "min_ms": round(min(times), 1),
            "runs": self.p.cold_runs,
            "command": " ".join([Path(cmd[0]).name, *cmd[1:], "add"]),
            "client": self._oneshot_client(),
        }

    def _oneshot_client(self) -> str:
        """Which client `rsched add` uses here (see rsched.core.conn.connect_oneshot)."""
        from rsched.core.conn import cluster_mode
        from rsched.core.resp import parse_url

        if self.cluster:
            if cluster_mode(self.settings) is True:
                return "redis-py cluster"
            # the lean client asks HELLO first, then hands over to redis-py's cluster client
            return "redis-py cluster (after the lean client's HELLO)"
        if self.env.get("RSCHED_REDIS_PY") == "1" or parse_url(self.settings.redis_url) is None:
            return "redis-py"
        return "lean RESP"

    # -------------------------------------------------------------- idle

    def _idle_rate(
        self, start: Callable[[], Any], monitor: bool
    ) -> tuple[dict[str, float], dict[str, float | None], str | None]:
        """Per primary: commands/s by INFO commandstats (which counts every command
        a script runs) and requests/s (what the process sent, a script call
        counting once, read from MONITOR: only connections opened after it
        started count; None when MONITOR could not be read), and why not."""
        mons: list[_Monitor] = []
        if monitor:
            import redis

            try:
                mons = [_Monitor(name, node, _client_addrs(node)) for name, node in self.nodes]
            except redis.ResponseError as exc:
                cmds, _, _ = self._idle_rate(start, False)
                return cmds, dict.fromkeys(cmds), f"CLIENT LIST refused: {exc}"
        proc = start()
        try:
            for m in mons:
                m.start()
            time.sleep(1.0)  # past its start-up commands
            s0 = {name: _server_s(node) for name, node in self.nodes}
            c0 = self._commands()
            t0 = time.monotonic()
            time.sleep(self.p.idle_s)
            c1 = self._commands()
            dt = time.monotonic() - t0
            s1 = {name: _server_s(node) for name, node in self.nodes}
        finally:
            self.procs.stop(proc[0])
            for m in mons:
                m.stop()
        cmds = {name: (c1[name] - c0[name]) / dt for name, _ in self.nodes}
        req: dict[str, float | None] = {name: None for name, _ in self.nodes}
        errors = [m.error for m in mons if m.error]
        if mons and not errors:
            for m in mons:
                lo, hi = s0[m.name], s1[m.name]  # each node's own clock
                req[m.name] = sum(1 for ts in m.stamps if lo <= ts <= hi) / (hi - lo)
        return cmds, req, "; ".join(errors) if errors else None

    def idle(self) -> dict[str, Any]:
        c0 = self._commands()
        t0 = time.monotonic()
        time.sleep(min(self.p.idle_s, 2.0) if self.embedded else self.p.idle_s)
        c1 = self._commands()
        dt = time.monotonic() - t0
        base = {name: (c1[name] - c0[name]) / dt for name, _ in self.nodes}
        # MONITOR streams every command: only on a quiet server.
        busy = sum(base.values())
        monitor = busy < 1000
        unmeasured: dict[str, str] = {}
        if not monitor:
            busy_why = (
                f"other clients send {busy:,.0f} commands/s: MONITOR (which streams every "
                "command) is not used on a busy server"
            )
            unmeasured["consumer_requests_per_s"] = unmeasured["cron_requests_per_s"] = busy_why
        consumer, consumer_req, why_c = self._idle_rate(
            lambda: self._consumer("bench-idle", "--call", "bench.idle=rsched.tools.bench:noop"),
            monitor,
        )
        if why_c:
            unmeasured["consumer_requests_per_s"] = why_c
        self._clear_queue("bench-idle")

        def cron() -> Any:
            proc = self.procs.spawn(
                "-q", "run", "cron", "bench-idle", "--schedule", "0 0 1 1 *", "--", "true"
            )
            k = self.rs.keys.cron("bench-idle")
            self._wait(
                lambda: self.rs.redis.zcard(k.runners) > 0, 60, "the cron runner to register", proc
            )
            return proc

        cron_cmds, cron_req, why = self._idle_rate(cron, monitor)
        if why:
            unmeasured["cron_requests_per_s"] = why

        def total(per: Mapping[str, float | None]) -> float | None:
            if any(v is None for v in per.values()):
                return None
            return round(sum(v for v in per.values() if v is not None), 2)

        def net(per: dict[str, float]) -> dict[str, float]:
            """Less the other clients' rate on the same node (never below 0)."""
            return {n: max(0.0, v - base[n]) for n, v in per.items()}

        out: dict[str, Any] = {
            "window_s": self.p.idle_s,
            "consumer_requests_per_s": total(consumer_req),
            "consumer_cmds_per_s": total(net(consumer)),
            "cron_requests_per_s": total(cron_req),
            "cron_cmds_per_s": total(net(cron_cmds)),
            "other_clients_cmds_per_s": round(busy, 2),
            "nodes": len(self.nodes),
            "unmeasured": unmeasured,
        }
        if self.cluster:

            def r2(v: float | None) -> float | None:
                return None if v is None else round(v, 2)

            out["per_node"] = {
                name: {
                    "consumer_requests_per_s": r2(consumer_req[name]),
                    "consumer_cmds_per_s": r2(net(consumer)[name]),
                    "cron_requests_per_s": r2(cron_req[name]),
                    "cron_cmds_per_s": r2(net(cron_cmds)[name]),
                    "other_clients_cmds_per_s": r2(base[name]),
                }
                for name, _ in self.nodes
            }
        return out

    # -------------------------------------------------------------- scale

    def _latencies(self, queue: str, size: int) -> dict[str, Any]:

        n = self.p.scale_samples
        k = self.rs.keys.queue(queue)
        rnd = random.Random(2)
        self._fill(
            queue,
            size,
            "bench.scale",
            delay=lambda i: rnd.randint(60_000, 86_400_000),
            parted=False,
        )
        mem = _used_memory(node_of(self.rs.redis, k.sched)[1])
        # `n` due tasks to claim one at a time
        from rsched.queue.bulk import add_counts
        from rsched.queue.model import TaskSpec

        add_counts(self.rs, [TaskSpec("bench.due", str(i), queue) for i in range(n)])
        claim_opts = _claim_opts(queue)
        claims, adds = [], []
        for i in range(n):
            t0 = time.perf_counter()
            out = calls.claim(self.rs, k, **claim_opts)
            t1 = time.perf_counter()
            if not len(out):
                raise RschedError("bench: a claim found nothing due")
            claims.append((t1 - t0) * 1e6)
            task = (f"bench.add {i}", f"+{rnd.randint(60_000, 86_400_000)}", '{"n":1}', 0)
            t0 = time.perf_counter()
            calls.add(self.rs, k, "keep", "tasks", [task])
            adds.append((time.perf_counter() - t0) * 1e6)
        typed = self._typed_claims(queue, k, claim_opts, n)
        return {
            "claim_p50_us": _pct(claims, 50),
            "add_p50_us": _pct(adds, 50),
            "mem": mem,
            **typed,
        }

    def _typed_claims(
        self, queue: str, k: QueueKeys, claim_opts: dict[str, Any], n: int
    ) -> dict[str, float]:
        """A consumer of one type (``bench.due``) claiming one task at a time, with
        ``n`` due tasks of a type no consumer runs (``bench.other``) ahead of its own:
        the first claim parks them (in calls of PARK_LIMIT), then every claim reads
        its own type only."""
        from rsched.consumer.loop import PARK_LIMIT
        from rsched.queue.bulk import add_counts
        from rsched.queue.model import TaskSpec

        add_counts(self.rs, [TaskSpec("bench.other", str(i), queue) for i in range(n)])
        add_counts(self.rs, [TaskSpec("bench.due", f"t{i}", queue) for i in range(n)])
        typed_opts = {
            **claim_opts,
            "check": False,
            "handles_json": '["bench.due"]',
            "park_limit": PARK_LIMIT,
            "type_patterns": ["^bench%.due$"],
        }
        claims: list[float] = []
        parking: list[float] = []
        while len(claims) < n:
            t0 = time.perf_counter()
            out = calls.claim(self.rs, k, **typed_opts)
            t1 = time.perf_counter()
            if not len(out):
                parking.append((t1 - t0) * 1e6)  # parked a batch of bench.other
                if len(parking) > n // PARK_LIMIT + 2:
                    raise RschedError("bench: a typed claim found nothing due")
                continue
            member = str(next(out.tasks())[0])
            if member.split(" ")[0] != "bench.due":
                raise RschedError(f"bench: a bench.due consumer claimed {member}")
            claims.append((t1 - t0) * 1e6)
        return {
            "claim_typed_p50_us": _pct(claims, 50),
            "claim_typed_first_us": (parking or claims)[0],
        }

    def _priority_claims(self, queue: str, size: int) -> dict[str, float]:
        """``size`` due tasks of priority 0 and ``n`` due ones of other priorities
        (half above 0, half below), claimed one at a time: the first claim readies
        the ``n`` (see rsched/lua/_prio.lua; reported apart), then the ones above 0
        come out of the ready set and the next ones out of the due backlog."""
        from rsched.queue.bulk import add_counts
        from rsched.queue.model import TaskSpec

        n = self.p.scale_samples
        k = self.rs.keys.queue(queue)
        self._fill(queue, size, "bench.prio0", delay=None, parted=False)
        rnd = random.Random(3)
        specs = [TaskSpec("bench.prio", str(i), queue) for i in range(n)]
        for i, spec in enumerate(specs):
            spec.priority = rnd.randint(1, 10) * (1 if i % 2 else -1)
        add_counts(self.rs, specs)
        opts = {**_claim_opts(queue), "check": False}
        times: list[float] = []
        for i in range(n + 1):
            t0 = time.perf_counter()
            out = calls.claim(self.rs, k, **opts)
            times.append((time.perf_counter() - t0) * 1e6)
            member = str(next(out.tasks())[0])
            want = "bench.prio" if i < n // 2 else "bench.prio0"
            if member.split(" ")[0] != want:
                raise RschedError(f"bench: claim {i} took {member}, not a {want}")
        self._clear_queue(queue, parted=False)
        return {"claim_prio_first_us": times[0], "claim_prio_p50_us": _pct(times[1:], 50)}

    def scale(self) -> dict[str, Any]:
        """The queues here are never partitioned: a partition is one such queue.
        Memory is read from the server (on a cluster: the primary) holding the
        large queue's slot, before and after it is filled."""
        small, large = self.p.scale_small, self.p.scale_large
        a = self._latencies("bench-scale-small", small)
        self._clear_queue("bench-scale-small", parted=False)
        time.sleep(0.2)
        where, node = node_of(self.rs.redis, self.rs.keys.queue("bench-scale-large").sched)
        before = _used_memory(node)
        b = self._latencies("bench-scale-large", large)
        self._clear_queue("bench-scale-large", parted=False)
        pa = self._priority_claims("bench-scale-small", small)
        pb = self._priority_claims("bench-scale-large", large)
        unmeasured = {}
        per_task = None
        if before is None or b["mem"] is None:
            unmeasured["memory_bytes_per_task"] = f"INFO memory refused by {where}"
        else:
            per_task = round((b["mem"] - before) / large)
        out = {
            "small": small,
            "large": large,
            "claim_p50_us_small": round(a["claim_p50_us"]),
            "claim_p50_us_large": round(b["claim_p50_us"]),
            "claim_ratio": round(b["claim_p50_us"] / max(a["claim_p50_us"], 1e-9), 2),
            "claim_typed_p50_us_small": round(a["claim_typed_p50_us"]),
            "claim_typed_p50_us_large": round(b["claim_typed_p50_us"]),
            "claim_typed_first_us_large": round(b["claim_typed_first_us"]),
            "claim_prio_p50_us_small": round(pa["claim_prio_p50_us"]),
            "claim_prio_p50_us_large": round(pb["claim_prio_p50_us"]),
            "claim_prio_ratio": round(
                pb["claim_prio_p50_us"] / max(pa["claim_prio_p50_us"], 1e-9), 2
            ),
            "claim_prio_first_us_large": round(pb["claim_prio_first_us"]),
            "add_p50_us_small": round(a["add_p50_us"]),
            "add_p50_us_large": round(b["add_p50_us"]),
            "add_ratio": round(b["add_p50_us"] / max(a["add_p50_us"], 1e-9), 2),
            "memory_bytes_per_task": per_task,
            **self._log_memory(unmeasured),
            "unmeasured": unmeasured,
        }
        if self.cluster:
            out["memory_node"] = where
        return out

    def _log_memory(self, unmeasured: dict[str, str]) -> dict[str, Any]:
        """Redis memory per kept run log (``MEMORY USAGE`` of a cron's logs hash and
        its index): 100 logs of 1 KiB, then 100 full 64 KiB ones."""
        from rsched.runtime.handlers import log_json

        k = self.rs.keys.cron("bench-logs")
        where, node = node_of(self.rs.redis, k.logs)
        out: dict[str, Any] = {}
        for label, size in (("1k", 1024), ("64k", 65536)):
            node.delete(k.logs, k.log_index)
            text = log_json(b"x" * size, b"", False)
            for i in range(100):
                calls.log_put(self.rs, k, token=str(i), log=text, history_maxlen=1000)
            try:
                used = sum(
                    int(node.memory_usage(key, samples=0) or 0) for key in (k.logs, k.log_index)
                )
            except Exception as exc:  # noqa: BLE001 - MEMORY may be refused (ACL)
                unmeasured[f"log_bytes_{label}"] = f"MEMORY USAGE refused by {where}: {exc}"
                out[f"log_bytes_{label}"] = None
            else:
                out[f"log_bytes_{label}"] = round(used / 100)
        node.delete(k.logs, k.log_index)
        return out

    # -------------------------------------------------------------- locks

    def locks(self) -> dict[str, Any]:
        name = "bench-handover"
        key = self.rs.keys.lock(name)
        _where, node = node_of(self.rs.redis, key.lock)
        samples: list[float] = []
        for chain in range(self.p.lock_chains):
            first = Lock(self.rs, name, ttl_ms=60_000, watchdog=False)
            first.acquire()
            outs, procs = [], []
            done = Path(self.workdir) / f"handover-{chain}.done"
            for i in range(self.p.lock_waiters):
                out = Path(self.workdir) / f"handover-{chain}-{i}.txt"
                outs.append(out)
                args = (name, str(out), str(done), WAITER_CLIENT_NAME)
                procs.append(self.procs.spawn("-c", _WAITER, *args, python=True))

            def blocked() -> bool:
                return (
                    sum(
                        1
                        for c in node.client_list()
                        if c.get("name") == WAITER_CLIENT_NAME and c.get("cmd") == "blpop"
                    )
                    >= self.p.lock_waiters
                )

            self._wait(blocked, 120, "the lock waiters to block", procs[0])
            t_rel = time.monotonic_ns()
            first.release()
            self._wait(partial(_all_exist, outs), 120, "the lock hand-overs")
            done.touch()  # the waiters exit now: not while the next one takes the lock
            for p, log in procs:
                if p.wait(timeout=120) != 0:
                    raise RschedError(f"bench: a lock waiter exited {p.returncode} ({_tail(log)})")
            runs = sorted(tuple(map(int, o.read_text().split())) for o in outs)
            prev = t_rel
            for acquired, released in runs:
                samples.append((acquired - prev) / 1e6)
                prev = released
        return {
            "handovers": len(samples),
            "handover_p50_ms": round(_pct(samples, 50), 2),
            "handover_p99_ms": round(_pct(samples, 99), 2),
            "handover_max_ms": round(max(samples), 2),
            "waiters": self.p.lock_waiters,
        }


def _all_exist(paths: list[Path]) -> bool:
    return all(p.exists() for p in paths)


#: The lock waiters' connection name (CLIENT SETNAME), so that the bench sees them block.
WAITER_CLIENT_NAME = "rsched-bench-lock-waiter"

_WAITER = "import sys; from rsched.tools.bench import lock_waiter; lock_waiter(*sys.argv[1:])"


def lock_waiter(name: str, out: str, done: str, client_name: str) -> None:
    """One waiter of the ``locks`` section (a process of its own): wait for lock
    ``name``, then release it at once; write both ``CLOCK_MONOTONIC`` times (ns),
    and exit once the file ``done`` exists (a process exiting takes CPU from the
    next hand-over)."""
    from rsched.api import Rsched
    from rsched.core.config import resolve

    rs = Rsched.from_settings(resolve())
    rs.redis.client_setname(client_name)  # the pool's connection: the one that blocks
    lk = Lock(rs, name, ttl_ms=60_000, wait=300, watchdog=False)
    lk.acquire()
    acquired = time.monotonic_ns()
    released = time.monotonic_ns()
    lk.release()
    tmp = Path(out + ".tmp")
    tmp.write_text(f"{acquired} {released}\n")
    tmp.rename(out)
    while not os.path.exists(done):
        time.sleep(0.05)


def _used_memory(node: Any) -> int | None:
    """``used_memory`` of one server (None when INFO memory is refused)."""
    import redis

    try:
        return int(node.info("memory")["used_memory"])
    except (redis.ResponseError, KeyError):
        return None


# --------------------------------------------------------------------------- entry


def _check_memory(rs: Rsched, params: Params, sections: list[str]) -> None:
    if "scale" not in sections:
        return
    # the large queue lives on one server: on a cluster, the primary of its slot
    where, node = node_of(rs.redis, rs.keys.queue("bench-scale-large").sched)
    info = node.info("memory")
    maxmem = int(info.get("maxmemory") or 0)
    need = params.scale_large * 400
    if maxmem and int(info["used_memory"]) + need > maxmem * 0.8:
        server = "this server's" if where == "server" else f"the maxmemory of {where} (its slot)"
        raise BadInput(
            "--quick",
            f"the scale test needs about {need // 1_000_000} MB and {server} maxmemory "
            f"leaves less; use --quick (100,000 tasks) or leave out scale with --only",
        )


@contextmanager
def _embedded_server(workdir: str) -> Iterator[str]:
    from rsched.tools import server as srv

    inst = srv.prepare(os.path.join(workdir, "server"), port=0, daemon=True)
    srv.start_daemon(inst)
    try:
        c = inst.client()
        # A throwaway server: no RDB snapshot forks in the middle of a measurement.
        c.config_set("save", "")
        yield inst.url
    finally:
        srv.stop(inst.dir)


def run(
    settings: Settings,
    *,
    embedded: bool = False,
    namespace: str | None = None,
    params: Params | None = None,
    sections: list[str] | None = None,
    say: Callable[[str], None] = lambda s: None,
) -> Report:
    """Run the bench; see the module docstring."""
    from dataclasses import asdict, replace

    from rsched.api import Rsched
    from rsched.core.conn import connect

    params = params or Params()
    chosen = list(sections or SECTIONS)
    for name in chosen:
        if name not in SECTIONS:
            raise BadInput("--only", f"{name!r} is not one of {', '.join(SECTIONS)}")
    if params.partitions != 1:
        from rsched.queue.queues import check_count

        params.partitions = check_count(params.partitions)
    ns = namespace or f"rsched-bench-{secrets.token_hex(3)}"
    report = Report(machine=machine_info(), params=asdict(params))
    t_start = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="rsched-bench-")
    try:
        with _maybe_embedded(embedded, workdir) as url:
            s = replace(settings, redis_url=url, namespace=ns) if url else replace(settings)
            s.namespace = ns
            if url:  # the embedded server: none of the configured server's options
                s.username = s.password = None
                s.config_path = None
                s.cluster = None
                s.wait_replicas = 0
            rs = Rsched(connect(s, socket_timeout=120), ns, settings=None)
            found = namespace_keys(rs, ns, limit=1)
            if found:
                raise Conflict(
                    f"namespace {ns} is not empty (it holds {found[0]}); bench only runs in an "
                    "empty namespace, which it deletes afterwards"
                )
            _check_memory(rs, params, chosen)
            info = rs.redis.info("server")
            report.server = {
                "url": s.safe_url,
                "embedded": embedded,
                "version": info.get("valkey_version") or info.get("redis_version"),
                "flavour": "valkey" if info.get("valkey_version") else "redis",
                "namespace": ns,
                "cluster": is_cluster(rs.redis),
                "primaries": len(primaries(rs.redis)),
                "partitions": params.partitions,
            }
            bench = Bench(rs, s, params, workdir, embedded=embedded, say=say)
            try:
                for name in SECTIONS:
                    if name in chosen:
                        say(f"bench: {name} ...")
                        report.results[name] = getattr(bench, name)()
            finally:
                bench.procs.close()
                if not embedded:
                    delete_namespace(rs, ns)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report.seconds = time.monotonic() - t_start
    return report


@contextmanager
def _maybe_embedded(embedded: bool, workdir: str) -> Iterator[str | None]:
    if not embedded:
        yield None
        return
    with _embedded_server(workdir) as url:
        yield url


# --------------------------------------------------------------------------- rendering


ROWS: list[tuple[str, str, str]] = [
    ("enqueue.in_process_per_s", "enqueue: add --from, in process", "tasks/s"),
    ("enqueue.process_per_s", "enqueue: rsched add --from - process", "tasks/s"),
    ("enqueue.single_add_per_s", "enqueue: rs.add(), one task per call", "tasks/s"),
    ("enqueue.zadd_per_s", "enqueue: plain ZADD, one per round trip", "calls/s"),
    ("enqueue.single_add_vs_zadd", "enqueue: rs.add() / plain ZADD", "x"),
    ("drain.python_per_s", "drain: consumer, Python no-op", "tasks/s"),
    ("drain.command_per_s", "drain: consumer, command `true`", "tasks/s"),
    ("lateness.python.p50_ms", "lateness p50: Python handler", "ms"),
    ("lateness.python.p99_ms", "lateness p99: Python handler", "ms"),
    ("lateness.python.max_ms", "lateness max: Python handler", "ms"),
    ("lateness.python.early", "early runs: Python handler", "tasks"),
    ("lateness.command.p50_ms", "lateness p50: command (run by)", "ms"),
    ("lateness.command.p99_ms", "lateness p99: command (run by)", "ms"),
    ("lateness.command.max_ms", "lateness max: command (run by)", "ms"),
    ("lateness.command.early", "early runs: command", "tasks"),
    ("cold.add_ms", "cold start: rsched add", "ms"),
    ("idle.consumer_requests_per_s", "idle consumer: requests", "/s"),
    ("idle.consumer_cmds_per_s", "idle consumer: commands incl. in scripts", "/s"),
    ("idle.cron_requests_per_s", "idle cron runner: requests", "/s"),
    ("idle.cron_cmds_per_s", "idle cron runner: commands incl. in scripts", "/s"),
    ("scale.claim_p50_us_small", "claim p50, small queue", "us"),
    ("scale.claim_p50_us_large", "claim p50, large queue", "us"),
    ("scale.claim_ratio", "claim p50 large / small", "x"),
    ("scale.claim_typed_p50_us_small", "claim p50, one type, small queue", "us"),
    ("scale.claim_typed_p50_us_large", "claim p50, one type, large queue", "us"),
    ("scale.claim_typed_first_us_large", "first claim, one type (parks others)", "us"),
    ("scale.claim_prio_p50_us_small", "claim p50, priorities, small queue (all due)", "us"),
    ("scale.claim_prio_p50_us_large", "claim p50, priorities, large queue (all due)", "us"),
    ("scale.claim_prio_ratio", "claim p50 with priorities, large / small", "x"),
    ("scale.claim_prio_first_us_large", "first claim, priorities (readies them)", "us"),
    ("scale.add_p50_us_small", "add p50, small queue", "us"),
    ("scale.add_p50_us_large", "add p50, large queue", "us"),
    ("scale.memory_bytes_per_task", "Redis memory per scheduled task", "bytes"),
    ("scale.log_bytes_1k", "Redis memory per kept run log, 1 KiB of output", "bytes"),
    ("scale.log_bytes_64k", "Redis memory per kept run log, 64 KiB of output", "bytes"),
    ("locks.handover_p50_ms", "lock hand-over p50: release to waiter", "ms"),
    ("locks.handover_p99_ms", "lock hand-over p99: release to waiter", "ms"),
    ("app.single_add_per_s", "app: task.delay(), one task per call", "tasks/s"),
    ("app.async_add_per_s", "app: 1,000 concurrent await rs.add() (aio)", "tasks/s"),
    ("app.drain_python_per_s", "app: run worker drain, Python no-op", "tasks/s"),
    ("app.drain_async_per_s", "app: run worker drain, async no-op", "tasks/s"),
]


def _fmt(v: Any) -> str:
    if isinstance(v, float) and not v.is_integer():
        return f"{v:,.2f}" if abs(v) < 10 else f"{v:,.1f}"
    if isinstance(v, int | float):
        return f"{int(v):,}"
    return str(v)


def unmeasured(report: Report) -> dict[str, str]:
    """``section.figure`` -> why it is None (each section's ``unmeasured``)."""
    out = {}
    for section, res in report.results.items():
        if isinstance(res, dict):
            for key, why in (res.get("unmeasured") or {}).items():
                out[f"{section}.{key}"] = why
    return out


def table_rows(report: Report) -> list[list[str]]:
    met = report.met()
    why = unmeasured(report)
    rows = []
    for path, label, unit in ROWS:
        v = report.value(path)
        if v is None and path not in why:
            continue
        t = TARGETS.get(path)
        target = f"{'≥' if t[0] == '>=' else '≤'} {_fmt(t[1])}" if t else ""
        ok = "" if path not in met else ("yes" if met[path] else "NO")
        rows.append([label, "n/a" if v is None else _fmt(v), unit, target, ok])
    return rows
