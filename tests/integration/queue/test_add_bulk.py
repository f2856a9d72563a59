"""Bulk adds (one add-7 call for many tasks): duplicates inside one call,
orphans, tasks in every state, the counts-only reply, and `add --from`
batches written while the next one is parsed."""

from __future__ import annotations

import json
import re
import subprocess
import threading
from pathlib import Path

import pytest

from rsched.api import Rsched
from rsched.core.errors import BadInput, Conflict
from rsched.queue import bulk, specs
from rsched.queue import ops as tasks
from rsched.queue.ops import TaskSpec
from tests.support import Cli, RedisServer, wait_for


def _spec(i: str, delay: int | None = None, payload: str = "null") -> TaskSpec:
    return TaskSpec("b.t", i, "default", delay_ms=delay, payload_json=payload)


def test_duplicates_in_one_call_keep_and_replace(rs: Rsched) -> None:
    res = bulk.add_many(rs, [_spec("1", 60_000, '{"v":1}'), _spec("1", 5, '{"v":2}')])
    assert [r.status for r in res] == ["added", "kept"]
    assert res[1].task.state == "scheduled" and res[1].task.due_ms == res[0].task.due_ms
    assert rs.show("b.t", "1").payload == {"v": 1}
    res = bulk.add_many(
        rs, [_spec("2", None, '{"v":1}'), _spec("2", 60_000, '{"v":2}')], if_exists="replace"
    )
    assert [r.status for r in res] == ["added", "replaced"]
    t = rs.show("b.t", "2")
    assert t.payload == {"v": 2} and t.state == "scheduled"
    assert rs.redis.zcard(rs.keys.queue("default").sched) == 2


def test_existing_tasks_in_every_state(rs: Rsched) -> None:
    q = rs.keys.queue("default")
    bulk.add_many(rs, [_spec("due"), _spec("proc"), _spec("dead"), _spec("orphan")])
    rs.redis.zrem(q.sched, "b.t proc", "b.t dead", "b.t orphan")
    rs.redis.zadd(q.proc, {"b.t proc": 1})
    rs.redis.zadd(q.dead, {"b.t dead": 1})
    specs = [_spec(i, 1000) for i in ("due", "proc", "dead", "orphan", "new")]
    res = bulk.add_many(rs, specs)
    assert [(r.status, r.task.state) for r in res] == [
        ("kept", "due"),
        ("kept", "processing"),
        ("kept", "dead"),
        ("replaced", "scheduled"),
        ("added", "scheduled"),
    ]
    counts = bulk.add_counts(rs, specs, if_exists="replace")
    assert counts == {"added": 0, "kept": 0, "replaced": 5}
    assert rs.redis.zcard(q.proc) == 0 and rs.redis.zcard(q.dead) == 0
    assert rs.redis.zcard(q.sched) == 5
    with pytest.raises(Conflict):
        bulk.add_counts(rs, [_spec("brand-new"), _spec("due")], if_exists="error")
    assert not rs.redis.hexists(q.tasks, "b.t brand-new")


def test_large_call_is_sliced_for_lua(rs: Rsched) -> None:
    n = 9_000  # more arguments than one Lua unpack takes
    counts = bulk.add_counts(rs, [_spec(str(i), 1000 + i) for i in range(n)], batch=n)
    assert counts == {"added": n, "kept": 0, "replaced": 0}
    again = bulk.add_counts(rs, [_spec(str(i)) for i in range(n)], batch=n)
    assert again == {"added": 0, "kept": n, "replaced": 0}
    assert rs.redis.hlen(rs.keys.queue("default").tasks) == n


def test_record_is_compact_until_claimed(rs: Rsched) -> None:
    q = rs.keys.queue("default")
    bulk.add_many(rs, [_spec("c", None, '{"a":"é"}')])
    assert rs.redis.hget(q.tasks, "b.t c") == json.dumps(['{"a":"é"}'], ensure_ascii=False)
    rs.add("b.t", "m", max_attempts=3)
    assert json.loads(rs.redis.hget(q.tasks, "b.t m")) == ["null", 0, 3]


