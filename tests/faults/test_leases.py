"""Guarantees 1 and 3 under frozen processes: a consumer frozen past its lease is refused and its run does not count; Redis frozen past the leases, consumers and cron recover.

Shared harness: tests/faults/harness.py."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from rsched.api import Rsched
from rsched.queue.ops import make_spec
from tests.faults.harness import (
    EXEC_HANDLER,
    Procs,
    alive,
    count_lines,
    cron_fires,
    errors_in,
    figure,
    history,
    runs,
    script,
    settled,
    stop,
)
from tests.support import Cli, RedisServer, wait_for

# --- 2. frozen consumer

#: Logs its start (with its own pid) and end; the first attempt of ``long*`` outlives
#: any freeze, of ``short*`` ends while its consumer is frozen.
FREEZE_HANDLER = """
    echo "start $1 $RSCHED_CLAIM_TOKEN $RSCHED_ATTEMPT $CONSUMER_TAG $$" >> "$EXEC_LOG"
    if [ "$RSCHED_ATTEMPT" = 1 ]; then
        case "$1" in long*) sleep 60;; short*) sleep 0.3;; esac
    fi
    echo "end $1 $RSCHED_CLAIM_TOKEN $RSCHED_ATTEMPT $CONSUMER_TAG" >> "$EXEC_LOG"
