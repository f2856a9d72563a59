"""`rsched bench`: how fast is this Redis for rsched?

Every figure is measured with real processes against one Redis: the configured
one (in a throwaway namespace that must be empty and is deleted afterwards) or
an embedded server started for the run (:func:`rsched.server.prepare`).

Sections (``only`` picks some):

``enqueue``   ``add --from`` JSON lines: parsed and added in this process, and
              through a real ``rsched add --from -`` process (start to exit).
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
              queue of scheduled tasks, and Redis memory per scheduled task.

Throughput and lateness figures are medians of ``repeat`` runs.
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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rsched.errors import BadInput, Conflict, RschedError

if TYPE_CHECKING:  # pragma: no cover
    from rsched.client import Rsched
    from rsched.config import Settings

SECTIONS = ("enqueue", "drain", "lateness", "cold", "idle", "scale")

#: What the issue asks of rsched (shown next to the figures; benchmarks, not tests).
TARGETS: dict[str, tuple[str, float]] = {
    "enqueue.in_process_per_s": (">=", 50_000),
    "enqueue.process_per_s": (">=", 50_000),
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
    "scale.memory_bytes_per_task": ("<=", 250),
}


def noop(task: Any) -> None:
    """The Python handler the drain and lateness runs use: does nothing."""


@dataclass
class Params:
    """Sizes of one run; :meth:`quick` is the small variant (about a minute)."""

    enqueue_tasks: int = 100_000
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
    repeat: int = 3

    @classmethod
    def quick(cls) -> Params:
        return cls(
            enqueue_tasks=20_000,
            drain_tasks=10_000,
            command_tasks=300,
            lateness_s=3.0,
            lateness_tasks=60,
            cold_runs=5,
            idle_s=5.0,
            scale_large=100_000,
            scale_samples=300,
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

    def spawn(self, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = Path(self.workdir) / f"proc-{len(self.procs)}.log"
        with open(log, "wb") as fh:
            p = subprocess.Popen(
                [sys.executable, "-m", "rsched", *args],
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


def namespace_keys(rs: Rsched, namespace: str, limit: int | None = None) -> list[str]:
    """Keys of ``namespace`` (SCAN, never KEYS); stops after ``limit``."""
    out: list[str] = []
    for k in rs.redis.scan_iter(match=f"{namespace}:*", count=1000):
        out.append(k)
        if limit is not None and len(out) >= limit:
            break
    return out


def delete_namespace(rs: Rsched, namespace: str) -> int:
    n = 0
    batch: list[str] = []
    for k in rs.redis.scan_iter(match=f"{namespace}:*", count=1000):
        batch.append(k)
        if len(batch) >= 500:
            n += int(rs.redis.unlink(*batch))
            batch = []
    if batch:
        n += int(rs.redis.unlink(*batch))
    return n


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
        env = {
            k: v for k, v in os.environ.items() if not k.startswith("RSCHED_") and k != "REDIS_URL"
        }
        env.update(
            {
                "RSCHED_REDIS_URL": settings.redis_url,
                "RSCHED_NAMESPACE": rs.namespace,
                "NO_COLOR": "1",
            }
        )
        if embedded:
            env["XDG_CONFIG_HOME"] = os.path.join(workdir, "xdg")  # no user config
        else:
            if settings.password is not None:
                env["RSCHED_REDIS_PASSWORD"] = settings.password
            if settings.config_path is not None:
                # absolute: the processes run in the bench's own directory
                env["RSCHED_CONFIG"] = str(Path(settings.config_path).resolve())
            for var in ("RSCHED_TLS_CA", "RSCHED_TLS_CERT", "RSCHED_TLS_KEY"):
                if os.environ.get(var):
                    env[var] = os.environ[var]
        self.env = env
        self.procs = _Procs(env, workdir)

    # -------------------------------------------------------------- utilities

    def _clear_queue(self, queue: str) -> None:
        q = self.rs.keys.queue(queue)
        self.rs.redis.unlink(
            q.sched, q.proc, q.dead, q.tasks, q.wake, q.seq, q.paused, q.consumers, q.history
        )
        self.rs.redis.unlink(q.stats)

    def _fill(self, queue: str, n: int, task_type: str, *, delay: Callable[[int], int] | None):
        """Add ``n`` tasks straight through the library (no per-line parsing)."""
        from rsched.tasks import TaskSpec, add_counts

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
            add_counts(self.rs, specs, batch=1000)

    def _wait(self, cond: Callable[[], bool], timeout: float, what: str, proc: Any = None) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if proc is not None and proc[0].poll() is not None:
                raise RschedError(f"bench: {what}: the process exited ({_tail(proc[1])})")
            if time.monotonic() > deadline:
                raise RschedError(f"bench: timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.005)

    def _consumer(self, queue: str, *handler_args: str) -> tuple[Any, Path]:
        proc = self.procs.spawn("-q", "run", "consumer", "--queue", queue, *handler_args)
        k = self.rs.keys.queue(queue)
        self._wait(
            lambda: self.rs.redis.zcard(k.consumers) > 0,
            60,
            f"the consumer of {queue} to register",
            proc,
        )
        return proc

    def _tasks_left(self, queue: str) -> int:
        return int(self.rs.redis.hlen(self.rs.keys.queue(queue).tasks))

    def _commands(self) -> int:
        stats = self.rs.redis.info("commandstats")
        return sum(
            int(v["calls"])
            for k, v in stats.items()
            if k.startswith("cmdstat_") and k not in ("cmdstat_info",)
        )

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
        from rsched.tasks import add_lines

        n = self.p.enqueue_tasks
        inproc: list[float] = []
        viaproc: list[float] = []
        cmd = rsched_command()
        for r in range(self.p.repeat):
            data = self._lines(n, f"a{r}")
            t0 = time.perf_counter()
            counts = add_lines(self.rs, data.splitlines(keepends=True))
            dt = time.perf_counter() - t0
            if counts.get("added") != n:
                raise RschedError(f"bench: enqueue added {counts} of {n}")
            inproc.append(n / dt)
            self._clear_queue("bench-enqueue")
            data = self._lines(n, f"p{r}")
            t0 = time.perf_counter()
            res = subprocess.run(
                [*cmd, "-q", "add", "--from", "-", "--json"],
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
        return {
            "tasks": n,
            "in_process_per_s": round(_median(inproc)),
            "process_per_s": round(_median(viaproc)),
        }

    # -------------------------------------------------------------- drain

    def _drain(self, queue: str, n: int, task_type: str, handler_args: list[str]) -> list[float]:
        from rsched import tasks

        rates = []
        tasks.pause(self.rs, queue)
        proc = self._consumer(queue, *handler_args)
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
            ["--call", "bench.drain=rsched.bench:noop"],
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

    # -------------------------------------------------------------- lateness

    def _lateness_once(self, queue: str, handler_args: list[str], use_finish: bool) -> list[int]:
        from rsched.tasks import TaskSpec, add_counts

        proc = self._consumer(queue, *handler_args)
        try:
            time.sleep(0.5)  # let it go idle: the point is waking up on time
            window_ms = int(self.p.lateness_s * 1000)
            rnd = random.Random()
            specs = [
                TaskSpec("bench.late", str(i), queue, delay_ms=rnd.randint(300, window_ms))
                for i in range(self.p.lateness_tasks)
            ]
            add_counts(self.rs, specs)
            self._wait(
                lambda: self._tasks_left(queue) == 0,
                self.p.lateness_s + 60,
                f"the tasks of {queue} to run",
                proc,
            )
        finally:
            self.procs.stop(proc[0])
        late = []
        for _id, fields in self.rs.redis.xrange(self.rs.keys.queue(queue).history, "-", "+"):
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
            ("python", ["--call", "bench.late=rsched.bench:noop"], False),
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
                [*cmd, "add", "--in", "1h", "--queue", "bench-cold", "bench.cold", f"c{i}"],
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
        self._clear_queue("bench-cold")
        return {
            "add_ms": round(_median(times), 1),
            "min_ms": round(min(times), 1),
            "runs": self.p.cold_runs,
            "command": " ".join([Path(cmd[0]).name, *cmd[1:], "add"]),
        }

    # -------------------------------------------------------------- idle

    def _server_s(self) -> float:
        sec, usec = self.rs.redis.time()
        return int(sec) + int(usec) / 1e6

    def _idle_rate(self, start: Callable[[], Any], monitor: bool) -> tuple[float, float | None]:
        """(commands/s by INFO commandstats, which counts every command a script runs;
        requests/s: what clients sent, a script call counting once, read from MONITOR)."""
        import threading

        from rsched.conn import connect

        proc = start()
        requests: list[float] = []
        mon = connect(self.settings, check=False, socket_timeout=None) if monitor else None
        ready = threading.Event()
        stop = threading.Event()

        def read() -> None:
            assert mon is not None
            conn = mon.connection_pool.get_connection()
            try:
                conn.send_command("MONITOR")
                conn.read_response()
                ready.set()
                while not stop.is_set():
                    line = str(conn.read_response())
                    head, _, rest = line.partition(" ")
                    if " lua] " in line[:40] or stop.is_set():
                        continue
                    cmd = rest.partition("] ")[2].split(" ", 1)[0].strip('"').upper()
                    if cmd not in ("INFO", "TIME"):  # the bench's own
                        requests.append(float(head))
            except Exception:  # noqa: BLE001 - the connection is closed to end it
                pass
            finally:
                ready.set()
                conn.disconnect()

        reader = threading.Thread(target=read, daemon=True) if monitor else None
        try:
            if reader is not None:
                reader.start()
                ready.wait(10)
            time.sleep(1.0)  # past its start-up commands
            s0 = self._server_s()
            c0 = self._commands()
            t0 = time.monotonic()
            time.sleep(self.p.idle_s)
            c1 = self._commands()
            dt = time.monotonic() - t0
            s1 = self._server_s()
        finally:
            stop.set()
            self.procs.stop(proc[0])
            if reader is not None:
                self.rs.redis.time()  # one more line for the reader to see `stop`
                reader.join(10)
        req = None
        if monitor:
            req = sum(1 for ts in requests if s0 <= ts <= s1) / (s1 - s0)
        return (c1 - c0) / dt, req

    def idle(self) -> dict[str, Any]:
        base = 0.0
        c0 = self._commands()
        t0 = time.monotonic()
        time.sleep(min(self.p.idle_s, 2.0) if self.embedded else self.p.idle_s)
        base = (self._commands() - c0) / (time.monotonic() - t0)
        # MONITOR streams every command: only on a quiet server.
        monitor = base < 1000
        consumer, consumer_req = self._idle_rate(
            lambda: self._consumer("bench-idle", "--call", "bench.idle=rsched.bench:noop"),
            monitor,
        )
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

        cron_cmds, cron_req = self._idle_rate(cron, monitor)
        return {
            "window_s": self.p.idle_s,
            "consumer_requests_per_s": None if consumer_req is None else round(consumer_req, 2),
            "consumer_cmds_per_s": round(max(0.0, consumer - base), 2),
            "cron_requests_per_s": None if cron_req is None else round(cron_req, 2),
            "cron_cmds_per_s": round(max(0.0, cron_cmds - base), 2),
            "other_clients_cmds_per_s": round(base, 2),
        }

    # -------------------------------------------------------------- scale

    def _latencies(self, queue: str, size: int) -> dict[str, float]:
        from rsched.client import DEFAULT_MAX_ATTEMPTS

        n = self.p.scale_samples
        k = self.rs.keys.queue(queue)
        rnd = random.Random(2)
        self._fill(queue, size, "bench.scale", delay=lambda i: rnd.randint(60_000, 86_400_000))
        mem = int(self.rs.redis.info("memory")["used_memory"])
        # `n` due tasks to claim one at a time
        from rsched.tasks import TaskSpec, add_counts

        add_counts(self.rs, [TaskSpec("bench.due", str(i), queue) for i in range(n)])
        claim_keys = [k.sched, k.proc, k.dead, k.tasks, k.wake, k.seq, k.paused]
        claim_keys += [k.consumers, k.history]
        claim_args = [1, 60_000, "bench", 15_000, 100, 0, queue, DEFAULT_MAX_ATTEMPTS]
        add_keys = [k.sched, k.proc, k.dead, k.tasks, k.wake]
        claims, adds = [], []
        for i in range(n):
            t0 = time.perf_counter()
            out = self.rs.scripts("claim-9", claim_keys, claim_args)
            t1 = time.perf_counter()
            if len(out) <= 6:
                raise RschedError("bench: a claim found nothing due")
            claims.append((t1 - t0) * 1e6)
            args = [
                "keep",
                "tasks",
                f"bench.add {i}",
                f"+{rnd.randint(60_000, 86_400_000)}",
                '{"n":1}',
                0,
            ]
            t0 = time.perf_counter()
            self.rs.scripts("add-5", add_keys, args)
            adds.append((time.perf_counter() - t0) * 1e6)
        return {"claim_p50_us": _pct(claims, 50), "add_p50_us": _pct(adds, 50), "mem": mem}

    def scale(self) -> dict[str, Any]:
        small, large = self.p.scale_small, self.p.scale_large
        a = self._latencies("bench-scale-small", small)
        self._clear_queue("bench-scale-small")
        time.sleep(0.2)
        before = int(self.rs.redis.info("memory")["used_memory"])
        b = self._latencies("bench-scale-large", large)
        self._clear_queue("bench-scale-large")
        return {
            "small": small,
            "large": large,
            "claim_p50_us_small": round(a["claim_p50_us"]),
            "claim_p50_us_large": round(b["claim_p50_us"]),
            "claim_ratio": round(b["claim_p50_us"] / max(a["claim_p50_us"], 1e-9), 2),
            "add_p50_us_small": round(a["add_p50_us"]),
            "add_p50_us_large": round(b["add_p50_us"]),
            "add_ratio": round(b["add_p50_us"] / max(a["add_p50_us"], 1e-9), 2),
            "memory_bytes_per_task": round((b["mem"] - before) / large),
        }


# --------------------------------------------------------------------------- entry


def _check_memory(rs: Rsched, params: Params, sections: list[str]) -> None:
    if "scale" not in sections:
        return
    info = rs.redis.info("memory")
    maxmem = int(info.get("maxmemory") or 0)
    need = params.scale_large * 400
    if maxmem and int(info["used_memory"]) + need > maxmem * 0.8:
        raise BadInput(
            "--quick",
            f"the scale test needs about {need // 1_000_000} MB and this server's maxmemory "
            f"leaves less; use --quick (100,000 tasks) or leave out scale with --only",
        )


@contextmanager
def _embedded_server(workdir: str) -> Iterator[str]:
    from rsched import server as srv

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

    from rsched.client import Rsched
    from rsched.conn import connect

    params = params or Params()
    chosen = list(sections or SECTIONS)
    for name in chosen:
        if name not in SECTIONS:
            raise BadInput("--only", f"{name!r} is not one of {', '.join(SECTIONS)}")
    ns = namespace or f"rsched-bench-{secrets.token_hex(3)}"
    report = Report(machine=machine_info(), params=asdict(params))
    t_start = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="rsched-bench-")
    try:
        with _maybe_embedded(embedded, workdir) as url:
            s = replace(settings, redis_url=url, namespace=ns) if url else replace(settings)
            s.namespace = ns
            if url:
                s.password = None
                s.config_path = None
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
    ("scale.add_p50_us_small", "add p50, small queue", "us"),
    ("scale.add_p50_us_large", "add p50, large queue", "us"),
    ("scale.memory_bytes_per_task", "Redis memory per scheduled task", "bytes"),
]


def _fmt(v: Any) -> str:
    if isinstance(v, float) and not v.is_integer():
        return f"{v:,.2f}" if abs(v) < 10 else f"{v:,.1f}"
    if isinstance(v, int | float):
        return f"{int(v):,}"
    return str(v)


def table_rows(report: Report) -> list[list[str]]:
    met = report.met()
    rows = []
    for path, label, unit in ROWS:
        v = report.value(path)
        if v is None:
            continue
        t = TARGETS.get(path)
        target = f"{'≥' if t[0] == '>=' else '≤'} {_fmt(t[1])}" if t else ""
        ok = "" if path not in met else ("yes" if met[path] else "NO")
        rows.append([label, _fmt(v), unit, target, ok])
    return rows