def test_add_lines_batches_and_bad_line(rs: Rsched) -> None:
    lines = [json.dumps({"type": "l.t", "id": str(i), "in": "1h"}).encode() for i in range(25)]
    seen = []
    counts = bulk.add_lines(rs, lines, batch=10, progress=lambda c: seen.append(dict(c)))
    assert counts == {"added": 25, "kept": 0, "replaced": 0}
    assert [sum(c.values()) for c in seen] == [10, 20, 25]
    bad = [*lines[:12], b'{"type": "l.t", "id": "x", "in": "soon"}', *lines[13:]]
    with pytest.raises(BadInput, match=r"line 13: in.*10 tasks from earlier lines"):
        bulk.add_lines(rs, bad, batch=10, if_exists="replace")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        # A number is not read as milliseconds: "at" would be in 1970, "in" 1.8 s.
        (
            '"at": 1796040000',
            r"^line 2: at: 1796040000 is a JSON number; give a string: an ISO 8601",
        ),
        ('"in": 1800', r"^line 2: in: 1800 is a JSON number; give a string: a positive duration"),
        ('"in": true', r"^line 2: in: true is a JSON boolean"),
        ('"at": ["2026-12-01T02:00Z"]', r"^line 2: at: .* is a JSON array"),
        ('"max_attempts": 2.5', r"^line 2: max_attempts: 2.5 is not a whole number from 1 to"),
        ('"max_attempts": "3x"', r"^line 2: max_attempts: '3x' is not a whole number"),
        ('"max_attempts": false', r"^line 2: max_attempts: false is not a whole number"),
        ('"max_attempts": {"n": 3}', r"^line 2: max_attempts: .* is not a whole number"),
        # "line 2" once, the fields by their JSON names
        ('"in": "1h", "at": "2026-12-01T02:00Z"', r"^line 2: in: give either in or at, not both$"),
    ],
)
def test_jsonl_fields_follow_the_flags_rules(rs: Rsched, line: str, message: str) -> None:
    lines = ['{"type": "j.t", "id": "ok"}', '{"type": "j.t", "id": "bad", ' + line + "}"]
    with pytest.raises(BadInput, match=message):
        bulk.add_lines(rs, lines)
    assert rs.redis.exists(rs.keys.queue("default").tasks) == 0  # nothing of the batch


def test_jsonl_id_and_type_are_strings(rs: Rsched) -> None:
    with pytest.raises(
        BadInput, match=r'^line 1: id: 5 is a JSON number; task IDs are strings .*write "5"'
    ):
        specs.spec_from_line('{"type": "j.t", "id": 5}', 1)
    with pytest.raises(BadInput, match=r"^line 1: id: 1.5 is a JSON number; task IDs are strings"):
        specs.spec_from_line('{"type": "j.t", "id": 1.5}', 1)
    with pytest.raises(
        BadInput, match=r"^line 1: type: 7 is a JSON number; a task type is a string"
    ):
        specs.spec_from_line('{"type": 7, "id": "x"}', 1)


def test_jsonl_strings_and_integer_max_attempts_are_accepted(rs: Rsched) -> None:
    spec = specs.spec_from_line('{"type": "j.t", "id": "1", "in": "1h30m", "max_attempts": "3"}', 1)
    assert spec.delay_ms == 5_400_000 and spec.max_attempts == 3
    spec = specs.spec_from_line(
        '{"type": "j.t", "id": "2", "at": "2026-12-01T02:00+08:00", "max_attempts": 4}', 1
    )
    assert spec.at_ms == 1_796_061_600_000 and spec.max_attempts == 4
    # The library keeps its integer milliseconds: only the JSON-lines parser is strict.
    assert tasks.make_spec("j.t", "3", delay=1800).delay_ms == 1800
    assert tasks.make_spec("j.t", "4", at=1_796_040_000_000).at_ms == 1_796_040_000_000


def test_flag_names_in_the_either_or_message() -> None:
    with pytest.raises(BadInput, match=r"^--in: give either --in or --at, not both$"):
        tasks.make_spec("j.t", "1", delay="1h", at="2026-12-01T02:00Z")


