"""A full Redis (``maxmemory`` reached, ``noeviction``): loops wait it out with
backoff and say so; one-shot commands exit 69 saying what was (not) written.

Each test owns its server and fills it for real: ``CONFIG SET maxmemory`` just
above what is used, ``SET`` until Redis refuses, then the limit lowered below
the usage so that it stays full whatever client buffers do; freeing is
``CONFIG SET maxmemory 0``.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path

import pytest
import redis

from tests.support import Cli, RedisServer, wait_for


def fill(r: redis.Redis) -> None:
    used = int(r.info("memory")["used_memory"])
    r.config_set("maxmemory", used + 256 * 1024)
    i = 0
    try:
        while True:
            r.set(f"fill:{i}", "x" * 10_000)
            i += 1
    except redis.exceptions.OutOfMemoryError:
        pass
    assert i > 0
    r.config_set("maxmemory", int(r.info("memory")["used_memory"]) // 2)


def free(r: redis.Redis) -> None:
    r.config_set("maxmemory", 0)


def _ok_runs(c: Cli, *args: str) -> list[dict[str, object]]:
    return [h for h in c.json("history", *args, "--limit", "1000") if h["result"] == "ok"]


def test_consumer_waits_out_a_full_redis(
    own_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """Today's failure: the consumer exited 1 with `internal error: OutOfMemoryError`."""
    c = Cli(own_server, namespace, cwd=str(tmp_path))
    r = own_server.client()
    err = tmp_path / "consumer.err"
    try:
        c("add", "--in", "1h", "t.x", "later", check=0)  # `queues` lists known queues
        with open(err, "w") as fh:
            p = c.spawn("run", "consumer", "--call", "t.x=builtins:repr", stderr=fh)
        wait_for(lambda: c.json("queues")[0]["consumers"] == 1, timeout=30, what="registered")
        fill(r)
        # Its next claim (at the latest one idle cadence, 10 s, later) is refused.
        wait_for(lambda: "out of memory" in err.read_text(), timeout=30, what="the log line")
        line = next(x for x in err.read_text().splitlines() if "out of memory" in x)
        assert line.startswith("rsched consumer: error: Redis is out of memory"), line
        assert "retrying in" in line and "maxmemory" in line, line
        assert p.poll() is None, err.read_text()
        free(r)
        c("add", "t.x", "1", check=0)
        wait_for(
            lambda: any(h["id"] == "1" for h in _ok_runs(c, "--queue", "default")),
            timeout=30,
            what="the task added after memory was freed to run",
        )
        assert "internal error" not in err.read_text()
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0, err.read_text()
    finally:
        c.close()
        r.close()