"""


def _events(log: Path, kind: str) -> list[list[str]]:
    if not log.exists():
        return []
    return [x.split()[1:] for x in log.read_text().splitlines() if x.startswith(kind + " ")]


def test_consumer_frozen_past_its_lease_is_refused_and_its_run_does_not_count(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    """SIGSTOP a consumer holding two tasks: one whose handler finishes while it is
    frozen (its ack must be refused) and one still running when it wakes (its heartbeat
    must be refused and its handler killed). Both ran again elsewhere; only those runs
    count; the woken consumer goes on working."""
    log = tmp_path / "exec.log"
    h = script(tmp_path, "h.sh", FREEZE_HANDLER)
    env = {"EXEC_LOG": str(log)}
    procs = Procs(cli, tmp_path)
    args = ("--handler", f"t.f={h}", "--concurrency", "2", "--lease", "1s")
    a, a_err = procs.consumer(*args, env=env, name="a")
    rs.add_many([make_spec("t.f", "short1"), make_spec("t.f", "long1")])
    wait_for(lambda: len(_events(log, "start")) == 2, timeout=20, what="a runs both")
    long_pid = int(next(e for e in _events(log, "start") if e[0] == "long1")[4])
    try:
        os.kill(a.pid, signal.SIGSTOP)  # the consumer only; its handlers go on
        frozen_at = time.monotonic()
        b, b_err = procs.consumer(*args, env=env, name="b")
        b_tag = str(max(procs.tags))
        retaken: dict[str, float] = {}

        def both_retaken() -> bool:
            for e in _events(log, "start"):
                if e[3] == b_tag and e[0] not in retaken:
                    retaken[e[0]] = time.monotonic() - frozen_at
            return len(retaken) == 2

        wait_for(both_retaken, timeout=30, what="b takes both over")
        wait_for(lambda: settled(rs.redis, rs), timeout=20, what="b acks both")
        a_tag = str(min(procs.tags))
        assert [e[2:] for e in _events(log, "end") if e[0] == "short1"] == [
            ["1", a_tag],
            ["2", b_tag],
        ]
        os.kill(a.pid, signal.SIGCONT)
        wait_for(lambda: not alive(long_pid), timeout=15, what="a kills its stale handler")
        text = lambda: a_err.read_text()  # noqa: E731
        wait_for(lambda: "ack refused for t.f short1" in text(), timeout=15, what="ack refused")
        assert "lease lost for t.f long1" in text()
    finally:
        os.kill(a.pid, signal.SIGCONT)
        if alive(long_pid):
            os.kill(long_pid, signal.SIGKILL)
    assert not any(e[0] == "long1" and e[2] == "1" for e in _events(log, "end"))
    # Only b's runs count: one ok record per task, with b's token; the stale report
    # did not bring the tasks back or count them twice.
    q = rs.keys.queue("default")
    b_tokens = {e[0]: e[1] for e in _events(log, "start") if e[3] == b_tag}
    ok = [x for x in history(rs.redis, rs) if x["result"] == "ok"]
    assert sorted((x["id"], x["token"]) for x in ok) == sorted(b_tokens.items())
    assert all(x["attempt"] == 2 for x in ok)
    assert rs.redis.hget(q.stats, "ok|t.f") == "2"
    assert settled(rs.redis, rs)
    # The woken consumer is healthy: with b gone, it runs the next task itself.
    assert stop(b) == 0
    rs.add("t.f", "after1")
    wait_for(lambda: settled(rs.redis, rs), timeout=20, what="a runs a new task")
    assert [e[3] for e in _events(log, "start") if e[0] == "after1"] == [str(min(procs.tags))]
    assert stop(a) == 0
    figure(
        "consumer_sigstop_takeover",
        lease_ms=1000,
        takeover_ms_short=round(retaken["short1"] * 1000),
        takeover_ms_long=round(retaken["long1"] * 1000),
        stale_results_counted=0,
    )
    assert not errors_in(b_err)


# --- 4. Redis frozen


def _redis_freeze(
    own_server: RedisServer, cli: Cli, rs: Rsched, tmp_path: Path, n: int, freezes: int
) -> None:
    log = tmp_path / "exec.log"
    fires = tmp_path / "fires.log"
    h = script(tmp_path, "h.sh", EXEC_HANDLER)
    env = {"EXEC_LOG": str(log), "HANDLER_SLEEP": "0.02"}
    procs = Procs(cli, tmp_path)
    consumers = [
        procs.consumer("--handler", f"t.frz={h}", "--concurrency", "2", "--lease", "1s",
                       env=env, name=f"c{i}")
        for i in range(2)
    ]  # fmt: skip
    job = f'echo "$RSCHED_FIRE_AT $RSCHED_FENCING_TOKEN $PPID" >> {fires}'
    runners = [
        procs.spawn("run", "cron", "frz", "--schedule", "*/1 * * * * *", "--ttl", "1s",
                    "--", "sh", "-c", job, name=f"cron{i}")[0]
        for i in range(2)
    ]  # fmt: skip
    q = rs.keys.queue("default")
    wait_for(lambda: rs.redis.zcard(q.consumers) == 2, timeout=30, what="2 consumers")
    rs.add_many([make_spec("t.frz", f"f{i}") for i in range(n)])
    freeze_s = 3.0  # > the 1 s lease and the 1 s cron lock TTL
    task_recovery: list[float] = []
    cron_recovery: list[float] = []
    for k in range(freezes):
        before = (n * (k + 1) // (freezes + 1), len(cron_fires(fires)) + 2)
        wait_for(
            lambda b=before: count_lines(log) >= b[0] and len(cron_fires(fires)) >= b[1],  # type: ignore[misc]
            timeout=120,
            what=f"work and fires before freeze {k + 1}",
        )
        own_server.freeze()
        try:
            time.sleep(freeze_s)  # the outage under test, not a synchronisation
            at_thaw = (count_lines(log), len(cron_fires(fires)))
        finally:
            own_server.thaw()
        thawed = time.monotonic()
        wait_for(lambda a=at_thaw: count_lines(log) > a[0], timeout=30, what="a task runs")  # type: ignore[misc]
        task_recovery.append(time.monotonic() - thawed)
        wait_for(lambda a=at_thaw: len(cron_fires(fires)) > a[1], timeout=30, what="a fire")  # type: ignore[misc]
        cron_recovery.append(time.monotonic() - thawed)
    wait_for(lambda: settled(rs.redis, rs), timeout=120, what="everything run and acked")
    k = len(cron_fires(fires))
    wait_for(lambda: len(cron_fires(fires)) >= k + 2, timeout=20, what="cron goes on")
    everyone = [p for p, _ in consumers] + runners
    assert all(p.poll() is None for p in everyone)  # none exited, none was restarted
    assert [stop(p) for p in everyone] == [0] * 4
    all_runs = runs(log)
    ran = Counter(x.id for x in all_runs)
    assert len(ran) == n, f"{n - len(ran)} tasks lost"
    assert rs.redis.hget(q.stats, "ok|t.frz") == str(n)
    dups = sum(ran.values()) - n
    assert dups <= 2 * 2 * freezes  # at most what the two consumers held when Redis froze
    # Each tick fired once, fencing tokens only go up, and the history agrees.
    fired = cron_fires(fires)
    twice = {f: c for f, c in Counter(f[0] for f in fired).items() if c > 1}
    assert not twice, f"ticks fired twice: {twice}"
    tokens = [int(f[1]) for f in fired]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    recs = cli.json("history", "frz", "--limit", "10000")
    # one run record per fired tick (the last may say "failed": stopped with its runner)
    run_ticks = Counter(r["fire_ms"] for r in recs if r["result"] not in ("skipped", "missed"))
    assert max(run_ticks.values()) == 1 and len(run_ticks) == len(fired), recs
    figure(
        "redis_sigstop",
        freezes=freezes,
        freeze_s=freeze_s,
        lease_ms=1000,
        cron_ttl_ms=1000,
        tasks=n,
        lost=n - len(ran),
        duplicated_runs=dups,
        cron_runners=2,
        cron_double_fires=len(twice),
        task_recovery_s=[round(x, 2) for x in task_recovery],
        cron_recovery_s=[round(x, 2) for x in cron_recovery],
    )


def test_redis_frozen_past_leases_consumers_and_cron_recover(
    own_server: RedisServer, own: tuple[Cli, Rsched], tmp_path: Path
) -> None:
    _redis_freeze(own_server, *own, tmp_path, 600, freezes=1)


@pytest.mark.slow
def test_redis_frozen_soak(
    own_server: RedisServer, own: tuple[Cli, Rsched], tmp_path: Path
) -> None:
    _redis_freeze(own_server, *own, tmp_path, 3000, freezes=5)
