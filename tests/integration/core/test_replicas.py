"""``--wait-replicas N``: after adds and lock acquisitions, Redis ``WAIT`` until N
replicas have the write. Against a primary with a real replica (``replicaof``),
and with that replica frozen (SIGSTOP) to see the shortfall reported."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rsched.api import Rsched
from rsched.core.config import Settings
from tests.support import Cli, RedisServer, wait_for


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[RedisServer, RedisServer]]:
    primary = RedisServer().start()
    replica = RedisServer(extra=[f"replicaof 127.0.0.1 {primary.port}"]).start()
    with primary.client() as c:
        wait_for(
            lambda: (
                int(c.info("replication")["connected_slaves"]) == 1
                and c.info("replication")["slave0"]["state"] == "online"
            ),
            timeout=30,
            what="the replica online",
        )
    yield primary, replica
    replica.stop()
    primary.stop()


@pytest.fixture
def frozen(pair: tuple[RedisServer, RedisServer]) -> Iterator[RedisServer]:
    """The replica, stopped with SIGSTOP for the test (the primary still counts it)."""
    replica = pair[1]
    replica.freeze()
    try:
        yield replica
    finally:
        replica.thaw()


@pytest.fixture
def pcli(pair: tuple[RedisServer, RedisServer], namespace: str, tmp_path: Path) -> Iterator[Cli]:
    c = Cli(pair[0], namespace, cwd=str(tmp_path))
    yield c
    c.close()


def test_add_waits_for_a_live_replica(pcli: Cli, pair: tuple[RedisServer, RedisServer]) -> None:
    out = pcli.json("add", "r.t", "1", "--wait-replicas", "1")
    assert out["status"] == "added" and out["replicas_acked"] == 1
    # redis-py's client (RSCHED_REDIS_PY=1) waits on the connection that wrote, too.
    out = pcli.json("add", "r.t", "2", "--wait-replicas", "1", env={"RSCHED_REDIS_PY": "1"})
    assert out["replicas_acked"] == 1
    out = pcli.json("add", "--from", "-", "--wait-replicas", "1",
                    input='{"type": "r.t", "id": "3"}\n{"type": "r.t", "id": "4"}\n')  # fmt: skip
    assert out["added"] == 2 and out["replicas_acked"] == 1
    rs = Rsched(pair[1].client(), pcli.namespace)
    assert rs.redis.hlen(rs.keys.queue("default").tasks) == 4  # on the replica already


def test_a_frozen_replica_is_reported_and_exits_1_with_the_task_written(
    pcli: Cli, frozen: RedisServer
) -> None:
    t0 = time.monotonic()
    res = pcli("add", "r.f", "1", "--wait-replicas", "1", "--wait-replicas-timeout", "300ms",
               "--json")  # fmt: skip
    took = time.monotonic() - t0
    assert res.returncode == 1, res.stderr
    assert json.loads(res.stdout)["replicas_acked"] == 0  # the record is still printed
    assert "task r.f 1 is written, but only 0 of 1 replicas acknowledged it within 300 ms" in (
        res.stderr
    )
    assert took >= 0.3
    assert pcli.json("show", "r.f", "1")["state"] == "due"  # written all the same
    # Adding it again (what a retrying producer does) keeps it and waits again.
    res = pcli("add", "r.f", "1", "--wait-replicas", "1", "--wait-replicas-timeout", "200ms")
    assert res.returncode == 1 and "already exists" in res.stderr
    res = pcli("add", "--from", "-", "--wait-replicas", "1", "--wait-replicas-timeout", "200ms",
               input='{"type": "r.f", "id": "2"}\n')  # fmt: skip
    assert res.returncode == 1 and "1 tasks is written, but only 0 of 1" in res.stderr
    assert res.stdout.startswith("added 1")
    # A batch that only keeps (the retry of that file) waits too: on Valkey and
    # Redis >= 7.2 WAIT counts the connection's own writes only, so the add
    # script rewrites one kept record unchanged.
    for args in (["add", "r.f", "1"], ["add", "--from", "-"]):
        res = pcli(*args, "--wait-replicas", "1", "--wait-replicas-timeout", "200ms",
                   input='{"type": "r.f", "id": "2"}\n')  # fmt: skip
        assert res.returncode == 1 and "only 0 of 1" in res.stderr, (args, res.stderr)


def test_more_replicas_than_exist_and_the_config_default(
    pcli: Cli, pair: tuple[RedisServer, RedisServer], tmp_path: Path
) -> None:
    res = pcli("add", "r.c", "1", "--wait-replicas", "2", "--wait-replicas-timeout", "200ms")
    assert res.returncode == 1 and "only 1 of 2 replicas" in res.stderr
    (tmp_path / "rsched.toml").write_text(
        '[redis]\nwait_replicas = 2\nwait_replicas_timeout = "150ms"\n'
    )
    res = pcli("add", "r.c", "2")
    assert res.returncode == 1 and "only 1 of 2 replicas" in res.stderr
    assert "within 150 ms" in res.stderr
    res = pcli("add", "r.c", "3", "--wait-replicas", "0")  # the flag wins
    assert res.returncode == 0, res.stderr
    (tmp_path / "rsched.toml").write_text("[redis]\nwait_replicas = -1\n")
    res = pcli("add", "r.c", "4")
    assert res.returncode == 78 and "redis.wait_replicas" in res.stderr
    res = pcli("add", "r.c", "4", "--wait-replicas", "-1")
    assert res.returncode == 2


def test_exec_waits_after_acquiring_and_runs_anyway_when_short(
    pcli: Cli, frozen: RedisServer, tmp_path: Path
) -> None:
    mark = tmp_path / "ran"
    res = pcli("exec", "--lock", "rl", "--wait-replicas", "1", "--wait-replicas-timeout", "200ms",
               "--", "touch", str(mark))  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert mark.exists()
    assert "only 0 of 1 replicas acknowledged it" in res.stderr
    assert "lock 'rl' (fencing token 1)" in res.stderr


def test_exec_with_a_live_replica_says_nothing(pcli: Cli, tmp_path: Path) -> None:
    res = pcli("exec", "--lock", "rl2", "--wait-replicas", "1", "--", "true")
    assert res.returncode == 0 and "replicas" not in res.stderr, res.stderr


def test_run_cron_reports_a_short_tick_claim_and_fires(
    pcli: Cli, frozen: RedisServer, tmp_path: Path
) -> None:
    log = tmp_path / "fires"
    p = pcli.spawn("run", "cron", "rc", "--schedule", "* * * * * *", "--wait-replicas", "1",
                   "--wait-replicas-timeout", "100ms", "--", "sh", "-c", f"echo x >> {log}")  # fmt: skip
    # (a generous deadline: in a loaded CI run the first fire once took over 15 s)
    wait_for(lambda: log.exists() and log.read_text().count("x") >= 1, timeout=45, what="a fire")
    p.terminate()
    _, err = p.communicate(timeout=30)
    assert p.returncode == 0
    assert "cron rc: the tick claim is written, but only 0 of 1 replicas" in err


def test_library_lock_waits_for_replicas(
    pair: tuple[RedisServer, RedisServer], namespace: str
) -> None:
    rs = Rsched(pair[0].client(), namespace)
    with rs.lock("lib", wait_replicas=1) as token:
        assert token == 1
    lock = rs.lock("lib", wait_replicas=1)
    lock.acquire()
    assert lock.replicas_acked == 1
    lock.release()
    pair[1].freeze()
    try:
        lock = rs.lock("lib", wait_replicas=1, wait_replicas_timeout_ms=100)
        assert lock.acquire() == 3  # acquired all the same
        assert lock.replicas_acked == 0
        lock.release()
    finally:
        pair[1].thaw()
    # The settings' default applies to the library too.
    s = Settings(redis_url=pair[0].url, namespace=namespace)
    s.wait_replicas = 1
    rs2 = Rsched(pair[0].client(), namespace, settings=s)
    lock = rs2.lock("lib")
    lock.acquire()
    assert lock.replicas_acked == 1
    lock.release()