def test_cron_runner_waits_out_a_full_redis_and_records_again(
    own_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """Today's runner survived but logged `Redis unavailable (command not allowed
    when used memory > 'maxmemory'.)`, and a job that ended while Redis was full
    was never recorded (its run lock held the next ticks off until its TTL)."""
    c = Cli(own_server, namespace, cwd=str(tmp_path))
    r = own_server.client()
    err = tmp_path / "cron.err"
    try:
        with open(err, "w") as fh:
            p = c.spawn(
                "run", "cron", "full.c", "--schedule", "*/1 * * * * *", "--", "true", stderr=fh
            )
        wait_for(lambda: _ok_runs(c, "full.c"), timeout=30, what="a first run")
        fill(r)
        wait_for(lambda: "out of memory" in err.read_text(), timeout=30, what="the log line")
        assert "cron full.c: Redis is out of memory" in err.read_text(), err.read_text()
        before = {h["fire_at"] for h in _ok_runs(c, "full.c")}
        free(r)
        wait_for(
            lambda: len({h["fire_at"] for h in _ok_runs(c, "full.c")} - before) >= 3,
            timeout=60,
            what="ticks to run again",
        )
        assert p.poll() is None, err.read_text()
        assert "Redis is back" in err.read_text()
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0, err.read_text()
    finally:
        c.close()
        r.close()


def test_run_expired_waits_out_a_full_redis(
    own_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """A key expires while Redis is full: the claim is refused, retried (within
    half the claim window), and goes through once memory is freed."""
    c = Cli(own_server, namespace, cwd=str(tmp_path))
    r = own_server.client()
    out = tmp_path / "fired"
    handler = tmp_path / "h.sh"
    handler.write_text(f"#!/bin/sh\necho \"$1\" >> '{out}'\n")
    handler.chmod(0o755)
    err = tmp_path / "expired.err"
    try:
        with open(err, "w") as fh:
            p = c.spawn(
                "run", "expired", "--pattern", "k:*", "--set-notify",
                "--claim-window", "120s", "--", str(handler), stderr=fh,
            )  # fmt: skip
        wait_for(
            lambda: any(int(x.get("psub", 0)) for x in r.client_list()),
            timeout=20,
            what="the subscriber",
        )
        r.set("k:1", "v", px=1500)
        fill(r)
        wait_for(lambda: "out of memory" in err.read_text(), timeout=30, what="the log line")
        assert not out.exists()
        assert p.poll() is None, err.read_text()
        free(r)
        wait_for(lambda: out.exists() and out.read_text() == "k:1\n", timeout=60, what="k:1")
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0, err.read_text()
    finally:
        c.close()
        r.close()


def test_one_shot_commands_exit_69_and_say_what_was_not_written(
    own_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """Today: exit 1, `internal error: OutOfMemoryError`, for each of these."""
    c = Cli(own_server, namespace, cwd=str(tmp_path))
    r = own_server.client()
    marker = tmp_path / "ran"
    try:
        fill(r)
        res = c("add", "t.x", "1")
        assert res.returncode == 69, res.stderr
        assert "Redis is out of memory" in res.stderr and "t.x 1" in res.stderr
        assert "was not added" in res.stderr and "internal error" not in res.stderr

        res = c("exec", "--lock", "full.e", "--", "touch", str(marker))
        assert res.returncode == 69, res.stderr
        assert "the command was not run" in res.stderr, res.stderr
        assert not marker.exists()

        for args, what in (
            (["pause", "full.c", "--create"], "cron"),
            (["pause", "--queue", "q", "--create"], "queue"),
        ):
            res = c(*args)
            assert res.returncode == 69, res.stderr
            assert f"{what} " in res.stderr and "was not paused" in res.stderr, res.stderr
        assert not any(k for k in r.scan_iter(f"{namespace}:*"))  # nothing written
        free(r)
        c("add", "t.x", "1", check=0)
        c("exec", "--lock", "full.e", "--", "touch", str(marker), check=0)
        assert marker.exists()
    finally:
        c.close()
        r.close()


def _jsonl(n: int) -> str:
    return "".join(
        json.dumps({"type": "o.t", "id": str(i), "in": "1h", "payload": {"x": "y" * 50}}) + "\n"
        for i in range(n)
    )


def test_add_from_into_a_filling_redis_says_how_many_lines_were_written(
    own_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """Room for part of the file: exit 69, and the count it gives is what Redis has
    (today: exit 1, an internal error, no count)."""
    c = Cli(own_server, namespace, cwd=str(tmp_path))
    r = own_server.client()
    try:
        r.config_set("maxmemory", int(r.info("memory")["used_memory"]) + 2 * 1024 * 1024)
        res = c("add", "--from", "-", "--retry-for", "0", input=_jsonl(30_000))
        assert res.returncode == 69, res.stderr
        m = re.search(
            r"wrote (\d+) of the first (\d+) tasks \(lines 1-(\d+): added (\d+)", res.stderr
        )
        assert m, res.stderr
        written = int(m.group(1))
        assert written == int(m.group(4)) == r.hlen(f"{namespace}:{{q:default}}:tasks")
        assert 0 < written < 30_000, res.stderr
        assert "Redis is out of memory" in res.stderr
        free(r)
        # Running it again keeps what was written and adds the rest.
        res = c("add", "--from", "-", input=_jsonl(30_000), check=0)
        assert f"added {30_000 - written}, kept {written}" in res.stdout
    finally:
        c.close()
        r.close()


def test_add_from_waits_out_a_full_redis_within_retry_for(
    own_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    c = Cli(own_server, namespace, cwd=str(tmp_path))
    r = own_server.client()
    err = tmp_path / "add.err"
    try:
        fill(r)
        with open(err, "w") as fh:
            p = c.spawn(
                "add", "--from", "-", "--retry-for", "120s", stdin=subprocess.PIPE, stderr=fh
            )
        assert p.stdin is not None
        p.stdin.write(_jsonl(3_000))
        p.stdin.close()
        wait_for(lambda: "writing the batch again" in err.read_text(), timeout=60, what="retry")
        assert "Redis is out of memory" in err.read_text()
        free(r)
        assert p.wait(timeout=60) == 0, err.read_text()
        assert r.hlen(f"{namespace}:{{q:default}}:tasks") == 3_000
    finally:
        c.close()
        r.close()


def test_a_task_that_finishes_while_redis_is_full_is_acked_at_once(
    own_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """The ack deletes before it appends the history record, so a full Redis takes
    it (a script is refused only at a first write that may grow memory): the task
    does not wait in the consumer for room, nor run again after its lease."""
    c = Cli(own_server, namespace, cwd=str(tmp_path))
    r = own_server.client()
    go = tmp_path / "go"
    h = tmp_path / "wait.sh"
    h.write_text(f"#!/bin/sh\nwhile [ ! -e '{go}' ]; do sleep 0.05; done\n")
    h.chmod(0o755)
    err = tmp_path / "consumer.err"
    try:
        with open(err, "w") as fh:
            p = c.spawn("run", "consumer", "--handler", f"t.w={h}", stderr=fh)
        c("add", "t.w", "1", check=0)
        wait_for(lambda: c.json("show", "t.w", "1")["state"] == "processing", timeout=30)
        fill(r)
        go.touch()
        wait_for(
            lambda: any(x["id"] == "1" for x in _ok_runs(c, "--queue", "default")),
            timeout=30,
            what="the ack while Redis is full",
        )
        assert c("show", "t.w", "1").returncode == 3  # gone: acknowledged
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            r.set("still", "full")
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0, err.read_text()
    finally:
        free(r)
        c.close()
        r.close()
