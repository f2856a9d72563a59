"""The runnable examples in examples/, run as a user would."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT, Cli, rsched_env, wait_for

EXAMPLES = ROOT / "examples"


def test_spring_style_cron_example_fires_and_fans_out(server, namespace: str, rs) -> None:
    cli = Cli(server, namespace, cwd=str(EXAMPLES))
    try:
        cli.spawn("run", "worker", "spring_cron:app", env={"REPORT_CRON": "* * * * * ?"})

        def done() -> list[dict]:
            recs = cli.json("history", "--limit", "100")
            cron = [r for r in recs if r["kind"] == "cron" and r["result"] == "ok"]
            built = [r for r in recs if r["kind"] == "task" and r["result"] == "ok"]
            return cron if cron and built else []

        (first, *_) = wait_for(done, timeout=20, what="a tick and the task it scheduled")
        assert first["name"] == "report.daily"
        log = cli("logs", "report.daily", "--run", str(first["token"]), check=0).stdout
        assert f"token {first['token']}" in log  # the run's output is its log
        tasks = rs.list("reports", state="processing") + rs.list("reports")
        assert all(t.type == "report.build" for t in tasks)
    finally:
        cli.close()


@pytest.mark.skipif(
    importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("httpx") is None,
    reason="fastapi (and httpx for its test client) not installed",
)
def test_fastapi_example_schedules_order_close(server, namespace: str, rs, tmp_path: Path) -> None:
    script = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from fastapi.testclient import TestClient\n"
        "import fastapi_app\n"
        "with TestClient(fastapi_app.web) as c:\n"
        "    r = c.post('/orders/1001'); assert r.status_code == 200, r.text\n"
        "    assert r.json()['close'] == 'added'\n"
        "    r = c.post('/orders/1002'); assert r.status_code == 200\n"
        "    assert c.delete('/orders/1002/close').json()['cancelled'] in ('due', 'scheduled')\n"
        "    assert c.delete('/orders/1002/close').status_code == 404\n"
    )
    env = {**rsched_env(server, namespace), "CLOSE_AFTER": "1ms"}
    subprocess.run([sys.executable, "-c", script, str(EXAMPLES)], env=env, check=True, timeout=60)
    cli = Cli(server, namespace, cwd=str(EXAMPLES))
    try:
        cli.spawn("run", "worker", "fastapi_app:tasks")
        wait_for(
            lambda: any(
                r["type"] == "order.close" and r["id"] == "1001" and r["result"] == "ok"
                for r in cli.json("history", "--queue", "orders")
            ),
            timeout=20,
            what="order.close 1001 run by the worker",
        )
    finally:
        cli.close()
