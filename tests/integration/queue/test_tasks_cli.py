"""The queue commands, run as real `rsched` processes against a real server."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from rsched.api import Rsched
from rsched.lua import calls
from tests.support import Cli, RedisServer, wait_for


def ns_keys(server: RedisServer, ns: str) -> list[str]:
    return sorted(server.client().scan_iter(f"{ns}:*", count=1000))


def server_ms(server: RedisServer) -> int:
    s, us = server.client().time()
    return int(s) * 1000 + int(us) // 1000


def claim(rs: Rsched, queue: str = "default", n: int = 10, lease_ms: int = 60_000) -> list[object]:
    q = rs.keys.queue(queue)
    out = rs.scripts(
        "claim-18",
        [
            q.sched,
            q.proc,
            q.dead,
            q.tasks,
            q.wake,
            q.seq,
            q.paused,
            q.consumers,
            q.history,
            q.lanes,
            q.handles,
            q.prio,
            q.ready,
            q.rate,
            q.ratelimit,
            q.events,
            q.waiting,
            q.children,
        ],
        [n, lease_ms, "test-consumer", 15_000, 100, 1000, queue, 5],
    )
    return out[6:]


@pytest.mark.valkey
def test_add_in_30m_is_due_30_minutes_after_the_server_clock(cli: Cli, server: RedisServer) -> None:
    before = server_ms(server)
    cli("add", "--in", "30m", "order.close", "1001", check=0)
    after = server_ms(server)
    [task] = cli.json("list")
    assert task["type"] == "order.close" and task["id"] == "1001" and task["queue"] == "default"
    assert task["state"] == "scheduled" and task["attempts"] == 0
    assert before + 1_800_000 <= task["due_ms"] <= after + 1_800_000
    assert task["due_at"].endswith("Z") and len(task["due_at"]) == len("2026-11-30T05:00:00.000Z")
    assert set(task) == {
        "type",
        "id",
        "queue",
        "state",
        "due_at",
        "due_ms",
        "attempts",
        "max_attempts",
        "payload",
        "last_error",
        "priority",
        "progress",
        "waiting_for",
    }


def test_add_at_time_with_offset_and_tz(cli: Cli) -> None:
    out = cli.json("add", "--at", "2030-12-01T02:00+08:00", "report.send", "r1")
    assert out["due_at"] == "2030-11-30T18:00:00.000Z" and out["status"] == "added"
    out = cli.json("add", "--at", "2030-12-01T02:00", "--tz", "Asia/Shanghai", "report.send", "r2")
    assert out["due_at"] == "2030-11-30T18:00:00.000Z"


@pytest.mark.valkey
def test_if_exists_keep_replace_error(cli: Cli) -> None:
    first = cli.json("add", "--in", "1h", "--payload", '{"v":1}', "t", "1")
    kept = cli("add", "--in", "2h", "--payload", '{"v":2}', "t", "1", "--json", check=0)
    assert json.loads(kept.stdout)["status"] == "kept"
    assert json.loads(kept.stdout)["due_ms"] == first["due_ms"]
    assert cli.json("show", "t", "1")["payload"] == {"v": 1}
    replaced = cli.json(
        "add", "--in", "2h", "--payload", '{"v":2}', "--if-exists", "replace", "t", "1"
    )
    assert replaced["status"] == "replaced" and replaced["due_ms"] > first["due_ms"] + 3_000_000
    assert cli.json("show", "t", "1")["payload"] == {"v": 2}
    res = cli("add", "--if-exists", "error", "t", "1")
    assert res.returncode == 4 and "already exists" in res.stderr
    assert cli.json("show", "t", "1")["payload"] == {"v": 2}


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["add", "bad type", "1"], "TYPE"),
        (["add", "t", "has space"], "ID"),
        (["add", "t", "x" * 257], "ID"),
        (["add", "--queue", "no/slash", "t", "1"], "--queue"),
        (["add", "--in", "5x", "t", "1"], "--in"),
        (["add", "--in", "0s", "t", "1"], "--in"),
        (["add", "--in", "-5m", "t", "1"], "--in"),
        (["add", "--at", "2026-12-01T02:00", "t", "1"], "--at"),
        (["add", "--at", "tomorrow", "t", "1"], "--at"),
        (["add", "--at", "2026-12-01T02:00", "--tz", "Mars/Olympus", "t", "1"], "--tz"),
        (["add", "--in", "1m", "--at", "2030-01-01T00:00Z", "t", "1"], "--in"),
        (["add", "--payload", "{not json", "t", "1"], "--payload"),
        (["add", "--max-attempts", "0", "t", "1"], "--max-attempts"),
        (["add", "--max-attempts", "many", "t", "1"], "--max-attempts"),
        (["list", "--queue", "a b"], "--queue"),
        (["cancel", "t", "a b"], "ID"),
        (["purge", "--dead", "--older-than", "soon"], "--older-than"),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_writes_nothing(
    cli: Cli, server: RedisServer, args: list[str], field: str
) -> None:
    res = cli(*args)
    assert res.returncode == 2, res
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and field in lines[0], res.stderr
    assert ns_keys(server, cli.namespace) == []


def test_oversized_and_non_utf8_payload_files(
    cli: Cli, server: RedisServer, tmp_path: os.PathLike[str]
) -> None:
    big = os.path.join(tmp_path, "big.json")
    with open(big, "w") as fh:
        fh.write(json.dumps({"blob": "x" * 1_100_000}))
    res = cli("add", "--payload-file", big, "t", "1")
    assert res.returncode == 2 and "--payload-file" in res.stderr and "1048576" in res.stderr
    bad = os.path.join(tmp_path, "bad.json")
    with open(bad, "wb") as fh:
        fh.write(b'{"name": "\xff\xfe"}')
    res = cli("add", "--payload-file", bad, "t", "1")
    assert res.returncode == 2 and "UTF-8" in res.stderr
    assert ns_keys(server, cli.namespace) == []


@pytest.mark.valkey
def test_wrong_key_type_in_namespace_is_a_config_error_and_writes_nothing(
    cli: Cli, server: RedisServer
) -> None:
    r = server.client()
    r.set(f"{cli.namespace}:{{q:default}}:sched", "not a zset")
    before = ns_keys(server, cli.namespace)
    res = cli("add", "t", "1")
    assert res.returncode == 78 and "namespace" in res.stderr, res
    key = f"{cli.namespace}:{{q:default}}:sched"
    assert f"key {key!r} holds a string, not a zset" in res.stderr, res.stderr  # names it
    assert ns_keys(server, cli.namespace) == before
    assert r.get(f"{cli.namespace}:{{q:default}}:sched") == "not a zset"


@pytest.mark.valkey
def test_add_from_jsonl_and_a_bad_line_writes_nothing(cli: Cli, server: RedisServer) -> None:
    lines = "\n".join(
        json.dumps({"type": "t", "id": str(i), "in": "1h", "payload": {"n": i}}) for i in range(50)
    )
    bad = lines + '\n{"type": "t", "id": "x", "in": "soon"}\n'
    res = cli("add", "--from", "-", input=bad)
    assert res.returncode == 2 and "line 51" in res.stderr and "in" in res.stderr
    assert ns_keys(server, cli.namespace) == []
    res = cli(
        "add",
        "--from",
        "-",
        "--json",
        input=lines + "\n" + '{"type":"u","id":"1","queue":"other","max_attempts":2}\n',
    )
    assert res.returncode == 0 and json.loads(res.stdout) == {"added": 51, "kept": 0, "replaced": 0}
    assert len(cli.json("list", "--limit", "1000")) == 50
    [other] = cli.json("list", "--queue", "other")
    assert other["max_attempts"] == 2 and other["state"] == "due"
    res = cli("add", "--from", "-", input='{"type":"t","id":"1","colour":"red"}\n')
    assert res.returncode == 2 and "colour" in res.stderr


def test_add_from_refuses_numbers_for_in_at_and_id(cli: Cli, server: RedisServer) -> None:
    ok = '{"type": "a.b", "id": "fine", "in": "30m"}\n'
    for line, field in [
        ('{"type":"a.b","id":"x","at":1796040000}', "at"),  # was: due in 1970, run at once
        ('{"type":"a.b","id":"x","in":1800}', "in"),  # was: 1.8 s
        ('{"type":"a.b","id":5}', "id"),
        ('{"type":"a.b","id":"x","max_attempts":"three"}', "max_attempts"),
    ]:
        res = cli("add", "--from", "-", input=ok + line + "\n")
        assert res.returncode == 2, res.stderr
        [msg] = res.stderr.splitlines()
        assert msg.startswith(f"rsched: error: line 2: {field}: "), msg
        assert msg.count("line 2") == 1
        assert ns_keys(server, cli.namespace) == []
    res = cli(
        "add", "--from", "-", input='{"type":"a.b","id":"x","in":"1h","at":"2026-12-01T02:00Z"}'
    )
    assert res.returncode == 2
    assert res.stderr == "rsched: error: line 1: in: give either in or at, not both\n"
    res = cli("add", "--from", "-", "--json", input=ok + '{"type":"a.b","id":"y","max_attempts":2}')
    assert json.loads(res.stdout) == {"added": 2, "kept": 0, "replaced": 0}, res.stderr


@pytest.mark.parametrize(
    ("args", "note"),
    [
        (["locks"], "no locks held"),
        (["list"], "no tasks in queue default"),
        (["list", "--state", "dead"], "no tasks in queue default in state dead"),
        (["queues"], "no queues yet"),
        (["dead"], "no dead tasks"),
        (["crons"], "no crons registered"),
        (["history"], "no records"),
    ],
)
def test_quiet_silences_the_nothing_to_show_notes(cli: Cli, args: list[str], note: str) -> None:
    res = cli(*args, check=0)
    assert res.stdout == "" and res.stderr == note + "\n"
    res = cli("-q", *args, check=0)
    assert res.stdout == "" and res.stderr == ""  # -q: "Only errors on stderr."
    assert cli("-q", *args, "--json", check=0).stdout == "[]\n"


def test_pause_and_resume_json(cli: Cli, rs: Rsched) -> None:
    res = cli(
        "pause", "zz", "--create", "--json", check=0
    )  # --json after the command, as scripts write it
    assert json.loads(res.stdout) == {"name": "zz", "paused": True, "known": False}
    assert res.stderr == ""
    assert json.loads(cli("--json", "resume", "zz", check=0).stdout) == {
        "name": "zz",
        "paused": False,
        "was_paused": True,
    }
    res = cli("resume", "zz", "--format", "json", check=0)
    assert json.loads(res.stdout)["was_paused"] is False
    assert json.loads(cli("pause", "--queue", "mail", "--create", "--json", check=0).stdout) == {
        "queue": "mail",
        "paused": True,
        "known": False,
    }
    assert rs.redis.exists(rs.keys.queue("mail").paused)
    assert json.loads(cli("pause", "--queue", "mail", "--json", check=0).stdout)["known"] is True
    assert json.loads(cli("resume", "--queue", "mail", "--json", check=0).stdout) == {
        "queue": "mail",
        "paused": False,
        "was_paused": True,
    }
    assert not rs.redis.exists(rs.keys.queue("mail").paused)
    res = cli("resume", "--queue", "mail", check=0)  # text: a note on stderr, -q silences it
    assert res.stdout == "" and res.stderr == 'queue "mail" was not paused\n'
    assert cli("-q", "resume", "--queue", "mail", check=0).stderr == ""


#: Commands whose own options are not --format/--json yet (their output is a child's
#: or a loop's log, or a server's (`web`); `--log-format json` is theirs). Everything else takes both.
NO_OUTPUT_OPTIONS = {"exec", "run consumer", "run cron", "run expired", "run worker", "web"}


def test_every_command_takes_format_and_json_after_it() -> None:
    import click

    from rsched.cli.main import cli as group

    def walk(cmd: click.Command, path: list[str]) -> list[tuple[str, click.Command]]:
        if isinstance(cmd, click.Group):
            ctx = click.Context(cmd)
            out = [(" ".join(path), cmd)] if path and cmd.invoke_without_command else []
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None
                out += walk(sub, [*path, name])
            return out
        return [(" ".join(path), cmd)]

    missing = []
    for name, cmd in walk(group, []):
        opts = {o for p in cmd.params for o in getattr(p, "opts", [])}
        if not {"--json", "--format"} <= opts and name not in NO_OUTPUT_OPTIONS:
            missing.append(name)
    assert missing == []


def test_cancel_and_show_absent_exit_3(cli: Cli) -> None:
    assert cli("cancel", "t", "404").returncode == 3
    assert cli("show", "t", "404").returncode == 3
    cli("add", "t", "1", "--in", "1m", check=0)
    res = cli("cancel", "t", "1", "--json", check=0)
    assert json.loads(res.stdout)["was"] == "scheduled"
    assert cli("show", "t", "1").returncode == 3


def test_list_is_soonest_first_paged_and_filtered(cli: Cli, rs: Rsched) -> None:
    specs = [rs.add(f"t{i % 2}", str(i), delay=f"{1000 - i}s") for i in range(300)]
    assert len(specs) == 300
    rows = cli.json("list", "--limit", "10")
    assert [r["id"] for r in rows] == [str(i) for i in range(299, 289, -1)]
    rows = cli.json("list", "--type", "t1", "--limit", "5")
    assert all(r["type"] == "t1" for r in rows) and len(rows) == 5
    rs.add("now", "1")
    assert [r["id"] for r in cli.json("list", "--state", "due")] == ["1"]
    assert len(cli.json("list", "--state", "scheduled", "--limit", "1000")) == 300


def test_queues_counts(cli: Cli, rs: Rsched) -> None:
    rs.add("t", "due1")
    rs.add("t", "due2")
    rs.add("t", "later", delay="1h")
    claim(rs, n=1)
    rs.add("t", "x", queue="q2")
    rows = {r["queue"]: r for r in cli.json("queues")}
    d = rows["default"]
    assert (d["scheduled"], d["due"], d["processing"], d["stale"], d["dead"]) == (1, 1, 1, 0, 0)
    assert d["consumers"] == 1 and d["next_due_at"].endswith("Z") and d["lag_ms"] >= 0
    assert rows["q2"]["due"] == 1
    assert cli("queues", check=0).stdout.startswith("QUEUE")


@pytest.mark.valkey
def test_requeue_stale_brings_back_an_expired_lease_and_dead_letters_the_last_attempt(
    cli: Cli, rs: Rsched, server: RedisServer
) -> None:
    rs.add("job", "a")
    rs.add("job", "b", max_attempts=1)
    claimed = claim(rs, n=10, lease_ms=200)
    assert len(claimed) == 14
    q = rs.keys.queue("default")
    wait_for(
        lambda: rs.redis.zcount(q.proc, "-inf", server_ms(server)) == 2,
        timeout=5,
        what="leases to expire",
    )
    assert cli.json("requeue-stale", "--dry-run") == {"requeued": 1, "dead": 1}
    assert rs.redis.zcard(q.proc) == 2
    assert cli.json("requeue-stale") == {"requeued": 1, "dead": 1}
    a = cli.json("show", "job", "a")
    assert a["state"] == "due" and a["attempts"] == 1 and "lease expired" in a["last_error"]
    [b] = cli.json("dead")
    assert b["id"] == "b" and "lease expired" in b["last_error"]
    # A stale ack of the old claim is refused: the token was cleared.
    token_a = claimed[4]
    assert rs.scripts("ack-9", calls.ack_keys(q), [100, "job a", token_a, ""]) == [0]
    assert cli.json("retry", "job", "b") == {"retried": 1}
    assert cli.json("show", "job", "b")["state"] == "due"
    assert cli("retry", "job", "b").returncode == 4
    assert cli.json("requeue-stale") == {"requeued": 0, "dead": 0}


def test_dead_retry_all_and_purge(cli: Cli, rs: Rsched, server: RedisServer) -> None:
    for i in range(3):
        rs.add("job", str(i), max_attempts=1)
    claim(rs, n=10, lease_ms=50)
    q = rs.keys.queue("default")
    wait_for(
        lambda: rs.redis.zcount(q.proc, "-inf", server_ms(server)) == 3,
        timeout=5,
        what="leases to expire",
    )
    cli.json("requeue-stale")
    assert len(cli.json("dead")) == 3
    assert cli.json("purge", "--dead", "--older-than", "1h") == {"purged": 0}
    assert cli.json("retry", "--all") == {"retried": 3}
    claim(rs, n=10, lease_ms=50)
    wait_for(
        lambda: rs.redis.zcount(q.proc, "-inf", server_ms(server)) == 3,
        timeout=5,
        what="leases to expire",
    )
    cli.json("requeue-stale")
    assert cli.json("purge", "--dead") == {"purged": 3}
    assert cli.json("dead") == [] and rs.redis.hlen(q.tasks) == 0
    assert cli("purge").returncode == 2


def test_redis_unreachable_exits_69_within_the_connect_timeout(cli: Cli) -> None:
    from tests.support import free_port

    t0 = time.monotonic()
    res = cli("list", env={"RSCHED_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"})
    assert res.returncode == 69 and res.stderr.count("\n") == 1 and "cannot use Redis" in res.stderr
    assert time.monotonic() - t0 < 10


def test_auth_refused_exits_69_and_never_prints_the_password(tmp_path: os.PathLike[str]) -> None:
    srv = RedisServer(password="s3cret-pw").start()
    try:
        c = Cli(srv, "authns", cwd=str(tmp_path))
        assert c("add", "t", "1").returncode == 0
        res = c("list", env={"RSCHED_REDIS_PASSWORD": "wrong-pw"})
        assert res.returncode == 69 and "wrong-pw" not in res.stderr + res.stdout
        assert "refused this user and password" in res.stderr, res.stderr
        for cmd in (("list",), ("add", "t", "2")):  # redis-py and the lean client alike
            res = c(*cmd, env={"RSCHED_REDIS_PASSWORD": ""})
            assert res.returncode == 69 and "requires a password" in res.stderr, res.stderr
            assert "RSCHED_REDIS_PASSWORD" in res.stderr
        url = f"redis://user:hunter2@127.0.0.1:{srv.port}/0"
        res = c("--redis-url", url, "list", env={"RSCHED_REDIS_PASSWORD": ""})
        assert (
            res.returncode == 69
            and "hunter2" not in res.stderr + res.stdout
            and "***" in res.stderr
        )
    finally:
        srv.stop()


def test_config_file_supplies_url_and_namespace_and_rejects_bad_options(
    server: RedisServer, tmp_path: os.PathLike[str]
) -> None:
    c = Cli(server, "unused", cwd=str(tmp_path))
    cfg = os.path.join(tmp_path, "rsched.toml")
    with open(cfg, "w") as fh:
        fh.write(f'[redis]\nurl = "{server.url}"\nnamespace = "fromcfg"\n')
    env = {"RSCHED_REDIS_URL": "", "RSCHED_NAMESPACE": ""}
    assert c("add", "t", "1", env=env).returncode == 0
    assert server.client().exists("fromcfg:{q:default}:tasks")
    with open(cfg, "w") as fh:
        fh.write('[queues.default]\nleese = "1m"\n')
    res = c("list", env=env)
    assert res.returncode == 78 and "leese" in res.stderr
    with open(cfg, "w") as fh:
        fh.write('[redis]\nurl = "redis://u:pw@localhost:6379/0"\n')
    res = c("list", env=env)
    assert res.returncode == 78 and "password_file" in res.stderr and "pw@" not in res.stderr
    res = c("--config", os.path.join(tmp_path, "missing.toml"), "list")
    assert res.returncode == 78


def test_unix_socket_url(tmp_path: os.PathLike[str]) -> None:
    srv = RedisServer(unix=True).start()
    try:
        c = Cli(srv, "unixns", cwd=str(tmp_path))
        c("add", "t", "1", check=0)
        assert [r["id"] for r in c.json("list")] == ["1"]
    finally:
        srv.stop()


def test_format_options_before_and_after_the_command(cli: Cli) -> None:
    cli("add", "t", "1", check=0)
    a = cli("--json", "list", check=0).stdout
    b = cli("list", "--format", "json", check=0).stdout
    assert json.loads(a) == json.loads(b)
    plain = cli("list", "--format", "plain", check=0).stdout
    assert plain.split("\t")[:2] == ["t", "1"]


def test_pipe_closed_early_is_not_an_error(cli: Cli, rs: Rsched) -> None:
    import subprocess

    rs.add_many(
        [
            __import__("rsched.queue.ops", fromlist=["make_spec"]).make_spec("t", str(i))
            for i in range(2000)
        ]
    )
    p = subprocess.run(
        f"{' '.join(['python', '-m', 'rsched'])} list --limit 2000 | head -1",
        shell=True,
        capture_output=True,
        text=True,
        env=cli.env(),
        cwd=cli.cwd,
    )
    assert "Traceback" not in p.stderr


# ------------------------------------------------------------------ terminal escapes

#: What a hostile handler writes to its stderr: an OSC that retitles the terminal, a
#: CSI (ESC form and the one-byte C1 form) that would clear the screen, a bidi override.
EVIL = "\x1b]0;pwned\x07 \x1b[2J \x9b2J \u202eoops"


def _clean(text: str) -> None:
    for bad in ("\x1b", "\x07", "\x9b", "\u202e"):
        assert bad not in text, f"{bad!r} printed raw in {text!r}"


def test_stored_terminal_escapes_are_escaped_in_every_human_view_and_raw_in_json(
    cli: Cli, rs: Rsched, server: RedisServer, tmp_path: os.PathLike[str]
) -> None:
    # A real handler writes the escapes to stderr and fails: its stderr tail becomes
    # the task's last error and the history record's error.
    handler = os.path.join(str(tmp_path), "evil.py")
    with open(handler, "w") as fh:
        fh.write(f"import sys\nsys.stderr.write({EVIL!r} + '\\n')\nsys.exit(3)\n")
    os.chmod(handler, 0o755)
    cli("add", "evil.job", "e1", "--max-attempts", "1",
        "--payload", json.dumps({"note": "\x9b31m\x7f"}), check=0)  # fmt: skip
    cli("run", "consumer", "--handler", f"evil.job={sys.executable} {handler}", "--burst",
        check=0)  # fmt: skip
    assert cli.json("show", "evil.job", "e1")["state"] == "dead"
    # Redis also holds a lock, a cron name and hosts that someone wrote with escapes.
    r = server.client()
    lk = rs.keys.lock("held")
    r.hset(lk.lock, mapping={"host": "h\x1b]0;lock\x07", "pid": "1", "token": "7", "since": "1"})
    r.pexpire(lk.lock, 60_000)
    r.sadd(rs.keys.crons, "c\x1b[2Jron")
    r.hset(rs.keys.cron("c\x1b[2Jron").state, mapping={"last_host": "h\x1b]0;cron\x07",
           "last_result": "ok\x1b[5m", "last_run_fire": "1"})  # fmt: skip

    views = [
        ["show", "evil.job", "e1"],
        ["dead"],
        ["list", "--state", "dead"],
        ["history"],
        ["history", "--queue", "default"],
        ["locks"],
        ["crons"],
        ["queues"],
        ["top", "--once"],
    ]
    for view in views:
        for fmt in (["--format", "table"], ["--format", "plain"]):
            if view[0] == "top" and fmt[1] == "plain":
                continue
            out = cli(*view, *fmt, check=0).stdout
            _clean(out)
            if view[0] in ("show", "dead", "list", "history"):
                assert "\\x1b]0;pwned\\x07" in out, (view, fmt, out)
            if view[0] == "show":
                assert "\\x9b31m\\x7f" in out  # the payload preview
                assert "\\u202eoops" in out
            if view[0] == "locks":
                assert "h\\x1b]0;lock\\x07" in out
            if view[0] == "crons":
                assert "c\\x1b[2Jron" in out and "h\\x1b]0;cron\\x07" in out

    # --json keeps the text as stored.
    assert EVIL in cli.json("show", "evil.job", "e1")["last_error"]
    assert cli.json("show", "evil.job", "e1")["payload"] == {"note": "\x9b31m\x7f"}
    assert any(EVIL in (h.get("error") or "") for h in cli.json("history"))
    assert [lock["host"] for lock in cli.json("locks")] == ["h\x1b]0;lock\x07"]
    assert "c\x1b[2Jron" in [c["name"] for c in cli.json("crons")]


def test_list_due_is_soonest_first_with_parked_tasks(cli: Cli, rs: Rsched) -> None:
    """A due task a consumer could not run is parked in its type's lane (a score
    below every real due time): `list` still orders due tasks by their due time."""
    now = rs.now_ms()
    iso = lambda ms: time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + "Z"  # noqa: E731
    cli("add", "--at", iso(now - 5_000), "a.x", "1")
    cli("run", "consumer", "--handler", "b.y=true", "--burst")  # parks a.x
    assert rs.redis.hlen(rs.keys.queue("default").lanes) >= 1
    cli("add", "--at", iso(now - 20_000), "c.z", "1")  # unparked, and older
    cli("add", "--at", iso(now - 1_000), "c.z", "2")  # unparked, newer
    got = [(t["type"], t["id"]) for t in cli.json("list", "--state", "due")]
    assert got == [("c.z", "1"), ("a.x", "1"), ("c.z", "2")], got
    assert [t["id"] for t in cli.json("list", "--state", "due", "--limit", "1")] == ["1"]
    assert [t["type"] for t in cli.json("list", "--state", "due", "--type", "a.x")] == ["a.x"]
