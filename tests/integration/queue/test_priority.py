"""Priorities (`add --priority N`): among due tasks a higher priority is claimed
first, equal priorities in due-time order; every state-reading command sees a
due task of another priority (out of sched, in the ready set) as due."""

from __future__ import annotations

import json

import pytest

from rsched.api import Rsched
from rsched.lua import calls
from tests.support import Cli, RedisServer, wait_for


def take(rs: Rsched, n: int, *, types: tuple[str, ...] = (), queue: str = "default") -> list[str]:
    """Claim up to ``n`` tasks (every type, or the anchored Lua patterns ``types``)."""
    q = rs.keys.queue(queue)
    reply = calls.claim(
        rs,
        q,
        max_tasks=n,
        lease_ms=60_000,
        consumer="t-consumer",
        registration_ttl_ms=15_000,
        reap_limit=100,
        history_maxlen=100,
        queue=queue,
        default_max_attempts=3,
        park_limit=100 if types else None,
        type_patterns=types,
    )
    return [t[0] for t in reply.tasks()]


@pytest.mark.valkey
def test_higher_priority_first_then_due_order_and_negative_last(rs: Rsched) -> None:
    # added in this order, all due (ids tell the due order: at = epoch ms)
    rs.add("p.t", "zero-old", at=1_000)
    rs.add("p.t", "low", at=500, priority=-5)
    rs.add("p.t", "zero-new", at=2_000)
    rs.add("p.t", "high-new", at=3_000, priority=7)
    rs.add("p.t", "high-old", at=2_500, priority=7)
    rs.add("p.t", "top", at=4_000, priority=1000)
    rs.add("p.t", "bottom", at=100, priority=-1000)
    rs.add("p.t", "later", delay=3_600_000, priority=1000)  # not due: not claimed
    order = take(rs, 2) + take(rs, 3) + take(rs, 10)
    assert order == [
        "p.t top",
        "p.t high-old",
        "p.t high-new",
        "p.t zero-old",
        "p.t zero-new",
        "p.t low",
        "p.t bottom",
    ]
    assert rs.show("p.t", "later").state == "scheduled"


def test_a_due_task_of_another_priority_is_due_everywhere(rs: Rsched, cli: Cli) -> None:
    rs.add("p.s", "a", priority=3, payload={"x": 1})
    rs.add("p.s", "b")
    assert take(rs, 0) == []  # a claim of nothing moves nothing
    rs.add("p.s", "c", priority=-2)
    rs.add("p.s", "d", delay=60_000)
    q = rs.keys.queue("default")
    # a claim that finds due tasks readies those of another priority (then takes one)
    assert take(rs, 1) == ["p.s a"]
    assert (
        rs.redis.zscore(q.ready, "p.s c") is not None and rs.redis.zscore(q.sched, "p.s c") is None
    )
    t = rs.show("p.s", "c")
    assert t.state == "due" and t.priority == -2 and t.due_ms is not None
    listed = cli.json("list", "--state", "due")
    assert [(x["id"], x["priority"]) for x in listed] == [("b", 0), ("c", -2)]
    [stats] = [s for s in rs.queues() if s.queue == "default"]
    assert (stats.due, stats.scheduled, stats.processing) == (2, 1, 1)
    kept = cli.json("add", "p.s", "c")
    assert kept["status"] == "kept" and kept["state"] == "due" and kept["priority"] == -2
    assert cli.json("show", "p.s", "a")["priority"] == 3
    # cancel and replace take it out of ready
    assert cli("cancel", "p.s", "c", check=0)
    assert rs.redis.zscore(q.ready, "p.s c") is None
    assert take(rs, 10) == ["p.s b"]


def test_a_retried_or_reaped_task_keeps_its_priority(rs: Rsched) -> None:
    rs.add("p.r", "z1")
    rs.add("p.r", "hi", priority=9)
    q = rs.keys.queue("default")
    reply = calls.claim(
        rs,
        q,
        max_tasks=1,
        lease_ms=50,
        consumer="c",
        registration_ttl_ms=15_000,
        reap_limit=100,
        history_maxlen=100,
        queue="default",
        default_max_attempts=3,
    )
    assert next(reply.tasks())[0] == "p.r hi"
    # the lease runs out: reaped back to due, and readied again before z1
    wait_for(lambda: rs.now_ms() > reply.now_ms + 60, timeout=5, what="the lease to end")
    assert take(rs, 1) == ["p.r hi"]
    assert take(rs, 1) == ["p.r z1"]


def test_a_consumer_of_some_types_takes_its_ready_tasks_first(rs: Rsched) -> None:
    rs.add("other.t", "o1", priority=50)
    rs.add("mine.t", "m0")
    rs.add("mine.t", "m1", priority=5)
    assert take(rs, 1, types=("^mine%.t$",)) == ["mine.t m1"]
    assert take(rs, 5, types=("^mine%.t$",)) == ["mine.t m0"]
    assert take(rs, 5) == ["other.t o1"]


def test_add_from_lines_take_priority_and_bad_values_are_refused(
    cli: Cli, server: RedisServer, namespace: str
) -> None:
    lines = "\n".join(
        json.dumps(x)
        for x in (
            {"type": "p.f", "id": "a"},
            {"type": "p.f", "id": "b", "priority": 10},
            {"type": "p.f", "id": "c", "priority": -1},
        )
    )
    cli("add", "--from", "-", input=lines, check=0)
    rs = Rsched(server.client(), namespace)
    assert take(rs, 3) == ["p.f b", "p.f a", "p.f c"]
    before = sorted(server.client().scan_iter(f"{namespace}:*"))
    for bad in ("1001", "-1001", "1.5", "high", "", "+3"):
        res = cli("add", "--priority", bad, "p.f", "x", check=2)
        assert res.stderr.count("\n") == 1 and "--priority" in res.stderr, res.stderr
        assert "-1000 to 1000" in res.stderr
    for bad_line in (
        '{"type":"p.f","id":"y","priority":"5"}',
        '{"type":"p.f","id":"y","priority":2000}',
    ):
        res = cli("add", "--from", "-", input=bad_line, check=2)
        assert "line 1: priority" in res.stderr and res.stderr.count("\n") == 1, res.stderr
    assert sorted(server.client().scan_iter(f"{namespace}:*")) == before


def test_a_dead_task_retried_keeps_its_priority(rs: Rsched, cli: Cli) -> None:
    rs.add("p.d", "hi", priority=4, max_attempts=1)

    def fail(task: object) -> None:
        raise RuntimeError("no")

    rs.consumer(handlers={"p.d": fail}, burst=True, quiet=True).run()
    assert rs.show("p.d", "hi").state == "dead"
    rs.add("p.d", "z0", at=1)  # due long before the retry
    cli("retry", "p.d", "hi", check=0)
    assert take(rs, 1) == ["p.d hi"]
