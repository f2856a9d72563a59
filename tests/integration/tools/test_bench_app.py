"""`rsched bench --only app`: the Python application figures (issue 15) come from
real processes (a `run worker` drains both queues: nothing is left behind).

No timed asserts: speed is what the bench measures, not what tests check."""

from __future__ import annotations

import json
import uuid

from tests.support import Cli, RedisServer


def test_bench_app_section_reports_its_figures_and_cleans_up(cli: Cli, server: RedisServer) -> None:
    ns = f"bench-{uuid.uuid4().hex[:8]}"
    res = cli("bench", "--quick", "--only", "app", "--namespace", ns, "--json", timeout=300)
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    a = r["app"]
    for key in ("single_add_per_s", "async_add_per_s", "drain_python_per_s", "drain_async_per_s"):
        assert isinstance(a[key], int) and a[key] > 0, key
    assert a["async_concurrency"] == 1000
    assert a["async_tasks"] == r["params"]["app_async_rounds"] * 1000
    assert "app.async_add_per_s" in r["met"]
    assert set(r) >= {"app", "server"} and "enqueue" not in r
    assert list(server.client().scan_iter(match=f"{ns}:*", count=1000)) == []
    table = cli("bench", "--quick", "--only", "app", timeout=300)
    assert "app: 1,000 concurrent await rs.add() (aio)" in table.stdout
