"""Rate limits (`[queues.Q] rate_limit = "N/DUR"`, `run consumer --rate-limit`): at
most N claims in any window of DUR across every consumer of the queue, by the
server's clock (a sliding window kept by claim-18); a throttled consumer sleeps
until the next permit. Per type (`[queues.Q.type_rate_limits]`,
`--type-rate-limit TYPE=N/DUR`): the same for one type's claims, the others not
held back by it."""

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


def _requests_while_asleep(server: RedisServer, seconds: float) -> tuple[int, float]:
    """Once the consumer sleeps (BZPOPMIN on its wake-up key): the requests it sends
    in ``seconds`` (the throttled period under measurement), and the time taken."""
    c = server.client()
    wait_for(
        lambda: any(x.get("cmd") == "bzpopmin" for x in c.client_list()),
        timeout=15,
        what="the consumer to sleep",
    )
    c.config_resetstat()
    t0 = time.monotonic()
    time.sleep(seconds)
    stats = c.info("commandstats")
    elapsed = time.monotonic() - t0
    c.close()
    sent = sum(
        int(v["calls"])
        for k, v in stats.items()
        if k.removeprefix("cmdstat_") in ("evalsha", "eval", "bzpopmin")
    )
    return sent, elapsed


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
        sent, elapsed = _requests_while_asleep(own_server, 6)
        print(f"throttled idle consumer: {sent} requests in {elapsed:.1f}s")
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


def _worst_window(claimed: list[int], window_ms: int = 1000) -> int:
    """The most claims in any window (one starts at each claim)."""
    claimed = sorted(claimed)
    j = worst = 0
    for i, t in enumerate(claimed):
        while claimed[j] <= t - window_ms:
            j += 1
        worst = max(worst, i - j + 1)
    return worst


