"""Rate limits (`[queues.Q] rate_limit = "N/DUR"`, `run consumer --rate-limit`): at
most N claims in any window of DUR across every consumer of the queue, by the
server's clock (a sliding window kept by claim-15); a throttled consumer sleeps
until the next permit."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from rsched.api import Rsched
from tests.support import Cli, RedisServer, wait_for


def history(rs: Rsched) -> list[dict[str, Any]]:
    return [json.loads(f["j"]) for _, f in rs.redis.xrange(rs.keys.queue("default").history)]


def add_many(cli: Cli, task_type: str, n: int) -> None:
    lines = "\n".join(json.dumps({"type": task_type, "id": str(i)}) for i in range(n))
    cli("add", "--from", "-", input=lines, check=0)


@pytest.mark.valkey
def test_three_consumers_share_50_per_second(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    (tmp_path / "rsched.toml").write_text(
        '[queues.default]\nrate_limit = "50/1s"\nconcurrency = 8\n'
    )
    n = 300
    add_many(cli, "rl.t", n)
    procs = [
        cli.spawn("run", "consumer", "--burst", "--handler", "rl.t=true", stdout=subprocess.DEVNULL)
        for _ in range(3)
    ]
    # (each window's 50 go in a burst: the queue is throttled for most of the run)
    row = wait_for(
        lambda: next((r for r in cli.json("queues") if r["throttled"]), None),
        timeout=10,
        what="the limit to bite",
    )
    assert row["rate_limit"] == "50/1s"
    wait_for(
        lambda: 'rsched_queue_throttled{queue="default"} 1.0' in cli("metrics", check=0).stdout,
        timeout=10,
        what="metrics to show the throttling",
    )
    for p in procs:
        assert p.wait(60) == 0
    recs = history(rs)
    assert len(recs) == n and all(r["result"] == "ok" for r in recs)
    assert len({r["host"] + str(r["pid"]) for r in recs}) == 3  # every consumer took some
    claimed = sorted(r["claimed_ms"] for r in recs)
    assert all(r["claimed_at"].endswith("Z") for r in recs)
    # never more than 50 in any 1 s window (a window starts at some claim)
    j = 0
    worst = 0
    for i, t in enumerate(claimed):
        while claimed[j] <= t - 1000:
            j += 1
        worst = max(worst, i - j + 1)
    assert worst <= 50, worst
    # and at least 95% of the limit: the whole seconds of the run each hold ~50
    span_s = (claimed[-1] - claimed[0]) // 1000
    in_span = sum(1 for t in claimed if t < claimed[0] + span_s * 1000)
    print(f"rate: {in_span} claims in {span_s} s windows, at most {worst} in any 1 s")
    assert in_span >= 0.95 * 50 * span_s, (in_span, span_s)


def test_a_throttled_idle_consumer_sleeps_until_the_next_permit(
    own_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    cli = Cli(own_server, namespace, cwd=str(tmp_path))
    try:
        add_many(cli, "rl.idle", 5)
        p = cli.spawn(
            "run", "consumer", "--rate-limit", "1/1m", "--handler", "rl.idle=true",
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        rs = Rsched(own_server.client(), namespace)
        wait_for(lambda: len(history(rs)) == 1, timeout=15, what="the one permitted run")
        c = own_server.client()
        wait_for(
            lambda: any(x.get("cmd") == "bzpopmin" for x in c.client_list()),
            timeout=15,
            what="the consumer to sleep",
        )
        c.config_resetstat()
        t0 = time.monotonic()
        time.sleep(6)  # the throttled period under measurement
        stats = c.info("commandstats")
        elapsed = time.monotonic() - t0
        sent = sum(
            int(v["calls"])
            for k, v in stats.items()
            if k.removeprefix("cmdstat_") in ("evalsha", "eval", "bzpopmin")
        )
        print(f"throttled idle consumer: {sent} requests in {elapsed:.1f}s, {stats}")
        assert sent / elapsed <= 1.0
        assert len(history(rs)) == 1 and rs.queues()[0].due == 4
        p.terminate()
        assert p.wait(30) == 0
    finally:
        cli.close()


def test_bad_rate_limits_are_refused_before_connecting(cli: Cli, tmp_path: Path) -> None:
    for bad in ("50", "0/1s", "x/1s", "50/", "50/soon", "1/2/3s", "-5/1s"):
        res = cli("run", "consumer", "--rate-limit", bad, "--handler", "t=true", check=2)
        assert res.stderr.count("\n") == 1 and "--rate-limit" in res.stderr, res.stderr
        assert "N/DUR" in res.stderr
    (tmp_path / "rsched.toml").write_text('[queues.default]\nrate_limit = "fast"\n')
    res = cli("run", "consumer", "--handler", "t=true", check=None)
    assert res.returncode != 0 and "queues.default.rate_limit" in res.stderr, res.stderr
