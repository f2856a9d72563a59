"""rsched.core.resp: the small client `rsched add` uses instead of redis-py, against
real servers (TCP, unix socket, password, database number), and the same
answers as with redis-py (RSCHED_REDIS_PY=1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rsched.core.config import Settings
from rsched.core.conn import connect_oneshot
from rsched.core.errors import RedisUnavailable
from rsched.core.resp import LiteRedis, RespError, parse_url
from tests.support import Cli, RedisServer, free_port


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://localhost:6379/0", {"host": "localhost", "port": 6379, "db": 0}),
        ("redis://h", {"host": "h", "port": 6379, "db": 0}),
        ("redis://u:p%40ss@h:7000/5", {"host": "h", "port": 7000, "db": 5, "password": "p@ss"}),
        ("redis://:pw@h/2", {"host": "h", "db": 2, "password": "pw", "username": None}),
        ("redis://h:1/0?db=3", {"db": 3}),
        ("unix:///tmp/r.sock?db=4", {"path": "/tmp/r.sock", "db": 4}),
    ],
)
def test_parse_url(url: str, expected: dict) -> None:
    opts = parse_url(url)
    assert opts is not None
    for k, v in expected.items():
        assert opts[k] == v, (k, opts)


@pytest.mark.parametrize(
    "url", ["rediss://h:6380/0", "redis://h/0?socket_timeout=3", "redis+sentinel://h/0"]
)
def test_urls_it_leaves_to_redis_py(url: str) -> None:
    assert parse_url(url) is None


def test_replies_decoded_like_redis_py(server: RedisServer, namespace: str) -> None:
    opts = parse_url(server.url)
    assert opts is not None
    lite = LiteRedis(**opts)
    rp = server.client()
    k = f"{namespace}:z"
    assert lite.zscore(k, "m") is None
    rp.zadd(k, {"m": 1796000000123})
    assert lite.zscore(k, "m") == rp.zscore(k, "m") == 1796000000123.0
    h = f"{namespace}:h"
    big = "é" * 300_000 + "\r\n$5\r\n"  # multi-byte, larger than any buffer, protocol-like
    rp.hset(h, "f", big)
    assert lite.hget(h, "f") == big
    assert lite.hget(h, "nope") is None
    assert lite.sadd(f"{namespace}:s", "a", "b") == 2
    sec, usec = lite.time()
    assert int(sec) > 0 and 0 <= int(usec) < 1_000_000
    script = "return {1, 'two', KEYS[1], ARGV[1], {3}, false}"
    assert lite.register_script(script)(keys=["k"], args=["é"]) == [1, "two", "k", "é", [3], None]
    with pytest.raises(RespError, match="WRONGTYPE"):
        lite.hget(k, "f")
    pipe = lite.pipeline(transaction=False)
    pipe.time().hget(k, "f").zscore(k, "m")
    t, err, score = pipe.execute(raise_on_error=False)
    assert isinstance(t, list) and isinstance(err, RespError) and score == 1796000000123.0
    pipe.hget(k, "f")
    with pytest.raises(RespError):
        pipe.execute()
    assert lite.ping()  # the connection is still in step after errors
    lite.close()


def test_connect_oneshot_maps_failures_to_unavailable() -> None:
    s = Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0", connect_timeout_s=2)
    with pytest.raises(RedisUnavailable, match="cannot use Redis"):
        connect_oneshot(s)


def test_rsched_add_does_not_import_redis_py(cli: Cli) -> None:
    code = (
        "import sys\n"
        "from rsched.cli.main import main\n"
        "try:\n"
        "    main(['add', '--in', '1h', 'imp.t', '1'])\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "assert 'redis' not in sys.modules, 'redis-py was imported'\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], env=cli.env(), capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert "imp.t" in res.stdout


def _strip_times(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k not in ("due_at", "due_ms")}


@pytest.mark.parametrize("args", [[], ["--in", "1h"], ["--payload", '{"a": [1, "é"]}']])
def test_same_output_as_with_redis_py(cli: Cli, args: list[str]) -> None:
    lite = cli.json("add", *args, "same.t", "1")
    rp = cli.json("add", *args, "same.t", "2", env={"RSCHED_REDIS_PY": "1"})
    assert _strip_times(lite) == {**_strip_times(rp), "id": "1"}
    # kept: the existing task is read back (show) the same way
    kept_lite = cli.json("add", "same.t", "2")
    kept_rp = cli.json("add", "same.t", "2", env={"RSCHED_REDIS_PY": "1"})
    assert kept_lite == kept_rp and kept_lite["status"] == "kept"
    assert cli("add", "--if-exists", "error", "same.t", "2").returncode == 4


def test_unix_socket_and_database_number(tmp_path: os.PathLike[str]) -> None:
    srv = RedisServer(unix=True).start()
    try:
        c = Cli(srv, "unixns", cwd=str(tmp_path))
        url = f"unix://{srv.unix}?db=3"
        res = c("--redis-url", url, "add", "u.t", "1", "--json")
        assert res.returncode == 0, res.stderr
        assert srv.client(db=3).hexists("unixns:{q:default}:tasks", "u.t 1")
        assert not srv.client(db=0).exists("unixns:{q:default}:tasks")
    finally:
        srv.stop()


def test_password_accepted_refused_and_never_printed(tmp_path: os.PathLike[str]) -> None:
    srv = RedisServer(password="s3cret-pw").start()
    try:
        c = Cli(srv, "pwns", cwd=str(tmp_path))
        assert c("add", "p.t", "1").returncode == 0
        res = c("add", "p.t", "2", env={"RSCHED_REDIS_PASSWORD": "wrong-pw"})
        assert res.returncode == 69 and "wrong-pw" not in res.stderr + res.stdout
        assert "cannot use Redis" in res.stderr and res.stderr.count("\n") == 1
        res = c("add", "p.t", "3", env={"RSCHED_REDIS_PASSWORD": ""})
        assert res.returncode == 69, res.stderr
        url = f"redis://:hunter2@127.0.0.1:{srv.port}/0"
        res = c("--redis-url", url, "add", "p.t", "4", env={"RSCHED_REDIS_PASSWORD": ""})
        assert res.returncode == 69 and "hunter2" not in res.stderr + res.stdout
        # the URL's password wins over the environment's, as with redis-py
        url = f"redis://:s3cret-pw@127.0.0.1:{srv.port}/0"
        res = c("--redis-url", url, "add", "p.t", "5", env={"RSCHED_REDIS_PASSWORD": "wrong-pw"})
        assert res.returncode == 0, res.stderr
    finally:
        srv.stop()


def test_wrong_key_type_exits_78(cli: Cli, server: RedisServer) -> None:
    server.client().set(f"{cli.namespace}:{{q:default}}:sched", "x")
    res = cli("add", "w.t", "1")
    assert res.returncode == 78, res.stderr
    assert "another type" in res.stderr


def test_unreachable_exits_69(cli: Cli) -> None:
    res = cli("add", "u.t", "1", env={"RSCHED_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"})
    assert res.returncode == 69 and "cannot use Redis" in res.stderr
    assert res.stderr.count("\n") == 1


def test_add_json_lines_reads_back(cli: Cli) -> None:
    out = cli.json("add", "--payload", '{"n": 1}', "--max-attempts", "3", "r.t", "1")
    shown = cli.json("show", "r.t", "1")
    assert shown["payload"] == {"n": 1} and shown["max_attempts"] == 3
    assert json.dumps(out["payload"]) == json.dumps(shown["payload"])
