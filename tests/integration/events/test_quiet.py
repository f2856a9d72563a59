"""Idle loops with alert sinks cost Redis almost nothing (guarantee 7): counted
with INFO commandstats on a server of the test's own, which counts every command
(those inside scripts too)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from rsched.api import Rsched
from tests.clusters import Cluster, ClusterCli, ccli, cluster, needs_cluster
from tests.integration.events.sinks import appender, lines
from tests.support import Cli, RedisServer, wait_for

__all__ = ["ccli", "cluster"]  # fixtures, imported for pytest

#: The commands of event delivery but the watch (group reads, pending look-ups).
GROUP_COMMANDS = ("xreadgroup", "xpending", "xclaim", "xack", "xgroup|create")
WINDOW_S = 12.0
FAST = {"RSCHED_TEST_ALERT_BACKOFF_MS": "100"}
#: RSCHED_TEST_SILENCE_EVERY_MS: the silence check's interval, shortened (a loop's
#: turn there also re-arms its watch: 3 XREADs per 12 s, not 2)
SILENCE_MS = 5000


def test_idle_runners_with_sinks_block_in_redis_and_take_turns_at_the_silence_check(
    own_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """3 idle runners of different crons with the same [[alerts]] sink (one also
    with a quick-use sink), and a silent cron no runner runs. The silent cron's
    event is noticed by a loop and delivered once; then, over 12 s, the delivery
    commands are each process's blocking XREAD (one per 10 s, shared by its
    sinks; polling each group every 0.5 s was ~290), and the silence check ran
    at most once per 5 s interval in the whole namespace, not once per process
    (less: no cron can turn silent before the next minute's tick + 30 s)."""
    cli = Cli(own_server, namespace, cwd=str(tmp_path))
    r = own_server.client()
    out = tmp_path / "events.jsonl"
    cfg = tmp_path / "rsched.toml"
    code = f"import sys; open({str(out)!r}, 'a').write(sys.stdin.read() + '\\n')"
    cfg.write_text(f"[[alerts]]\ncommand = {json.dumps([sys.executable, '-c', code])}\n")
    quick = tmp_path / "quick.jsonl"
    env = {"RSCHED_TEST_SILENCE_EVERY_MS": str(SILENCE_MS)}

    def calls() -> dict[str, int]:
        stats = r.info("commandstats")
        return {k[len("cmdstat_") :]: int(v["calls"]) for k, v in stats.items()}

    rs = Rsched(r, namespace)
    try:
        k = rs.keys.cron("quiet")
        now = rs.now_ms()
        r.sadd(rs.keys.crons, "quiet")
        r.hset(
            k.state, mapping={"schedule": "* * * * *", "tz": "UTC", "registered_ms": now - 600_000}
        )
        for i in range(3):
            extra = ["--alert-command", appender(quick)] if i == 0 else []
            cli.spawn(
                "--config",
                str(cfg),
                "run",
                "cron",
                f"idle{i}",
                "--schedule",
                "0 3 1 1 *",
                *extra,
                "--",
                "true",
                env=env,
            )
        wait_for(lambda: r.scard(rs.keys.crons) == 4, 20, what="3 runners registered")
        got = wait_for(
            lambda: [e for e in lines(out) if e["event"] == "cron.silent"],
            30,
            what="the silent cron's event noticed by a loop and delivered",
        )
        # each loop the event woke looks once at the group's pending entries after
        # the sink's timeout (another that took it may have died): then all is idle
        wait_for(lambda: calls().get("xpending", 0) >= 3, 20, what="the follow-up looks")
        before = calls()
        t0 = time.monotonic()
        time.sleep(WINDOW_S)  # the idle period under measurement
        after = calls()
        elapsed = time.monotonic() - t0
        d = {c: after.get(c, 0) - before.get(c, 0) for c in after}
        d = {c: n for c, n in d.items() if n > 0 and not c.startswith(("info", "config"))}
        total = sum(d.values())
        print(f"3 idle runners, 2 sinks: {total} commands in {elapsed:.1f}s: {d}")
        # no group read, no pending look-up while nothing happens (polling: ~290)
        assert not sum(d.get(c, 0) for c in GROUP_COMMANDS), d
        # each process: its watch (3 per 12 s) and the runner's own wait (2 per 12 s)
        assert 3 <= d.get("xread", 0) <= 3 * 6, d
        # a check reads each of the 4 crons' last claimed tick (ZREVRANGE) once: one
        # loop at a time checks, not each of them every interval
        assert d.get("zrevrange", 0) / 4 <= WINDOW_S * 1000 / SILENCE_MS + 1, d
        assert r.pttl(rs.keys.silence_check) > 0  # the next turn: when the key expires
        silent = [e for e in cli.json("events") if e["event"] == "cron.silent"]
        assert len(silent) == 1 and [e["event_id"] for e in lines(out)] == [silent[0]["event_id"]]
        assert got[0]["name"] == "quiet" and silent[0]["delivery"] == "delivered"
        assert not lines(quick)  # the quick-use sink serves its loop's own cron only
    finally:
        cli.close()


@needs_cluster
def test_events_are_delivered_once_on_a_cluster(
    cluster: Cluster, ccli: ClusterCli, tmp_path: Path
) -> None:
    """Two runners with the same [[alerts]] sink, crons in slots of different
    primaries (each process reads the streams of both slots, pipelined), and one
    with a quick-use sink of its own cron's one slot (a blocking XREAD there):
    each failure reaches each sink once."""
    ns = ccli.namespace
    a = "fa"
    b = next(
        n
        for n in (f"fb{i}" for i in range(50))
        if cluster.node_of(f"{ns}:{{c:{n}}}:state").port
        != cluster.node_of(f"{ns}:{{c:{a}}}:state").port
    )
    out, quick = tmp_path / "events.jsonl", tmp_path / "quick.jsonl"
    code = f"import sys; open({str(out)!r}, 'a').write(sys.stdin.read() + '\\n')"
    cfg = tmp_path / "rsched.toml"
    cfg.write_text(
        f'[[alerts]]\ncommand = {json.dumps([sys.executable, "-c", code])}\nevents = ["run.failed"]\n'
    )
    every = ["--schedule", "* * * * * *", "--", "false"]
    for n in (a, b):
        ccli.spawn("--config", str(cfg), "run", "cron", n, *every, env=FAST)
    ccli.spawn("run", "cron", "fc", "--alert-command", appender(quick), *every, env=FAST)

    def firsts() -> bool:
        got = {(e["name"], e["token"]) for e in lines(out)}
        return {(a, 1), (b, 1)} <= got and any(e["name"] == "fc" for e in lines(quick))

    wait_for(firsts, 40, what="the first failure of each cron delivered")
    ids = [e["event_id"] for e in lines(out)]
    assert len(ids) == len(set(ids))  # once, though two processes serve the sink
    assert {e["event"] for e in lines(out)} == {"run.failed"}  # the table's events only
    assert {e["name"] for e in lines(quick)} == {"fc"}


def test_a_live_loop_notices_a_cron_turning_silent_at_the_time_its_last_check_said(
    cli: Cli, rs: Rsched
) -> None:
    """A consumer loop (no crons of its own) checks at its start: the cron that no
    runner runs is not silent yet. The check sets the key's PX to when the cron's
    next tick passes the grace (no check is needed before): the loop takes its
    next turn then and notices the silence, once."""
    k = rs.keys.cron("ghost")
    now = rs.now_ms()
    rs.redis.sadd(rs.keys.crons, "ghost")
    rs.redis.hset(
        k.state, mapping={"schedule": "*/5 * * * * *", "tz": "UTC", "registered_ms": now - 24_000}
    )
    cli.spawn(
        "run",
        "consumer",
        "--queue",
        "q",
        "--handler",
        "t=true",
        env={"RSCHED_TEST_SILENCE_EVERY_MS": "1000"},
    )
    wait_for(lambda: rs.redis.exists(rs.keys.silence_check), 20, what="the loop's first check")
    assert not [e for e in cli.json("events") if e["event"] == "cron.silent"]
    silent = wait_for(
        lambda: [e for e in cli.json("events") if e["event"] == "cron.silent"],
        30,
        what="the silence noticed by the loop",
    )
    assert len(silent) == 1 and silent[0]["name"] == "ghost"
    fire = silent[0]["fire_at"]
    assert fire and silent[0]["at_ms"] - now >= 6_000  # a tick after the registration