def test_add_from_cli_counts(cli: Cli) -> None:
    lines = "\n".join(
        json.dumps({"type": "f.t", "id": str(i % 7), "payload": {"i": i}}) for i in range(20)
    )
    assert cli.json("add", "--from", "-", input=lines) == {"added": 7, "kept": 13, "replaced": 0}


# ----------------------------------------------------------------- add --from across an outage


def _lines(start: int, end: int) -> str:
    return "".join(
        json.dumps({"type": "o.t", "id": str(i), "in": "1h"}) + "\n" for i in range(start, end)
    )


def test_add_from_rides_out_a_redis_restart(own_server: RedisServer, tmp_path: Path) -> None:
    """`add --from` fed through a pipe: Redis is kill -9'd between batches and
    restarted from its AOF while the next batch is being written. The command
    retries that batch, exits 0 and every line is in Redis once."""
    cli = Cli(own_server, "bulk-outage", cwd=str(tmp_path))
    err = tmp_path / "add.err"
    with open(err, "w") as fh:
        p = cli.spawn("add", "--from", "-", "--retry-for", "60s", stdin=subprocess.PIPE, stderr=fh)
    assert p.stdin is not None
    r = own_server.client()
    q = "bulk-outage:{q:default}:tasks"
    try:
        p.stdin.write(_lines(0, 25_000))
        p.stdin.flush()
        wait_for(lambda: r.hlen(q) == 20_000, timeout=60, what="two batches written")
        own_server.kill()

        def rest() -> None:  # blocks while rsched retries (it reads no more until then)
            assert p.stdin is not None
            p.stdin.write(_lines(25_000, 60_000))
            p.stdin.close()

        feeder = threading.Thread(target=rest, daemon=True)
        feeder.start()
        wait_for(lambda: "writing the batch again" in err.read_text(), timeout=60, what="a retry")
        own_server.start()
        r.close()
        r = own_server.client()
        feeder.join(timeout=60)
        assert p.wait(timeout=120) == 0, err.read_text()
        out = p.stdout.read() if p.stdout else ""
    finally:
        cli.close()
    added, kept = (int(x) for x in re.findall(r"added (\d+), kept (\d+)", out)[0])
    assert added + kept == 60_000 and added >= 40_000, out
    assert r.hlen(q) == 60_000
    assert r.zcard("bulk-outage:{q:default}:sched") == 60_000
    r.close()


def test_add_from_without_retry_says_what_was_written(
    own_server: RedisServer, tmp_path: Path
) -> None:
    cli = Cli(own_server, "bulk-outage0", cwd=str(tmp_path))
    p = cli.spawn("add", "--from", "-", "--retry-for", "0", stdin=subprocess.PIPE)
    assert p.stdin is not None
    r = own_server.client()
    try:
        p.stdin.write(_lines(0, 25_000))
        p.stdin.flush()
        # The second batch is sent only once the first was acknowledged.
        wait_for(
            lambda: r.hlen("bulk-outage0:{q:default}:tasks") == 20_000, timeout=60, what="batches"
        )
        own_server.kill()
        try:
            p.stdin.write(_lines(25_000, 40_000))
            p.stdin.close()
        except BrokenPipeError:  # it may have given up before reading all of it
            pass
        assert p.wait(timeout=60) == 69
        err = p.stderr.read() if p.stderr else ""
    finally:
        cli.close()
        r.close()
    assert re.search(r"wrote (10000|20000) of the first \d+ tasks \(lines 1-\d+", err), err
    assert len(err.strip().splitlines()) == 1, err


def test_add_from_tz_applies_to_at_without_offset(cli: Cli) -> None:
    line = json.dumps({"type": "z.t", "id": "1", "at": "2030-01-01T10:00"}) + "\n"
    r = cli("add", "--from", "-", input=line, check=2)
    assert "--tz" in r.stderr and "line 1" in r.stderr
    cli("add", "--from", "-", "--tz", "Asia/Shanghai", input=line, check=0)
    shown = cli.json("show", "z.t", "1")
    assert (shown[0] if isinstance(shown, list) else shown)["due_at"] == "2030-01-01T02:00:00.000Z"
