"""What the web console costs, measured on a real server (not a test: run it by hand).

    .venv/bin/python -m tests.integration.web.bench_web [--tasks 1000000] [--seconds 10]

1. Redis commands/s of one open overview page: chromium (headless, Debian's)
   keeps the overview open with its live refresh, and the server's
   ``INFO commandstats`` is read before and after ``--seconds`` (the INFO
   calls themselves left out; no other client runs meanwhile).
2. Render time of a queue page on a queue of ``--tasks`` tasks (filled with
   ``add_many``: pipelined ``add-5`` calls of 500): the first page, a page deep
   in the queue (a cursor at its middle) and ``/api/tasks``; median of 25 each.
"""

from __future__ import annotations

import argparse
import statistics
import time
import urllib.request
from typing import Any

from rsched.api import Rsched
from rsched.queue import paging
from rsched.queue.specs import make_spec
from tests.integration.web.conftest import start_web
from tests.integration.web.test_web_browser import ARGS, CHROMIUM
from tests.support import Cli, RedisServer, wait_for


def commands(client: Any) -> int:
    stats = client.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k != "cmdstat_info")


def fill(rs: Rsched, queue: str, n: int) -> float:
    t0 = time.perf_counter()
    batch = 20_000
    for start in range(0, n, batch):
        rs.add_many(
            [
                make_spec("job", f"task-{i:07d}", queue=queue, delay=f"{1 + i % 86_400}s")
                for i in range(start, min(n, start + batch))
            ]
        )
    return time.perf_counter() - t0


def median_ms(base: str, url: str, n: int = 25) -> tuple[float, float]:
    """(median round trip seen by the client, body read, median Server-Timing of the
    app) in ms. urllib, a connection per request: httpx's keep-alive client adds
    ~40 ms of its own on loopback (measured: 44 ms against urllib's 1.1 ms)."""
    times, app = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        with urllib.request.urlopen(base + url, timeout=30) as r:
            r.read()
            timing = r.headers["server-timing"]
            assert r.status == 200, (url, r.status)
        times.append((time.perf_counter() - t0) * 1000)
        app.append(float(timing.split("dur=")[1]))
    return statistics.median(times), statistics.median(app)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=1_000_000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--screenshot", help="save a screenshot of the overview here")
    a = ap.parse_args()
    srv = RedisServer().start()
    ns = "bench"
    cli = Cli(srv, ns)
    try:
        rs = Rsched.from_url(srv.url, namespace=ns)
        # a console with something to show: three queues, two crons with runs, a dead task
        for q in ("default", "mail", "reports"):
            for i in range(20):
                rs.add(
                    "mail.send" if q == "mail" else "job", f"{q}-{i}", queue=q, delay=f"{i + 1}m"
                )
        r1 = cli.spawn(
            "run",
            "cron",
            "billing.nightly",
            "--schedule",
            "* * * * * *",
            "--tz",
            "Asia/Shanghai",
            "--",
            "sh",
            "-c",
            "echo charged",
        )
        r2 = cli.spawn("run", "cron", "cache.warm", "--schedule", "*/2 * * * * *", "--", "false")
        wait_for(lambda: len(rs.redis.smembers(rs.keys.crons)) == 2, 20, what="crons")
        time.sleep(3)  # (a bench, not a test: a few runs to show)
        for p in (r1, r2):
            p.terminate()
            p.wait(10)
        w = start_web(cli)
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
            page = b.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(w.base + "/")
            if a.screenshot:
                page.screenshot(path=a.screenshot, full_page=True)
            time.sleep(1)
            client = srv.client()
            before = commands(client)
            time.sleep(a.seconds)
            after = commands(client)
            b.close()
        rate = (after - before) / a.seconds
        print(f"open overview: {after - before} commands in {a.seconds:.0f} s = {rate:.2f}/s")

        took = fill(rs, "big", a.tasks)
        print(f"filled queue big with {a.tasks:,} tasks in {took:.1f} s")
        q = rs.keys.queue("big")
        mid_member, mid_score = rs.redis.zrange(
            q.sched, a.tasks // 2, a.tasks // 2, withscores=True
        )[0]
        cursor = paging.encode_cursor(("scheduled", ""), {"big": (mid_score, mid_member)})
        for label, url in (
            ("queue page, first", "/queues/big"),
            ("queue page, middle (cursor)", f"/queues/big?state=scheduled&cursor={cursor}"),
            ("queue page, type filter", "/queues/big?type=job"),
            ("/api/tasks?limit=100", "/api/tasks?queue=big&limit=100"),
            ("overview", "/"),
        ):
            rtt, app = median_ms(w.base, url)
            print(f"{label}: median {rtt:.1f} ms (the app: {app:.1f} ms)")
    finally:
        cli.close()  # the web server and any runner still going
        srv.stop()


if __name__ == "__main__":
    main()
