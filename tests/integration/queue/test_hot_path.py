"""The one-task add is one round trip: what the server is sent (INFO
commandstats of a server of the test's own), the type checks once per
connection, and a queue partitioned without this process knowing it."""

from __future__ import annotations

from typing import Any

from rsched.api import Rsched
from rsched.core.errors import WrongKeyType
from rsched.queue import queues as P
from tests.support import Cli, RedisServer

#: Commands a client sends itself (Lua's own calls are counted too, so only those
#: no script of add-7 sends are told apart: EVAL*, the registration, the config
#: read; a show() would send HGET).
CLIENT_SIDE = ("eval", "evalsha", "sadd", "hget", "type", "script", "exists")


def _stats(r: Any) -> dict[str, int]:
    out = {}
    for k, v in r.info("commandstats").items():
        name = k.removeprefix("cmdstat_")
        if name in CLIENT_SIDE:
            out[name] = int(v["calls"])
    return out


def test_later_adds_read_no_config_and_kept_ones_need_no_show(
    own_server: RedisServer, namespace: str
) -> None:
    r = own_server.client()
    rs = Rsched(own_server.client(), namespace)
    first = rs.add("h.t", "0", delay=60_000)
    assert first.status == "added" and first.now_ms is not None
    r.config_resetstat()
    res = rs.add("h.t", "1", delay=60_000)
    assert res.status == "added" and res.task.state == "scheduled"
    # one pipeline: add-7 and the queue's entry in the list of queues
    assert _stats(r) == {"evalsha": 1, "sadd": 1}
    r.config_resetstat()
    kept = rs.add("h.t", "1", delay=5)
    assert _stats(r) == {"evalsha": 1, "sadd": 1}  # no show() after it
    assert kept.status == "kept" and kept.task == rs.show("h.t", "1")
    assert kept.task.due_ms == res.task.due_ms


def test_a_kept_task_in_each_state_answers_as_show_does(rs: Rsched) -> None:
    rs.add("h.k", "due", payload={"a": 1}, max_attempts=3)
    kept = rs.add("h.k", "due", delay=60_000)
    assert kept.status == "kept" and kept.task == rs.show("h.k", "due")
    assert kept.task.payload == {"a": 1} and kept.task.max_attempts == 3
    q = rs.keys.queue("default")
    m = "h.k due"
    rs.redis.zrem(q.sched, m)
    rs.redis.zadd(q.proc, {m: 1_900_000_000_000})
    kept = rs.add("h.k", "due")
    assert kept.status == "kept" and kept.task == rs.show("h.k", "due")
    assert kept.task.state == "processing" and kept.task.lease_ms == 1_900_000_000_000


def test_rsched_add_sends_one_pipeline(own_server: RedisServer, namespace: str, tmp_path) -> None:
    cli = Cli(own_server, namespace, cwd=str(tmp_path))
    r = own_server.client()
    r.config_resetstat()
    cli("add", "--in", "1h", "h.c", "1", check=0)
    # the pipeline: queue-config read, add-7 (EVAL: the one-shot client; its five
    # TYPE checks on a connection's first add), SADD; no TIME, no show()
    one_pipeline = {"eval": 1, "hget": 1, "sadd": 1, "type": 5}
    assert _stats(r) == one_pipeline
    r.config_resetstat()
    out = cli.json("add", "h.c", "1")
    assert out["status"] == "kept" and out["state"] == "scheduled"
    assert _stats(r) == one_pipeline


def test_type_checks_run_on_the_first_add_of_a_connection(rs: Rsched, server: RedisServer) -> None:
    rs.add("h.w", "1")
    key = rs.keys.queue("other").dead
    rs.redis.set(key, "x")
    fresh = Rsched(server.client(), rs.namespace)
    try:
        fresh.add("h.w", "1", queue="other")
        raise AssertionError("WrongKeyType expected")
    except WrongKeyType as exc:
        assert f"key {key!r} holds a string, not a zset" in str(exc)
    assert "other" not in rs.redis.smembers(rs.keys.queues)  # not registered
    assert not rs.redis.exists(rs.keys.queue("other").tasks)


def test_a_queue_partitioned_elsewhere_is_found(rs: Rsched, server: RedisServer) -> None:
    # this process takes "big" to be unpartitioned; another partitions it
    rs.add("h.p", "warm", queue="small")
    other = Rsched(server.client(), rs.namespace)
    assert P.count(other, "big", 4) == 4
    tasks = rs.keys.queue("big").tasks
    assert rs.redis.hget(tasks, P.PARTITIONS_FIELD) == "4"
    res = rs.add("h.p", "1", queue="big")
    assert res.stored_queue is not None and res.stored_queue.startswith("big#")
    assert rs.show("h.p", "1", "big").state == "due"
    assert rs.redis.hkeys(tasks) == [P.PARTITIONS_FIELD]  # nothing unpartitioned


def test_a_queue_partitioned_by_an_earlier_version_is_found(rs: Rsched) -> None:
    # queue-config says 3 partitions, but the queue has no "#partitions" field yet
    rs.redis.hset(rs.keys.queue_config, "old", 3)
    res = rs.add("h.o", "1", queue="old")
    assert res.status == "added" and (res.stored_queue or "").startswith("old#")
    tasks = rs.keys.queue("old").tasks
    assert rs.redis.hkeys(tasks) == [P.PARTITIONS_FIELD]  # the stray add taken back
    assert not rs.redis.zcard(rs.keys.queue("old").sched)
    assert rs.show("h.o", "1", "old").state == "due"
    fresh = Rsched(rs.redis, rs.namespace)
    assert fresh.add("h.o", "2", queue="old").stored_queue != "old"


def test_every_add_registers_its_queue(rs: Rsched) -> None:
    rs.add("h.r", "1", queue="reg")
    rs.redis.srem(rs.keys.queues, "reg")  # lost (a restart without persistence, say)
    rs.add("h.r", "2", queue="reg")
    assert "reg" in rs.redis.smembers(rs.keys.queues)


def test_the_one_connection_path_rides_out_a_script_flush_and_other_clients(
    own_server: RedisServer, namespace: str
) -> None:
    """A plain client's add is sent on one pooled connection (no pipeline): after
    SCRIPT FLUSH it falls back to EVAL; a single-connection client, or another
    encoding, goes through a pipeline; every answer is the same."""
    r = own_server.client()
    rs = Rsched(own_server.client(), namespace)
    assert rs.add("h.f", "1").status == "added"
    r.script_flush()
    res = rs.add("h.f", "2", payload={"é": 1}, max_attempts=2)
    assert res.status == "added" and res.task == rs.show("h.f", "2")
    assert rs.add("h.f", "2").status == "kept"
    pool = rs.redis.connection_pool
    assert len(pool._in_use_connections) == 0  # released, whatever the path
    for client in (
        own_server.client(single_connection_client=True),
        own_server.client(encoding="latin-1"),
    ):
        other = Rsched(client, namespace)
        assert other.add("h.f", "3").status in ("added", "kept")
        assert other.add("h.f", "3").status == "kept"
    assert r.sismember(f"{namespace}:queues", "default")
