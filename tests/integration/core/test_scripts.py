"""rsched.lua.loader: calls survive a flushed script cache (EVALSHA, then EVAL),
pipelines use EVAL, and refused permissions map to a configuration error,
with redis-py and with the one-shot client."""

from __future__ import annotations

import uuid

import pytest

from rsched.api import Rsched
from rsched.core.errors import ConfigError
from rsched.core.resp import LiteRedis, parse_url
from rsched.lua.loader import Scripts, sha1, source
from rsched.queue import bulk
from rsched.queue.ops import TaskSpec
from tests.support import RedisServer


def _purge_args(rs: Rsched) -> tuple[list[str], list[object]]:
    q = rs.keys.queue("default")
    return [q.dead, q.tasks], [-1, 10]


def test_evalsha_then_eval_after_a_flush(rs: Rsched) -> None:
    keys, args = _purge_args(rs)
    assert rs.scripts("purge-2", keys, args) == [0, 0]
    assert rs.redis.script_exists(sha1("purge-2")) == [True]
    rs.redis.script_flush()
    assert rs.scripts("purge-2", keys, args) == [0, 0]  # NOSCRIPT -> EVAL
    assert rs.redis.script_exists(sha1("purge-2")) == [True]  # EVAL cached it again


def test_pipeline_calls_use_eval(rs: Rsched) -> None:
    rs.redis.script_flush()
    counts = bulk.add_counts(rs, [TaskSpec("s.t", str(i), "default") for i in range(5)])
    assert counts["added"] == 5
    pipe = rs.redis.pipeline(transaction=False)
    keys, args = _purge_args(rs)
    assert rs.scripts("purge-2", keys, args, client=pipe) is None
    rs.redis.script_flush()
    assert pipe.execute() == [[0, 0]]


def test_one_shot_client_sends_eval(server: RedisServer, namespace: str) -> None:
    opts = parse_url(server.url)
    assert opts is not None
    lite = LiteRedis(**opts)
    rs = Rsched(lite, namespace)
    server.client().script_flush()
    keys, args = _purge_args(rs)
    try:
        assert rs.scripts("purge-2", keys, args) == [0, 0]
    finally:
        lite.close()
    assert "purge-2" in source("purge-2")


def test_wrong_key_count_is_a_programming_error(rs: Rsched) -> None:
    with pytest.raises(AssertionError):
        Scripts(rs.redis)("purge-2", ["only-one"], [])


@pytest.mark.parametrize("lite", [False, True])
def test_no_permission_is_a_configuration_error(
    server: RedisServer, namespace: str, lite: bool
) -> None:
    admin = server.client()
    user, pw = f"u-{uuid.uuid4().hex[:6]}", "pw-" + uuid.uuid4().hex
    admin.acl_setuser(
        user, enabled=True, passwords=[f"+{pw}"], keys=["allowed:*"], commands=["+@all"]
    )
    try:
        if lite:
            opts = parse_url(server.url)
            assert opts is not None
            client = LiteRedis(**{**opts, "username": user, "password": pw})
        else:
            client = server.client(username=user, password=pw)
        rs = Rsched(client, namespace)  # namespace keys are outside allowed:*
        keys, args = _purge_args(rs)
        with pytest.raises(ConfigError, match="permission"):
            rs.scripts("purge-2", keys, args)
        client.close()
    finally:
        admin.acl_deluser(user)
