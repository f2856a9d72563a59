"""Events and alerts (SPEC §4), continued: lapsed leases (run.lost), `exec`
delivering its own events before it exits, partitioned queues, the delivery
counter of `rsched metrics`, and `events --follow`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from rsched.core.keys import partition_index
from rsched.lua import calls
from tests.integration.events.sinks import appender, lines
from tests.support import wait_for


def _claim_short(rs: Any, queue: str = "default", lease_ms: int = 50) -> int:
    """Claim every due task with a lease that lapses at once (a consumer that died)."""
    out = calls.claim(
        rs,
        rs.keys.queue(queue),
        max_tasks=10,
        lease_ms=lease_ms,
        consumer="gone",
        registration_ttl_ms=1000,
        reap_limit=100,
        history_maxlen=100,
        queue=queue,
        default_max_attempts=5,
    )
    expiry = out.now_ms + lease_ms
    wait_for(lambda: rs.now_ms() > expiry, 5, what="the lease to lapse")
    return len(out)


def test_a_lapsed_lease_is_run_lost_and_its_last_one_also_task_dead(rs: Any) -> None:
    rs.add("mail.send", "m1", max_attempts=2)
    assert _claim_short(rs) == 1
    # given back by requeue-stale-9 (the operator's sweep): run.lost, attempt 1
    assert rs.requeue_stale("default")["requeued"] == 1
    evs = rs.events()
    assert [e["event"] for e in evs] == ["run.lost"]
    lost = evs[0]
    assert (lost["kind"], lost["queue"], lost["type"], lost["id"]) == (
        "task",
        "default",
        "mail.send",
        "m1",
    )
    assert lost["result"] == "lost" and lost["attempt"] == 1 and isinstance(lost["token"], str)
    assert "lease expired" in lost["error"]
    # claimed again and lapsed again: its last attempt, reaped by a consumer's claim-12
    assert _claim_short(rs) == 1
    _claim_short(rs)  # this claim reaps (and finds nothing due: the task is dead)
    evs = rs.events()
    assert [e["event"] for e in evs[:2]] == ["task.dead", "run.lost"]
    assert all(e["attempt"] == 2 and e["result"] == "lost" for e in evs[:2])
    assert evs[0]["token"] == evs[1]["token"] != lost["token"]
    assert len(evs) == 3  # nothing else


def test_exec_delivers_its_own_event_before_it_exits_and_metrics_count_it(
    cli: Any, rs: Any, tmp_path: Path
) -> None:
    out = tmp_path / "alerts.jsonl"
    res = cli("exec", "--lock", "job", "--alert-command", appender(out), "--", "false", check=1)
    got = lines(out)  # already there: exec waited for the delivery
    assert [e["event"] for e in got] == ["run.failed"], res.stderr
    assert got[0]["kind"] == "exec" and got[0]["name"] == "job" and got[0]["exit_code"] == 1
    row = next(e for e in cli.json("events") if e["event_id"] == got[0]["event_id"])
    assert row["delivery"] == "delivered" and row["attempts"] == 1
    # a sink that fails: exec makes one attempt, the event stays pending for another process
    cli("exec", "--lock", "job", "--alert-command", "false", "--", "false", check=1)
    newest = cli.json("events")[0]
    assert newest["event"] == "run.failed" and newest["delivery"] == "pending"
    assert newest["attempts"] == 1
    # an ok run has no event and delivers nothing
    cli("exec", "--lock", "job", "--alert-command", appender(out), "--", "true")
    assert len(lines(out)) == 1
    text = cli("metrics").stdout
    series = [ln for ln in text.splitlines() if ln.startswith("rsched_alert_deliveries_total{")]
    assert any('outcome="delivered"' in ln and ln.endswith(" 1.0") for ln in series), series
    assert any('outcome="retried"' in ln and 'target="false"' in ln for ln in series), series


def test_a_partitioned_queue_s_events_are_found_and_delivered(
    cli: Any, rs: Any, tmp_path: Path
) -> None:
    out = tmp_path / "alerts.jsonl"
    ids = ["j0", "j1", "j4", "j5"]  # two in each partition
    assert {partition_index("bad.job", i, 2) for i in ids} == {0, 1}
    for i in ids:
        rs.add("bad.job", i, queue="big", partitions=2, max_attempts=1)
    cli.spawn(
        "run",
        "consumer",
        "--queue",
        "big",
        "--handler",
        "bad.job=false",
        "--alert-command",
        appender(out),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(lambda: len(lines(out)) >= 4, 30, what="four task.dead delivered")
    got = lines(out)
    assert sorted(e["id"] for e in got) == ids
    assert {e["event"] for e in got} == {"task.dead"}
    assert {e["event_id"].split("/")[0] for e in got} == {"q:big#0", "q:big#1"}
    # (the sink ran; its XACK follows the command's exit)
    wait_for(
        lambda: (
            [e["delivery"] for e in rs.events() if e["event"] == "task.dead"] == ["delivered"] * 4
        ),
        10,
        what="the four listed as delivered",
    )


def test_events_follow_prints_each_new_event_once(cli: Any, rs: Any) -> None:
    cli("exec", "--lock", "old", "--", "false", check=1)
    p = cli.spawn("events", "--follow", "--json", stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert p.stdout is not None
    first = json.loads(p.stdout.readline())
    assert first["name"] == "old"  # the recent events first
    cli("exec", "--lock", "new", "--", "false", check=1)
    cli("exec", "--lock", "new", "--", "false", check=1)
    a, b = json.loads(p.stdout.readline()), json.loads(p.stdout.readline())
    assert (a["name"], b["name"]) == ("new", "new") and a["event_id"] != b["event_id"]
    assert a["token"] < b["token"]  # oldest first
    p.terminate()
    rest, _ = p.communicate(timeout=10)
    assert rest.strip() == ""  # nothing printed twice


def test_a_missed_tick_of_a_sharded_cron_is_one_tick_missed(rs: Any) -> None:
    k = rs.keys.cron("sharded")
    fire = rs.now_ms() - 10_000  # 10 s late, deadline 1 s: missed
    args: dict[str, Any] = dict(
        fire_ms=fire,
        mode="own",
        items=4,
        deadline_ms=1000,
        keep_ms=60_000,
        history_maxlen=100,
        name="sharded",
        host="h1",
        pid=1,
        runner_ttl_ms=10_000,
    )
    for runner in ("r1", "r2"):  # two runners meet the same missed tick
        assert calls.cron_shard(rs, k, runner=runner, **args).status == "missed"
    rs.redis.sadd(rs.keys.crons, "sharded")
    evs = rs.events()
    assert [e["event"] for e in evs] == ["tick.missed"]
    assert evs[0]["name"] == "sharded" and evs[0]["result"] == "missed"
    assert evs[0]["fire_at"] and "late by" in evs[0]["error"]
