"""Benchmark of the Python application API (issue 15): one figure per line.

    python benchmarks/bench_app.py redis://127.0.0.1:6379/0   # a Redis you may write to

Uses a throwaway namespace (deleted afterwards). Figures, each the median of 3 runs:

* ``sync_single_add_per_s``: ``Rsched.add`` one task at a time (one round trip each);
* ``async_concurrent_add_per_s``: 1,000 concurrent ``await rs.add()`` from one
  process (``rsched.aio``, pipelined under the hood), 20 rounds;
* ``drain_python_per_s`` / ``drain_async_per_s``: one ``rsched run worker``
  process (``--concurrency 8``) draining due tasks whose handler is a no-op
  plain function / ``async def``: claim, run, ack, history record included,
  from the first task run to the last.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

APP = textwrap.dedent(
    """
    from rsched import App
    app = App()

    @app.task("bench.py", queue="bpy")
    def py(task):
        pass

    @app.task("bench.async", queue="basync")
    async def aio(task):
        pass
    """
)


def sync_single(url: str, ns: str, n: int = 5000) -> float:
    from rsched import Rsched

    rs = Rsched.from_url(url, namespace=ns)
    rs.add("warm.up", "0")
    t0 = time.perf_counter()
    for i in range(n):
        rs.add("bench.single", f"{secrets.token_hex(4)}{i}", delay="1h")
    dt = time.perf_counter() - t0
    rs.close()
    return n / dt


def async_concurrent(url: str, ns: str, rounds: int = 20, conc: int = 1000) -> float:
    from rsched.aio import Rsched

    async def main() -> float:
        rs = Rsched.from_url(url, namespace=ns)
        await rs.add("warm.up", "0")
        tag = secrets.token_hex(4)
        t0 = time.perf_counter()
        for r in range(rounds):
            await asyncio.gather(
                *(rs.add("bench.aio", f"{tag}-{r}-{i}", delay="1h") for i in range(conc))
            )
        dt = time.perf_counter() - t0
        await rs.close()
        return rounds * conc / dt

    return asyncio.run(main())


def drain(url: str, ns: str, task_type: str, queue: str, n: int = 20000) -> float:
    from rsched import Rsched
    from rsched.queue.specs import make_spec

    rs = Rsched.from_url(url, namespace=ns)
    tag = secrets.token_hex(4)
    specs = [make_spec(task_type, f"{tag}{i}", queue=queue) for i in range(n)]
    for i in range(0, n, 5000):
        rs.add_many(specs[i : i + 5000])
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "benchapp.py"), "w") as fh:
            fh.write(APP)
        env = {**os.environ, "RSCHED_REDIS_URL": url, "RSCHED_NAMESPACE": ns}
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rsched",
                "-q",
                "run",
                "worker",
                "benchapp:app",
                "--concurrency",
                "8",
            ],
            cwd=d,
            env=env,
            stdout=subprocess.DEVNULL,
        )
        try:

            def left() -> int:
                st = [q for q in rs.queues() if q.queue == queue]
                return st[0].due + st[0].scheduled + st[0].processing if st else n

            while left() >= n:
                time.sleep(0.001)
            t0 = time.perf_counter()
            start_left = left()
            while left() > 0:
                time.sleep(0.005)
            dt = time.perf_counter() - t0
        finally:
            p.terminate()
            p.wait(30)
    rs.close()
    return start_left / dt


def main() -> None:
    url = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("RSCHED_REDIS_URL", "")
    if not url:
        sys.exit("usage: bench_app.py REDIS_URL")
    ns = f"bench-app-{secrets.token_hex(3)}"
    try:
        figures = {
            "sync_single_add_per_s": [sync_single(url, ns) for _ in range(3)],
            "async_concurrent_add_per_s": [async_concurrent(url, ns) for _ in range(3)],
            "drain_python_per_s": [drain(url, ns, "bench.py", "bpy") for _ in range(3)],
            "drain_async_per_s": [drain(url, ns, "bench.async", "basync") for _ in range(3)],
        }
    finally:
        import redis

        r = redis.Redis.from_url(url)
        for k in r.scan_iter(f"{ns}:*", count=1000):
            r.delete(k)
    for name, runs in figures.items():
        print(
            f"{name} {statistics.median(runs):,.0f}  (runs: {', '.join(f'{v:,.0f}' for v in runs)})"
        )


if __name__ == "__main__":
    main()
