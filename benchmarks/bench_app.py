"""Benchmark of the Python application API (issue 15), a thin wrapper of
``rsched bench --only app`` (rsched/tools/bench.py, section ``app``):

    python benchmarks/bench_app.py redis://127.0.0.1:6379/0   # a Redis you may write to
    python benchmarks/bench_app.py --embedded                 # a throwaway server

Same as ``rsched bench --only app [--embedded]``: a throwaway namespace (deleted
afterwards); each figure the median of 3 runs: ``.delay()`` one task per call,
1,000 concurrent ``await rs.add()`` (``rsched.aio``), and one ``rsched run
worker`` draining a no-op plain function and a no-op ``async def``.
"""

from __future__ import annotations

import sys


def main() -> None:
    from rsched.cli.main import main as rsched

    args = sys.argv[1:]
    url = [] if "--embedded" in args else ["--redis-url", args[0]] if args else []
    if not url and "--embedded" not in args:
        sys.exit("usage: bench_app.py REDIS_URL | --embedded")
    rsched(["bench", "--only", "app", *(["--embedded"] if not url else url)])


if __name__ == "__main__":
    main()