@pytest.mark.valkey
def test_a_type_limit_holds_back_that_type_only(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    """`[queues.Q.type_rate_limits] TYPE = "N/DUR"`: that type's claims stay within N
    in any window, across two consumers, while the other types (due after it, behind
    it in the queue) run at once: the throttled ones are set aside, not in the way."""
    (tmp_path / "rsched.toml").write_text(
        '[queues.default]\nconcurrency = 4\n[queues.default.type_rate_limits]\n"slow.t" = "10/1s"\n'
    )
    add_many(cli, "slow.t", 40)
    time.sleep(0.002)  # (the fast ones are due after every slow one)
    add_many(cli, "fast.t", 200)
    procs = [
        cli.spawn(
            "run",
            "consumer",
            "--burst",
            "--handler",
            "slow.t=true",
            "--handler",
            "fast.t=true",
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        for _ in range(2)
    ]
    row = wait_for(
        lambda: next((r for r in cli.json("queues") if r["throttled_types"]), None),
        timeout=10,
        what="the type's limit to bite",
    )
    assert row["type_rate_limits"] == {"slow.t": "10/1s"} and row["throttled_types"] == ["slow.t"]
    assert row["rate_limit"] is None and row["throttled"] is False
    metric = 'rsched_queue_type_throttled{queue="default",type="slow.t"}'
    wait_for(lambda: metric in cli("metrics", check=0).stdout, timeout=10, what="the metric")
    for p in procs:
        assert p.wait(60) == 0
    recs = history(rs)
    assert len(recs) == 240 and all(r["result"] == "ok" for r in recs)
    slow = [r["claimed_ms"] for r in recs if r["type"] == "slow.t"]
    fast = [r["claimed_ms"] for r in recs if r["type"] == "fast.t"]
    worst = _worst_window(slow)
    print(f"type limit 10/1s: at most {worst} slow.t in any 1 s; fast.t done "
          f"{(max(fast) - min(slow)) / 1000:.2f}s after the first claim, slow.t "
          f"{(max(slow) - min(slow)) / 1000:.2f}s")  # fmt: skip
    assert worst <= 10, worst
    assert max(slow) - min(slow) >= 3000  # 40 at 10/s: at least 3 more windows
    assert max(fast) < max(slow) - 1000, "the other type waited behind the throttled one"
    # and close to the limit: the slow ones of each second after the first
    span_s = (max(slow) - min(slow)) // 1000
    assert sum(1 for t in slow if t < min(slow) + span_s * 1000) >= 0.95 * 10 * span_s


def test_a_type_limit_and_the_queue_limit_both_hold(cli: Cli, rs: Rsched) -> None:
    """Flags: --rate-limit for the queue and --type-rate-limit for one type; each
    window holds (the type's inside the queue's)."""
    add_many(cli, "a.t", 30)
    add_many(cli, "b.t", 30)
    p = cli.spawn(
        "run", "consumer", "--burst", "--concurrency", "8", "--rate-limit", "20/1s",
        "--type-rate-limit", "a.t=5/1s", "--handler", "a.t=true", "--handler", "b.t=true",
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    assert p.wait(60) == 0
    recs = history(rs)
    assert len(recs) == 60
    claimed = [r["claimed_ms"] for r in recs]
    a = [r["claimed_ms"] for r in recs if r["type"] == "a.t"]
    assert _worst_window(claimed) <= 20 and _worst_window(a) <= 5
    assert max(a) - min(a) >= 5000  # 30 at 5/s


def test_a_type_throttled_idle_consumer_sleeps_and_other_types_still_run(
    own_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    cli = Cli(own_server, namespace, cwd=str(tmp_path))
    try:
        add_many(cli, "rl.slow", 5)
        p = cli.spawn(
            "run", "consumer", "--type-rate-limit", "rl.slow=1/1m", "--handler", "rl.slow=true",
            "--handler", "rl.other=true", stdout=subprocess.DEVNULL,
        )  # fmt: skip
        rs = Rsched(own_server.client(), namespace)
        wait_for(lambda: len(history(rs)) == 1, timeout=15, what="the one permitted run")
        sent, elapsed = _requests_while_asleep(own_server, 5)
        print(f"type-throttled idle consumer: {sent} requests in {elapsed:.1f}s")
        assert sent / elapsed <= 1.0
        # Another type added now runs at once: the throttled ones are not in its way,
        # and the add wakes the sleeping consumer (the parked tasks, scoring below 0,
        # do not count as earlier work). Added just after an idle-cadence claim, so
        # that without a wake-up it would wait the whole cadence (10 s).
        c = own_server.client()

        def claims() -> int:
            return int(c.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))

        before = claims()
        wait_for(lambda: claims() > before, timeout=15, what="an idle-cadence claim")
        added_ms = rs.now_ms()
        cli("add", "rl.other", "x")
        [run] = wait_for(
            lambda: [r for r in history(rs) if r["type"] == "rl.other"],
            timeout=15,
            what="the other type to run",
        )
        c.close()
        assert run["claimed_ms"] - added_ms < 5000, "not woken: it waited for the cadence"
        assert [r["type"] for r in history(rs)].count("rl.slow") == 1
        assert rs.queues()[0].due == 4
        p.terminate()
        assert p.wait(30) == 0
    finally:
        cli.close()


def test_bad_type_rate_limits_are_refused_before_connecting(cli: Cli, tmp_path: Path) -> None:
    for bad, names in (
        ("slow.t", "TYPE=N/DUR"),
        ("slow.t=0/1s", "N/DUR"),
        ("=5/1s", "task type"),
        ("bad type=5/1s", "task type"),
    ):
        res = cli("run", "consumer", "--type-rate-limit", bad, "--handler", "t=true", check=2)
        assert res.stderr.count("\n") == 1 and "--type-rate-limit" in res.stderr, res.stderr
        assert names in res.stderr, res.stderr
    res = cli(
        "run", "consumer", "--type-rate-limit", "a=1/1s", "--type-rate-limit", "a=2/1s",
        "--handler", "t=true", check=2,
    )  # fmt: skip
    assert "given twice" in res.stderr
    (tmp_path / "rsched.toml").write_text('[queues.default]\ntype_rate_limits = "10/1s"\n')
    res = cli("run", "consumer", "--handler", "t=true", check=None)
    assert res.returncode != 0 and "queues.default.type_rate_limits" in res.stderr, res.stderr
    (tmp_path / "rsched.toml").write_text(
        '[queues.default.type_rate_limits]\n"mail.send" = "lots"\n'
    )
    res = cli("run", "consumer", "--handler", "t=true", check=None)
    assert "queues.default.type_rate_limits.mail.send" in res.stderr, res.stderr


def test_queues_reads_stored_limits_it_does_not_understand_without_failing(
    cli: Cli, rs: Rsched
) -> None:
    """The limits key holds what consumers wrote; a line of another form (someone
    else's data) is left out, as the claim script does, and `queues` still answers."""
    cli("add", "a.t", "1", check=0)
    key = rs.keys.queue("default").ratelimit
    rs.redis.set(key, "not a limit\n5 1000 a.t 5/1s\nbroken line\n<b>x</b>")
    [row] = cli.json("queues")
    assert row["rate_limit"] is None and row["type_rate_limits"] == {"a.t": "5/1s"}
    rs.redis.set(key, "\x1b]0;title\x07")
    [row] = cli.json("queues")
    assert row["rate_limit"] is None and row["type_rate_limits"] == {}
    assert "\x1b" not in cli("queues", check=0).stdout
