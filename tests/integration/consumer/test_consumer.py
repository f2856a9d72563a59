"""`rsched run consumer` against real servers and real processes.

Every concurrency claim runs several consumer processes; every wait is a
deadline on a condition, never a sleep.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rsched.api import Rsched
from rsched.core.timeutil import iso
from rsched.lua import calls
from rsched.queue.ops import make_spec
from tests.support import Cli, RedisServer, wait_for

# ----------------------------------------------------------------------------- helpers


def script(tmp_path: Path, name: str, body: str, shell: str = "/bin/sh") -> Path:
    p = tmp_path / name
    p.write_text(f"#!{shell}\n" + textwrap.dedent(body).lstrip())
    p.chmod(0o755)
    return p


def start(
    cli: Cli, tmp_path: Path, *args: str, name: str = "c", env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], Path]:
    """A long-running consumer with -v; its stderr goes to a file we can read while it runs."""
    err_path = tmp_path / f"{name}.err"
    err = open(err_path, "w")  # noqa: SIM115 - the child owns it; closed when the test ends
    p = cli.spawn("-v", "run", "consumer", *args, env=env, stdout=subprocess.DEVNULL, stderr=err)
    err.close()
    return p, err_path


def history(rs: Rsched, queue: str = "default") -> list[dict[str, Any]]:
    return [json.loads(f["j"]) for _, f in rs.redis.xrange(rs.keys.queue(queue).history)]


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def gone(rs: Rsched, task_type: str, task_id: str, queue: str = "default") -> bool:
    return not rs.redis.hexists(rs.keys.queue(queue).tasks, f"{task_type} {task_id}")


def state(rs: Rsched, task_type: str, task_id: str, queue: str = "default") -> str | None:
    try:
        return rs.show(task_type, task_id, queue).state
    except Exception:  # noqa: BLE001
        return None


def stop(p: subprocess.Popen[str], timeout: float = 15) -> int:
    p.send_signal(signal.SIGTERM)
    return p.wait(timeout=timeout)


def add_many(rs: Rsched, task_type: str, ids: list[str], **kw: Any) -> None:
    rs.add_many([make_spec(task_type, i, **kw) for i in ids])


# ----------------------------------------------------------------------------- handlers


RECORDER = """
import json, os, sys
out = os.path.join(os.environ["OUT_DIR"], os.environ["RSCHED_TASK_ID"] + ".json")
env = {k: v for k, v in os.environ.items() if k.startswith("RSCHED_")}
with open(out, "w") as fh:
    json.dump({"argv": sys.argv[1:], "env": env, "stdin": sys.stdin.read()}, fh)
"""


@pytest.mark.valkey
def test_command_handler_gets_id_last_env_and_payload_on_stdin(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    rec = script(tmp_path, "rec.py", RECORDER, shell=sys.executable)
    payload = {"order": 1001, "note": "naïve ✓", "items": [1, 2]}
    add = cli.json("add", "order.close", "1001", "--payload", json.dumps(payload))
    due_ms = add[0]["due_ms"] if isinstance(add, list) else add["due_ms"]
    res = cli("run", "consumer", "--handler", f"order.close={rec} --flag 'two words'", "--burst",
              env={"OUT_DIR": str(tmp_path)}, check=0)  # fmt: skip
    got = json.loads((tmp_path / "1001.json").read_text())
    assert got["argv"] == ["--flag", "two words", "1001"], res.stderr
    env = got["env"]
    assert env["RSCHED_QUEUE"] == "default"
    assert env["RSCHED_TASK_TYPE"] == "order.close"
    assert env["RSCHED_TASK_ID"] == "1001"
    assert env["RSCHED_ATTEMPT"] == "1"
    assert env["RSCHED_DUE_AT"] == iso(due_ms)
    assert env["RSCHED_CLAIM_TOKEN"]
    assert "RSCHED_REDIS_URL" in os.environ or True  # the consumer's own env is inherited
    assert json.loads(got["stdin"]) == payload
    assert gone(rs, "order.close", "1001")
    (rec_h,) = history(rs)
    assert rec_h["result"] == "ok" and rec_h["token"] == env["RSCHED_CLAIM_TOKEN"]
    assert rec_h["started_ms"] >= rec_h["fire_ms"] == due_ms
    assert rec_h["kind"] == "task" and rec_h["exit_code"] == 0 and rec_h["attempt"] == 1


HMOD = """
import json, os

HERE = os.path.dirname(os.path.abspath(__file__))


def record(task):
    with open(os.path.join(HERE, "calls.jsonl"), "a") as fh:
        fh.write(json.dumps({"type": task.type, "id": task.id, "queue": task.queue,
                             "payload": task.payload, "attempt": task.attempt,
                             "max_attempts": task.max_attempts, "due_ms": task.due_ms,
                             "token": task.token}) + "\\n")


def boom(task):
    raise ValueError("nope " + task.id)
"""


def test_python_callable_handlers_from_flag_and_config(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    (tmp_path / "hmod.py").write_text(textwrap.dedent(HMOD))
    (tmp_path / "rsched.toml").write_text('[handlers]\n"cfg.*" = "python:hmod:record"\n')
    cli("add", "flag.t", "a1", "--payload", '{"k": [1]}', check=0)
    cli("add", "cfg.x", "b1", "--max-attempts", "2", check=0)
    cli("add", "bad.t", "c1", "--max-attempts", "1", check=0)
    res = cli(
        "run",
        "consumer",
        "--call",
        "flag.t=hmod:record",
        "--call",
        "bad.t=hmod:boom",
        "--burst",
        check=0,
    )
    calls = sorted((json.loads(x) for x in lines(tmp_path / "calls.jsonl")), key=lambda c: c["id"])
    assert [c["id"] for c in calls] == ["a1", "b1"], res.stderr
    assert (
        calls[0]["payload"] == {"k": [1]}
        and calls[0]["type"] == "flag.t"
        and calls[0]["attempt"] == 1
    )
    assert calls[1]["max_attempts"] == 2 and calls[1]["queue"] == "default" and calls[1]["token"]
    dead = rs.show("bad.t", "c1")
    assert dead.state == "dead" and "ValueError: nope c1" in (dead.last_error or "")


def test_library_consumer_with_python_callable(rs: Rsched) -> None:
    seen: list[tuple[str, int]] = []
    add_many(rs, "lib.t", [str(i) for i in range(300)], payload={"n": 1})
    stats = rs.consumer(handlers={"lib.t": lambda t: seen.append((t.id, t.payload["n"]))}, burst=True,
                        quiet=True).run()  # fmt: skip
    assert sorted(seen) == sorted((str(i), 1) for i in range(300))
    assert stats.ok == 300 and stats.failed == 0
    assert rs.redis.hget(rs.keys.queue("default").stats, "ok|lib.t") == "300"


def test_failure_retries_with_backoff_then_dead_with_exit_status_and_stderr(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    h = script(tmp_path, "fail.sh", """
        echo "boom on attempt $RSCHED_ATTEMPT" >&2
        exit 3
    """)  # fmt: skip
    cli("add", "job.f", "f1", "--max-attempts", "3", check=0)
    p, err = start(
        cli, tmp_path, "--handler", f"job.f={h}", "--backoff", "50ms", "--backoff-max", "100ms"
    )
    wait_for(lambda: state(rs, "job.f", "f1") == "dead", timeout=20, what="task dead")
    assert stop(p) == 0
    t = rs.show("job.f", "f1")
    assert t.attempts == 3
    assert "exit status 3" in (t.last_error or "") and "boom on attempt 3" in (t.last_error or "")
    recs = history(rs)
    assert [(r["result"], r["attempt"], r["exit_code"]) for r in recs] == [
        ("failed", a, 3) for a in (1, 2, 3)
    ]
    for prev, nxt in zip(recs, recs[1:], strict=False):
        # the retry became due after a jittered backoff within the cap
        assert 0 <= nxt["fire_ms"] - prev["finished_ms"] <= 100 + 50
        assert nxt["started_ms"] >= nxt["fire_ms"]
    assert "boom on attempt 1" in recs[0]["error"]
    assert "dead job.f f1" in err.read_text()


def test_no_handler_leaves_the_task_due_not_dead(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    """It was "a failure, then dead" ("no handler for nope" after max attempts)."""
    cli("add", "nope", "n1", "--max-attempts", "2", check=0)
    cli("add", "other", "o1", check=0)
    p, _ = start(
        cli, tmp_path, "--handler", "other=true", "--backoff", "10ms", "--backoff-max", "20ms"
    )
    wait_for(lambda: gone(rs, "other", "o1"), timeout=20, what="its own task run")
    wait_for(lambda: rs.queues()[0].unrunnable == 1, timeout=20, what="nope parked")
    assert stop(p) == 0
    t = rs.show("nope", "n1")
    assert t.state == "due" and t.attempts == 0 and t.last_error is None


def test_timeout_kills_the_whole_process_group(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    h = script(tmp_path, "slow.sh", """
        sleep 60 &
        echo $! > grandchild.pid
        wait
    """)  # fmt: skip
    cli("add", "job.slow", "s1", "--max-attempts", "1", check=0)
    p, _ = start(cli, tmp_path, "--handler", f"job.slow={h}", "--timeout", "500ms")
    wait_for(
        lambda: state(rs, "job.slow", "s1") == "dead", timeout=20, what="task dead after timeout"
    )
    pid = int((tmp_path / "grandchild.pid").read_text())
    wait_for(lambda: not alive(pid), timeout=10, what="grandchild killed")
    assert stop(p) == 0
    assert "timeout" in (rs.show("job.slow", "s1").last_error or "")
    (r,) = history(rs)
    assert r["result"] == "timeout" and r["duration_ms"] >= 500


# ----------------------------------------------------------------------------- several processes


COUNTER_MOD = """
import os

FD = os.open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ran.txt"),
             os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def run(task):
    os.write(FD, f"{task.id} {task.token} {os.getpid()}\\n".encode())
"""


def _assert_each_once(rs: Rsched, ran: Path, n: int, task_type: str) -> set[str]:
    q = rs.keys.queue("default")
    wait_for(lambda: len(lines(ran)) >= n, timeout=60, what=f"{n} runs")
    wait_for(
        lambda: rs.redis.hlen(q.tasks) == 0 and rs.redis.zcard(q.proc) == 0,
        timeout=20,
        what="queue drained",
    )
    rows = [x.split() for x in lines(ran)]
    counts = Counter(r[0] for r in rows)
    assert len(counts) == n, f"{n - len(counts)} tasks never ran"
    assert max(counts.values()) == 1, f"ran twice: {[k for k, v in counts.items() if v > 1][:10]}"
    assert rs.redis.hget(q.stats, f"ok|{task_type}") == str(n)
    assert rs.redis.zcard(q.dead) == 0
    return {r[2] for r in rows}


@pytest.mark.valkey
def test_four_consumers_2000_python_tasks_each_exactly_once(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    (tmp_path / "hcount.py").write_text(textwrap.dedent(COUNTER_MOD))
    procs = [start(cli, tmp_path, "--call", "t.count=hcount:run", "--concurrency", "4", name=f"c{i}")[0]
             for i in range(4)]  # fmt: skip
    wait_for(
        lambda: rs.redis.zcard(rs.keys.queue("default").consumers) == 4,
        timeout=20,
        what="4 consumers",
    )
    add_many(rs, "t.count", [f"id{i}" for i in range(2000)])
    _assert_each_once(rs, tmp_path / "ran.txt", 2000, "t.count")
    assert all(stop(p) == 0 for p in procs)


def test_four_consumers_2000_command_tasks_each_exactly_once(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    h = script(tmp_path, "count.sh", """
        echo "$1 $RSCHED_CLAIM_TOKEN $PPID" >> ran.txt
    """)  # fmt: skip
    procs = [start(cli, tmp_path, "--handler", f"t.cmd={h}", "--concurrency", "4", name=f"c{i}")[0]
             for i in range(4)]  # fmt: skip
    wait_for(
        lambda: rs.redis.zcard(rs.keys.queue("default").consumers) == 4,
        timeout=20,
        what="4 consumers",
    )
    add_many(rs, "t.cmd", [f"id{i}" for i in range(2000)])
    workers = _assert_each_once(rs, tmp_path / "ran.txt", 2000, "t.cmd")
    assert len(workers) >= 2  # the work was shared
    assert all(stop(p) == 0 for p in procs)


LEASE_HANDLER = """
    echo "start $RSCHED_ATTEMPT $RSCHED_CLAIM_TOKEN $$" >> log.txt
    if [ "$RSCHED_ATTEMPT" = 1 ]; then sleep "$FIRST_SLEEP"; fi
    echo "end $RSCHED_ATTEMPT $RSCHED_CLAIM_TOKEN" >> log.txt
"""


@pytest.mark.valkey
def test_kill9_mid_task_runs_again_after_its_lease(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    h = script(tmp_path, "h.sh", LEASE_HANDLER)
    env = {"FIRST_SLEEP": "30"}
    a = cli.spawn("run", "consumer", "--handler", f"t.k={h}", "--lease", "1s", env=env,
                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    cli("add", "t.k", "k1", check=0)
    log = tmp_path / "log.txt"
    wait_for(lambda: any(x.startswith("start 1") for x in lines(log)), timeout=15, what="first run")
    orphan = int(lines(log)[0].split()[3])
    q = rs.keys.queue("default")
    try:
        os.kill(a.pid, signal.SIGKILL)
        a.wait(timeout=10)
        assert state(rs, "t.k", "k1") == "processing"
        expiry = int(rs.redis.zscore(q.proc, "t.k k1") or 0)  # no heartbeat extends it now
        b, _ = start(cli, tmp_path, "--handler", f"t.k={h}", "--lease", "1s", name="b")
        wait_for(lambda: gone(rs, "t.k", "k1"), timeout=20, what="task run again and acked")
        assert stop(b) == 0
    finally:
        try:  # a runner's guardian (rsched/runtime/proc.py) may have killed it already
            os.kill(orphan, signal.SIGKILL)
        except ProcessLookupError:
            pass
    starts = [x.split() for x in lines(log) if x.startswith("start")]
    assert [s[1] for s in starts] == ["1", "2"]
    recs = history(rs)
    lost = [r for r in recs if r["result"] == "lost"]
    ok = [r for r in recs if r["result"] == "ok"]
    assert len(lost) == 1 and lost[0]["attempt"] == 1 and "lease expired" in lost[0]["error"]
    assert len(ok) == 1 and ok[0]["attempt"] == 2 and ok[0]["token"] == starts[1][2]
    # reaped once the dead consumer's lease had expired, not before; then run again
    assert ok[0]["started_ms"] >= lost[0]["finished_ms"] >= expiry > 0


def test_stale_consumers_ack_is_refused(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    h = script(tmp_path, "h.sh", LEASE_HANDLER)
    env = {"FIRST_SLEEP": "1.5"}
    a, a_err = start(cli, tmp_path, "--handler", f"t.s={h}", "--lease", "1s", name="a", env=env)
    cli("add", "t.s", "s1", check=0)
    log = tmp_path / "log.txt"
    wait_for(lambda: any(x.startswith("start 1") for x in lines(log)), timeout=15, what="first run")
    os.kill(a.pid, signal.SIGSTOP)  # the consumer freezes; its handler (own group) goes on
    try:
        b, _ = start(cli, tmp_path, "--handler", f"t.s={h}", "--lease", "1s", name="b", env=env)
        wait_for(lambda: gone(rs, "t.s", "s1"), timeout=20, what="another consumer ran it")
        wait_for(
            lambda: any(x.startswith("end 1") for x in lines(log)),
            timeout=15,
            what="first run ended",
        )
    finally:
        os.kill(a.pid, signal.SIGCONT)
    wait_for(lambda: "ack refused" in a_err.read_text() or "lease lost" in a_err.read_text(), timeout=15,
             what="the stale consumer to notice")  # fmt: skip
    assert stop(a) == 0 and stop(b) == 0
    starts = [x.split() for x in lines(log) if x.startswith("start")]
    assert [s[1] for s in starts] == ["1", "2"]
    q = rs.keys.queue("default")
    assert rs.redis.hget(q.stats, "ok|t.s") == "1"
    ok = [r for r in history(rs) if r["result"] == "ok"]
    assert len(ok) == 1 and ok[0]["token"] == starts[1][2]


def test_sigterm_releases_an_unfinished_task_back_to_due(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    h = script(tmp_path, "h.sh", """
        echo "$$" > pid.txt
        exec sleep 30
    """)  # fmt: skip
    p, err = start(cli, tmp_path, "--handler", f"t.g={h}", "--grace", "300ms", "--lease", "60s")
    cli("add", "t.g", "g1", check=0)
    wait_for(lambda: (tmp_path / "pid.txt").exists() and (tmp_path / "pid.txt").read_text().strip(),
             timeout=15, what="handler started")  # fmt: skip
    pid = int((tmp_path / "pid.txt").read_text())
    assert state(rs, "t.g", "g1") == "processing"
    assert stop(p) == 0
    t = rs.show("t.g", "g1")
    assert t.state == "due" and t.attempts == 0  # back to due at once, not after the 60s lease
    wait_for(lambda: not alive(pid), timeout=10, what="handler killed")
    assert "released 1" in err.read_text()


def test_sigterm_lets_a_running_handler_finish_within_grace(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    h = script(tmp_path, "h.sh", """
        touch started
        sleep 0.5
    """)  # fmt: skip
    p, _ = start(cli, tmp_path, "--handler", f"t.g={h}", "--grace", "20s")
    cli("add", "t.g", "g2", check=0)
    wait_for(lambda: (tmp_path / "started").exists(), timeout=15, what="handler started")
    assert stop(p) == 0
    assert gone(rs, "t.g", "g2")


def test_burst_exits_zero_when_nothing_is_due(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    res = cli("run", "consumer", "--handler", "t.b=true", "--burst", timeout=20, check=0)
    assert res.returncode == 0
    add_many(rs, "t.b", ["1", "2", "3"])
    cli("add", "--in", "1h", "t.b", "later", check=0)
    cli("run", "consumer", "--handler", "t.b=true", "--burst", timeout=20, check=0)
    assert all(gone(rs, "t.b", i) for i in ("1", "2", "3"))
    assert state(rs, "t.b", "later") == "scheduled"


def test_clean_exit_leaves_the_consumers_registry(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    """A consumer that stops cleanly (--burst end, SIGTERM, library stop()) is no longer
    counted as live by `queues`; only a killed one ages out (REGISTRATION_TTL_MS)."""
    add_many(rs, "t.x", ["1", "2"])
    procs = [
        cli.spawn("run", "consumer", "--handler", "t.x=true", "--burst", stdout=subprocess.DEVNULL)
        for _ in range(2)
    ]
    assert [p.wait(20) for p in procs] == [0, 0]
    assert cli.json("queues")[0]["consumers"] == 0
    # SIGTERM: registered while it runs, gone at once when it exits.
    p = cli.spawn("run", "consumer", "--handler", "t.x=true", stdout=subprocess.DEVNULL)
    wait_for(lambda: cli.json("queues")[0]["consumers"] == 1, timeout=15, what="registered")
    p.send_signal(signal.SIGTERM)
    assert p.wait(20) == 0
    assert cli.json("queues")[0]["consumers"] == 0
    # The library's stop().
    c = rs.consumer(handlers={"t.x": lambda t: None}, install_signals=False)
    t = threading.Thread(target=c.run)
    t.start()
    wait_for(lambda: rs.redis.zcard(rs.keys.queue("default").consumers) == 1, timeout=10)
    c.stop()
    t.join(20)
    assert not t.is_alive() and rs.redis.zcard(rs.keys.queue("default").consumers) == 0


def _blocked_clients(rs: Rsched) -> int:
    return sum(
        1
        for c in rs.redis.client_list()
        if c.get("cmd") == "bzpopmin" and "b" in c.get("flags", "")
    )


def test_idle_consumer_wakes_when_a_task_becomes_due(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    p, _ = start(cli, tmp_path, "--handler", "t.w=true")
    wait_for(lambda: _blocked_clients(rs) >= 1, timeout=15, what="consumer blocked on its wake key")
    cli("add", "--in", "300ms", "t.w", "w1", check=0)
    wait_for(lambda: any(r["result"] == "ok" for r in history(rs)), timeout=10, what="task run")
    (r,) = history(rs)
    lateness = r["started_ms"] - r["fire_ms"]
    assert lateness >= 0  # never early, by the server's clock
    print(f"firing lateness: {lateness} ms")
    assert lateness < 2000  # woken for it, not by the idle cadence (timing proper is benchmarked)
    assert stop(p) == 0


def _commands(client: Any) -> Counter[str]:
    """INFO commandstats calls by command, every command a script runs included
    (the test's own INFO and CONFIG left out)."""
    stats = client.info("commandstats")
    return Counter(
        {
            k[len("cmdstat_") :]: int(v["calls"])
            for k, v in stats.items()
            if not k.startswith(("cmdstat_info", "cmdstat_config"))
        }
    )


#: The measured idle window: one and a half idle cadences (10 s). Whatever the phase,
#: it holds one or two claim-18 calls and one or two BZPOPMIN timeouts.
IDLE_WINDOW_S = 15.0


def test_idle_consumer_costs_redis_almost_nothing(
    own_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """Counted the strict way: INFO commandstats, which counts each command a script
    runs. An idle cadence costs 7 (claim-18: EVALSHA, TIME, EXISTS, 2 ZRANGE, ZADD; and
    one BZPOPMIN), so the window sees at most 14 in 15 s; the old 5 s cadence with
    type checks in every claim cost 17 + 1 per 5 s (3.4/s)."""
    cli = Cli(own_server, namespace, cwd=str(tmp_path))
    try:
        p, _ = start(cli, tmp_path, "--handler", "t.i=true")
        c = own_server.client()
        # Blocked on its wake key: the start-up claim (which checks key types) is done.
        wait_for(
            lambda: any(x.get("cmd") == "bzpopmin" for x in c.client_list()),
            timeout=15,
            what="idle",
        )
        c.config_resetstat()
        t0 = time.monotonic()
        time.sleep(IDLE_WINDOW_S)  # the idle period under measurement
        calls = _commands(c)
        elapsed = time.monotonic() - t0
        total = sum(calls.values())
        print(
            f"idle consumer: {total} commands in {elapsed:.1f}s = {total / elapsed:.2f}/s: {calls}"
        )
        assert total / elapsed <= 1.0
        claims = calls["evalsha"] + calls["eval"]
        assert 1 <= claims <= 2  # the window covers the idle cadence: it stays registered
        assert calls["type"] == 0  # no type checks while there is nothing to write
        rs = Rsched(c, namespace)  # still registered (`rsched queues` counts it live)
        assert c.zcount(rs.keys.queue("default").consumers, f"({rs.now_ms()}", "+inf") == 1
        assert stop(p) == 0
    finally:
        cli.close()


def test_paused_queue_runs_nothing_until_resumed(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    rs.pause_queue("default")
    add_many(rs, "t.p", ["p1"])
    p, err = start(cli, tmp_path, "--handler", "t.p=true")
    wait_for(
        lambda: "queue default is paused" in err.read_text(),
        timeout=15,
        what="consumer sees the pause",
    )
    wait_for(lambda: _blocked_clients(rs) >= 1, timeout=15, what="consumer asleep")
    assert state(rs, "t.p", "p1") == "due"
    rs.resume_queue("default")
    wait_for(lambda: gone(rs, "t.p", "p1"), timeout=10, what="task run after resume")
    assert stop(p) == 0


def test_consumer_rides_out_a_redis_restart(
    own_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    cli = Cli(own_server, namespace, cwd=str(tmp_path))
    rs = Rsched(own_server.client(), namespace)
    try:
        p, err = start(cli, tmp_path, "--handler", "t.r=true")
        wait_for(
            lambda: rs.redis.zcard(rs.keys.queue("default").consumers) == 1,
            timeout=15,
            what="registered",
        )
        own_server.kill()
        wait_for(
            lambda: "error: Redis unreachable" in err.read_text(), timeout=15, what="outage noticed"
        )
        assert p.poll() is None  # a blink is not a reason to exit
        own_server.start()
        rs = Rsched(own_server.client(), namespace)
        add_many(rs, "t.r", ["r1"])
        wait_for(lambda: gone(rs, "t.r", "r1"), timeout=20, what="task run after the restart")
        assert stop(p) == 0
        errors = [x for x in lines(err) if "error:" in x]
        assert 1 <= len(errors) <= 10 and all("retrying in" in x for x in errors)
    finally:
        cli.close()


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "args",
    [
        [],  # no handlers at all
        ["--handler", "t"],
        ["--handler", "bad type=true"],
        ["--handler", "t="],
        ["--handler", "t=true", "--lease", "5x"],
        ["--handler", "t=true", "--concurrency", "0"],
        ["--handler", "t=true", "--max-attempts", "zero"],
        ["--handler", "t=true", "--queue", "no/slash"],
        ["--handler", "t=true", "--backoff", "10s", "--backoff-max", "1s"],
        ["--call", "t=no_such_module_xyz:run"],
        ["--call", "t=os"],
        ["--handler", "t='unclosed"],
        ["--handler", "t=./no-such-program"],
    ],
)
def test_bad_input_exits_2_before_touching_redis(cli: Cli, rs: Rsched, args: list[str]) -> None:
    # An unreachable Redis: bad input must be refused before any connection (exit 2, not 69).
    res = cli(
        "run", "consumer", *args, timeout=20, env={"RSCHED_REDIS_URL": "redis://127.0.0.1:1/0"}
    )
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("rsched: error: ") and len(res.stderr.strip().splitlines()) == 1
    assert not list(rs.redis.scan_iter(f"{rs.namespace}:*"))


def test_a_lost_lease_kills_the_handler_and_its_result_does_not_count(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    h = script(
        tmp_path,
        "h.sh",
        """
        echo "$$" > pid.txt
        exec sleep 30
        """,
    )
    p, err = start(cli, tmp_path, "--handler", f"t.l={h}", "--lease", "1s")
    cli("add", "t.l", "l1", check=0)
    pid_file = tmp_path / "pid.txt"
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=15, what="handler")
    pid = int(pid_file.read_text())
    # its lease is gone (reaped by another consumer, say): the next heartbeat finds it lost
    # (`rsched cancel` no longer goes this way: it tells the consumer at once)
    rs.redis.zrem(rs.keys.queue("default").proc, "t.l l1")
    wait_for(lambda: not alive(pid), timeout=10, what="handler killed after its lease was lost")
    wait_for(lambda: "lease lost for t.l l1" in err.read_text(), timeout=10, what="log line")
    assert stop(p) == 0
    assert rs.redis.hget(rs.keys.queue("default").stats, "ok|t.l") is None


def test_ack_heartbeat_fail_release_check_the_claim_token(rs: Rsched) -> None:
    """The Lua contract under the consumer: a stale token is refused by every operation."""
    q = rs.keys.queue("default")
    claim_keys = [
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
    ]
    add_many(rs, "t.tok", ["x"])
    out = rs.scripts("claim-18", claim_keys, [1, 300, "old", 15000, 100, 100, "default", 5])
    old_token = out[6 + 4]
    # the old consumer stalls: its lease expires, the task is reaped and claimed again
    wait_for(lambda: rs.now_ms() > int(rs.redis.zscore(q.proc, "t.tok x") or 0), timeout=5)
    out = rs.scripts("claim-18", claim_keys, [1, 60000, "new", 15000, 100, 100, "default", 5])
    assert out[4] == 1 and len(out) == 6 + 7
    new_token = out[6 + 4]
    assert new_token != old_token and out[6 + 2] == 2  # attempt 2
    stale = ["t.tok x", old_token]
    assert rs.scripts("heartbeat-2", [q.proc, q.tasks], [1000, *stale]) == [0]
    assert rs.scripts("ack-9", calls.ack_keys(q), [100, *stale, ""]) == [0]
    fail_keys = calls.fail_keys(q)
    assert (
        rs.scripts("fail-10", fail_keys, [100, *stale, "e", 10, "", "failed", "0", 5])[0] == "stale"
    )
    assert rs.scripts("release-4", [q.sched, q.proc, q.tasks, q.wake], stale) == 0
    assert rs.show("t.tok", "x").state == "processing"
    ack = rs.scripts("ack-9", calls.ack_keys(q), [100, "t.tok x", new_token, ""])
    assert ack == [1] and gone(rs, "t.tok", "x")


def _claim_keys(rs: Rsched) -> list[str]:
    q = rs.keys.queue("default")
    return [
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
    ]


def _snapshot(rs: Rsched) -> dict[str, Any]:
    """Every key of the default queue: type and content."""
    r = rs.redis
    read: dict[str, Callable[[str], Any]] = {
        "zset": lambda k: r.zrange(k, 0, -1, withscores=True),
        "hash": r.hgetall,
        "string": r.get,
        "stream": r.xrange,
        "none": lambda k: None,
    }
    out = {}
    for k in _claim_keys(rs):
        t = r.type(k)
        out[k] = (t, read[t](k))
    return out


def test_claim_without_type_checks_reads_before_writing(rs: Rsched) -> None:
    """claim-18 with check "0" (the idle consumer's call) skips the TYPE checks only
    while it has nothing to write but its registration: a key of another type still
    fails with the clear error, before anything is written (Lua does not roll back)."""
    from rsched.core.errors import WrongKeyType

    q = rs.keys.queue("default")
    keys = _claim_keys(rs)
    args = [10, 60_000, "c1", 30_000, 100, 100, "default", 5, 0]
    # Idle path, a zset read fails: refused, the consumer is not even registered.
    rs.redis.set(q.sched, "someone else's data")
    before = _snapshot(rs)
    with pytest.raises(WrongKeyType):
        rs.scripts("claim-18", keys, args)
    assert _snapshot(rs) == before
    rs.redis.delete(q.sched)
    # A stale lease to reap, and `dead` (written by a reap, read by nothing before it)
    # is someone else's: the checks run because there is work, before the first write.
    add_many(rs, "t.s", ["a", "b"])
    out = rs.scripts("claim-18", keys, [2, 300, "c0", 30_000, 100, 100, "default", 1, 1])
    assert len(out) == 6 + 2 * 7
    wait_for(lambda: rs.now_ms() > int(rs.redis.zscore(q.proc, "t.s a") or 0), timeout=5)
    rs.redis.set(q.dead, "someone else's data")
    before = _snapshot(rs)
    with pytest.raises(WrongKeyType):
        rs.scripts("claim-18", keys, args)
    assert _snapshot(rs) == before
    rs.redis.delete(q.dead)
    # Nothing to do and a well-typed namespace: no TYPE check, the registration only.
    rs.redis.delete(q.proc)
    c0 = _commands(rs.redis)
    out = rs.scripts("claim-18", keys, args)
    assert out[1:] == [-1, -1, 0, 0, 0]
    calls = _commands(rs.redis) - c0
    assert calls["type"] == 0 and calls["zadd"] == 1 and calls["zremrangebyscore"] == 0
    assert rs.redis.zscore(q.consumers, "c1") == out[0] + 30_000


def test_a_claim_that_fails_leaves_its_due_tasks_due(rs: Rsched) -> None:
    """A claim-token counter that is not a number fails the claim after the due tasks
    were found: they stay in the due set (the old order removed them first: lost)."""
    from redis import ResponseError

    q = rs.keys.queue("default")
    add_many(rs, "t.n", ["a", "b"])
    rs.redis.set(q.seq, "not a number")
    before = _snapshot(rs)
    with pytest.raises(ResponseError, match="not an integer"):
        rs.scripts("claim-18", _claim_keys(rs), [10, 60_000, "c1", 30_000, 100, 100, "default", 5])
    after = _snapshot(rs)
    registration = after.pop(q.consumers)
    before.pop(q.consumers)
    assert after == before and registration[1][0][0] == "c1"
    assert state(rs, "t.n", "a") == state(rs, "t.n", "b") == "due"


def test_handler_table_precedence_and_catch_all(tmp_path: Path) -> None:
    from rsched.consumer.handlers import CommandHandler, HandlerTable, PythonHandler

    table = HandlerTable(
        {
            "*": "fallback",
            "report.*": "glob",
            "report.daily.*": "longer-glob",
            "report.x": "exact",
            "fn": print,
        }  # fmt: skip
    )
    assert table.get("report.x") == CommandHandler(("exact",))
    assert table.get("report.daily.eu") == CommandHandler(("longer-glob",))
    assert table.get("report.weekly") == CommandHandler(("glob",))
    assert table.get("order.close") == CommandHandler(("fallback",))
    assert isinstance(table.get("fn"), PythonHandler)
    assert HandlerTable({"a": "true"}).get("b") is None


def test_backoff_is_exponential_with_full_jitter_and_capped() -> None:
    import random

    from rsched.consumer.loop import backoff_delay_ms

    rnd = random.Random(1)
    for attempt, ceiling in ((1, 100), (2, 200), (3, 400), (4, 500), (30, 500)):
        samples = [backoff_delay_ms(attempt, 100, 500, rnd) for _ in range(300)]
        assert 0 <= min(samples) and max(samples) <= ceiling
        assert max(samples) > ceiling * 0.8  # the whole range is used (full jitter)


def test_one_consumer_wakes_for_any_of_its_queues(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    p, _ = start(cli, tmp_path, "--queue", "qa", "--queue", "qb", "--handler", "t.m=true")
    wait_for(lambda: _blocked_clients(rs) >= 1, timeout=15, what="consumer asleep")
    cli("add", "--queue", "qb", "--in", "200ms", "t.m", "m1", check=0)
    wait_for(lambda: gone(rs, "t.m", "m1", "qb"), timeout=10, what="task on the second queue run")
    (r,) = history(rs, "qb")
    assert 0 <= r["started_ms"] - r["fire_ms"] < 2000
    assert stop(p) == 0


@pytest.mark.slow
def test_soak_kill9_one_of_four_consumers_loses_nothing(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    (tmp_path / "hcount.py").write_text(textwrap.dedent(COUNTER_MOD))
    args = ("--call", "t.soak=hcount:run", "--concurrency", "4", "--lease", "1s")
    procs = [start(cli, tmp_path, *args, name=f"c{i}")[0] for i in range(4)]
    n = 20_000
    add_many(rs, "t.soak", [f"id{i}" for i in range(n)])
    ran = tmp_path / "ran.txt"
    victim = procs[0].pid
    wait_for(
        lambda: sum(x.endswith(f" {victim}") for x in lines(ran)) > 100,
        timeout=60,
        what="victim busy",
    )
    os.kill(victim, signal.SIGKILL)
    q = rs.keys.queue("default")
    wait_for(lambda: rs.redis.hlen(q.tasks) == 0, timeout=120, what="queue drained")
    counts = Counter(x.split()[0] for x in lines(ran))
    assert len(counts) == n  # none lost
    dupes = sum(v - 1 for v in counts.values())
    assert int(rs.redis.hget(q.stats, "ok|t.soak") or 0) == n
    print(f"soak: {dupes} re-runs after kill -9")
    assert rs.redis.zcard(q.dead) == 0
    assert all(stop(p) == 0 for p in procs[1:])


def test_systemd_notify_ready_watchdog_stopping(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    import socket

    path = f"/tmp/rsched-consumer-notify-{os.getpid()}-{tmp_path.name[-10:]}.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(10)
    try:
        env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"}
        p, _ = start(cli, tmp_path, "--handler", "t.n=true", env=env)
        seen: list[str] = []

        def got(field: str) -> bool:
            while field not in seen:
                seen.extend(sock.recv(4096).decode().split("\n"))
            return True

        assert got("READY=1")
        assert got("WATCHDOG=1")
        p.send_signal(signal.SIGTERM)
        assert got("STOPPING=1")
        assert p.wait(timeout=10) == 0
    finally:
        sock.close()
        os.unlink(path)


def test_queue_options_from_config_under_the_flags(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    (tmp_path / "rsched.toml").write_text(
        textwrap.dedent(
            """
            [queues.default]
            max_attempts = 2
            backoff = "10ms"
            backoff_max = "20ms"
            lease = "2s"

            [handlers]
            "t.*" = "false"
            """
        )
    )
    add_many(rs, "t.c", ["from-config"])
    p, _ = start(cli, tmp_path)
    wait_for(lambda: state(rs, "t.c", "from-config") == "dead", timeout=15, what="dead after 2")
    assert rs.show("t.c", "from-config").attempts == 2
    assert cli.json("queues")[0]["consumers"] == 1  # registered while it runs
    assert stop(p) == 0
    add_many(rs, "t.c", ["flag-wins"])
    p, _ = start(cli, tmp_path, "--max-attempts", "1", name="c2")
    wait_for(lambda: state(rs, "t.c", "flag-wins") == "dead", timeout=15, what="dead after 1")
    assert rs.show("t.c", "flag-wins").attempts == 1
    assert stop(p) == 0


def test_bad_queue_option_in_config_is_a_configuration_error(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    (tmp_path / "rsched.toml").write_text('[queues.default]\nlease = "soon"\n')
    res = cli("run", "consumer", "--handler", "t=true", timeout=20)
    assert res.returncode == 78 and "queues.default.lease" in res.stderr, res.stderr
    assert not list(rs.redis.scan_iter(f"{rs.namespace}:*"))


def test_a_released_task_wakes_another_idle_consumer(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    h = script(
        tmp_path,
        "h.sh",
        """
        echo "$$" >> starts.txt
        if [ -e block ]; then exec sleep 30; fi
        """,
    )
    (tmp_path / "block").touch()
    a, _ = start(cli, tmp_path, "--handler", f"t.r={h}", "--grace", "200ms", name="a")
    cli("add", "t.r", "r1", check=0)
    wait_for(lambda: lines(tmp_path / "starts.txt"), timeout=15, what="first consumer runs it")
    first = int(lines(tmp_path / "starts.txt")[0])
    (tmp_path / "block").unlink()
    b, _ = start(cli, tmp_path, "--handler", f"t.r={h}", name="b")
    q = rs.keys.queue("default")
    wait_for(
        lambda: rs.redis.zcard(q.consumers) == 2, timeout=15, what="second consumer registered"
    )
    assert stop(a) == 0
    released_ms = rs.now_ms()
    wait_for(lambda: gone(rs, "t.r", "r1"), timeout=10, what="the other consumer ran it")
    (r,) = [r for r in history(rs) if r["result"] == "ok"]
    assert r["attempt"] == 1  # a release does not count the attempt
    assert r["started_ms"] - released_ms < 2500  # woken by the release, not its 5s idle timer
    wait_for(lambda: not alive(first), timeout=10, what="first handler killed")
    assert stop(b) == 0


def test_a_key_of_the_wrong_type_stops_the_consumer_with_exit_78(cli: Cli, rs: Rsched) -> None:
    rs.redis.set(rs.keys.queue("default").sched, "someone else's data")
    res = cli("run", "consumer", "--handler", "t=true", timeout=20)
    assert res.returncode == 78, res.stderr
    assert "namespace" in res.stderr.splitlines()[-1]
    assert rs.redis.get(rs.keys.queue("default").sched) == "someone else's data"


SLOW_MOD = """
import os, time

FD = os.open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ran.txt"),
             os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def run(task):
    time.sleep(0.2)
    os.write(FD, f"{task.id} {task.token} {os.getpid()}\\n".encode())
"""


def test_slow_python_handlers_do_not_hoard_tasks(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    (tmp_path / "hslow.py").write_text(textwrap.dedent(SLOW_MOD))
    procs = [start(cli, tmp_path, "--call", "t.slow=hslow:run", name=f"c{i}")[0] for i in range(2)]
    wait_for(lambda: rs.redis.zcard(rs.keys.queue("default").consumers) == 2, timeout=15)
    add_many(rs, "t.slow", [str(i) for i in range(12)])
    pids = _assert_each_once(rs, tmp_path / "ran.txt", 12, "t.slow")
    per = Counter(x.split()[2] for x in lines(tmp_path / "ran.txt"))
    assert len(pids) == 2 and min(per.values()) >= 3, per  # prefetch adapts to slow handlers
    assert all(stop(p) == 0 for p in procs)


# ----------------------------------------------------------------------------- IDs as options

ARGPARSE_HANDLER = """
import argparse, os
p = argparse.ArgumentParser()
p.add_argument("--dry-run", action="store_true")
p.add_argument("task_id")
a = p.parse_args()
with open(os.path.join(os.environ["OUT_DIR"], "ran.txt"), "a") as fh:
    fh.write(a.task_id + "\\n")
"""


def test_an_id_beginning_with_dash_never_reaches_sort_as_an_option(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    proof = tmp_path / "proof.txt"
    cli("add", "--max-attempts", "1", "--payload", '"secret payload"', "--",
        "sort.it", f"--output={proof}", check=0)  # fmt: skip
    res = cli("run", "consumer", "--handler", "sort.it=/usr/bin/sort", "--burst", check=0)
    assert not proof.exists(), "sort took the task ID as its --output option"
    # sort was run, with the ID as a file operand it could not read: a failure, not an ack
    t = rs.show("sort.it", f"--output={proof}")
    assert t.state == "dead", res.stderr
    assert f"--output={proof}" in (t.last_error or "") and "No such file" in (t.last_error or "")


def test_an_argparse_handler_gets_an_id_like_help_as_its_positional_argument(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    h = script(tmp_path, "handler.py", ARGPARSE_HANDLER, shell=sys.executable)
    for tid in ("--help", "-x", "1001", "--dry-run"):
        cli("add", "--", "job.run", tid, check=0)
    cli("run", "consumer", "--handler", f"job.run={h}", "--burst", check=0,
        env={"OUT_DIR": str(tmp_path)})  # fmt: skip
    ran = sorted(lines(tmp_path / "ran.txt"))
    assert ran == sorted(["--help", "-x", "1001", "--dry-run"])
    assert all(gone(rs, "job.run", t) for t in ("--help", "-x", "1001", "--dry-run"))


def test_id_arg_auto_keeps_plain_ids_as_is_and_none_and_plain_opt_out(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    rec = script(tmp_path, "rec.py", RECORDER.replace(
        'os.environ["RSCHED_TASK_ID"]', 'os.environ["RSCHED_TASK_TYPE"] + os.environ["RSCHED_TASK_ID"]'
    ), shell=sys.executable)  # fmt: skip
    (tmp_path / "rsched.toml").write_text(
        "[handlers]\n"
        f'"a.auto" = "{rec} --flag"\n'
        f'"b.none" = {{command = ["{rec}"], id_arg = "none"}}\n'
    )
    for t, i in (("a.auto", "1001"), ("a.auto", "-5"), ("b.none", "-5")):
        cli("add", "--", t, i, check=0)
    cli("run", "consumer", "--burst", check=0, env={"OUT_DIR": str(tmp_path)})
    # --id-arg: for every command handler that does not set its own
    cli("add", "--", "c.plain", "-7", check=0)
    cli("run", "consumer", "--handler", f"c.plain={rec}", "--id-arg", "plain", "--burst",
        check=0, env={"OUT_DIR": str(tmp_path)})  # fmt: skip

    def argv(name: str) -> list[str]:
        return list(json.loads((tmp_path / f"{name}.json").read_text())["argv"])

    assert argv("a.auto1001") == ["--flag", "1001"]  # ./close-order 1001, unchanged
    assert argv("a.auto-5") == ["--flag", "--", "-5"]  # still the last argument
    assert argv("b.none-5") == []  # RSCHED_TASK_ID only
    assert argv("c.plain-7") == ["-7"]  # opted out


def test_bad_id_arg_is_refused_before_connecting(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "rsched.toml").write_text('[handlers]\n"a" = {command = "true", id_arg = "x"}\n')
    res = cli("--redis-url", "redis://127.0.0.1:1/0", "run", "consumer", "--burst")
    assert res.returncode == 78 and "handlers.a.id_arg" in res.stderr, res.stderr
    res = cli("run", "consumer", "--handler", "a=true", "--id-arg", "x", "--burst")
    assert res.returncode == 2 and "--id-arg" in res.stderr


# ----------------------------------------------------------------------------- types a consumer runs

TYPE_RECORDER = """
import os, sys
who, tid = sys.argv[1], sys.argv[-1]
with open(os.path.join(os.environ["OUT_DIR"], "runs.txt"), "a") as fh:
    fh.write(f"{os.environ['RSCHED_TASK_TYPE']} {tid} {who} {os.environ['RSCHED_ATTEMPT']}\\n")
"""


def _queue(cli: Cli) -> dict[str, Any]:
    (row,) = cli.json("queues")
    return dict(row)


def test_a_consumer_leaves_types_it_cannot_run_due_and_queues_shows_them(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    """The README's tour: a consumer with an order.close handler and a report.send
    task. Today's claim took it and dead-lettered it ("no handler for report.send")."""
    rec = script(tmp_path, "rec.py", TYPE_RECORDER, shell=sys.executable)
    env = {"OUT_DIR": str(tmp_path)}
    added = cli.json("add", "report.send", "r-77", "--payload", '{"to":"ops"}')
    cli("add", "order.close", "1001", check=0)
    p, err = start(cli, tmp_path, "--handler", f"order.close={rec} A", env=env)
    wait_for(lambda: gone(rs, "order.close", "1001"), timeout=15, what="order run")
    wait_for(lambda: _queue(cli)["unrunnable"] == 1, timeout=15, what="queues shows it")
    row = _queue(cli)
    assert row["due"] == 1 and row["unrunnable_types"] == ["report.send"]
    assert row["unrunnable_lag_ms"] > 0 and row["lag_ms"] >= row["unrunnable_lag_ms"]
    table = cli("queues", check=0).stdout
    assert "NO HANDLER" in table and "report.send" in table
    t = rs.show("report.send", "r-77")
    assert t.state == "due" and t.attempts == 0 and t.last_error is None
    assert t.due_ms == added["due_ms"]  # a parked task keeps its due time
    [listed] = cli.json("list", "--state", "due")
    assert listed["id"] == "r-77" and listed["due_ms"] == added["due_ms"]
    text = cli("metrics", check=0).stdout
    assert 'rsched_queue_unrunnable_tasks{queue="default"} 1.0' in text
    # A consumer that can run it takes it: once, first attempt, its payload intact.
    q, _ = start(cli, tmp_path, "--handler", f"report.*={rec} B", name="b", env=env)
    wait_for(lambda: gone(rs, "report.send", "r-77"), timeout=15, what="report run")
    assert sorted(lines(tmp_path / "runs.txt")) == [
        "order.close 1001 A 1",
        "report.send r-77 B 1",
    ]
    wait_for(lambda: _queue(cli)["unrunnable"] == 0, timeout=15, what="nothing left")
    assert stop(p) == 0 and stop(q) == 0
    assert "no handler" not in err.read_text()
    assert all(h["result"] == "ok" for h in history(rs))


def test_with_no_live_consumer_every_due_task_counts_as_unrunnable(cli: Cli) -> None:
    cli("add", "a.x", "1", check=0)
    cli("add", "--in", "1h", "a.x", "2", check=0)
    row = _queue(cli)
    assert row["consumers"] == 0 and row["unrunnable"] == 1 and row["unrunnable_types"] == []


def test_a_star_handler_takes_every_type_parked_ones_included(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    rec = script(tmp_path, "rec.py", TYPE_RECORDER, shell=sys.executable)
    env = {"OUT_DIR": str(tmp_path)}
    add_many(rs, "x.one", [str(i) for i in range(30)])
    add_many(rs, "y.two", [str(i) for i in range(30)])
    # a consumer of x.* parks the y.two tasks and runs its own
    cli("run", "consumer", "--handler", f"x.*={rec} X", "--burst", check=0, env=env)
    assert rs.redis.hlen(rs.keys.queue("default").lanes) == 2  # y.two's lane and '#'
    assert [t.type for t in rs.list(state="due")] == ["y.two"] * 30
    cli("run", "consumer", "--handler", f"*={rec} S", "--burst", check=0, env=env)
    runs = Counter(tuple(line.split()[::2]) for line in lines(tmp_path / "runs.txt"))
    assert runs == {("x.one", "X"): 30, ("y.two", "S"): 30}
    assert rs.queues()[0].due == 0


@pytest.mark.valkey
def test_consumers_of_different_types_share_a_queue_each_taking_its_own(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    """Three real consumer processes, two types interleaved at the head of one queue:
    every task runs once, on the consumer that has its handler; none fails."""
    rec = script(tmp_path, "rec.py", TYPE_RECORDER, shell=sys.executable)
    env = {"OUT_DIR": str(tmp_path)}
    ids = [str(i) for i in range(120)]
    add_many(rs, "order.close", ids)
    add_many(rs, "report.send", ids)
    procs = [
        start(cli, tmp_path, "--handler", f"order.close={rec} A", "--concurrency", "4",
              name="a", env=env)[0],
        start(cli, tmp_path, "--handler", f"order.close={rec} A2", name="a2", env=env)[0],
        start(cli, tmp_path, "--handler", f"report.*={rec} B", "--concurrency", "4",
              name="b", env=env)[0],
    ]  # fmt: skip
    wait_for(lambda: len(lines(tmp_path / "runs.txt")) >= 240, timeout=60, what="all run")
    wait_for(lambda: rs.queues()[0].processing == 0, timeout=15, what="settled")
    for p in procs:
        assert stop(p) == 0
    runs = [line.split() for line in lines(tmp_path / "runs.txt")]
    assert len(runs) == 240
    assert Counter((t, i) for t, i, _, _ in runs) == {
        (t, i): 1 for t in ("order.close", "report.send") for i in ids
    }
    assert {w for t, _, w, _ in runs if t == "report.send"} == {"B"}
    assert {w for t, _, w, _ in runs if t == "order.close"} <= {"A", "A2"}
    assert {a for _, _, _, a in runs} == {"1"}  # no failed attempt
    assert all(h["result"] == "ok" for h in history(rs))


# ----------------------------------------------------------------------------- cancel of a running task


def _cancelled_records(rs: Rsched) -> list[dict[str, Any]]:
    return [h for h in history(rs) if h["result"] == "cancelled"]


def test_cancel_of_a_running_command_handler_stops_it_and_records_cancelled(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    """Today the handler ran on to its end, the consumer logged "ack refused … reaped
    or claimed again" and no history record was written."""
    h = script(tmp_path, "long.sh", """
        echo $$ > "$OUT_DIR/$RSCHED_TASK_ID.pid"
        sleep 300 &
        echo $! > "$OUT_DIR/$RSCHED_TASK_ID.child"
        wait
        echo finished > "$OUT_DIR/$RSCHED_TASK_ID.done"
    """)  # fmt: skip
    env = {"OUT_DIR": str(tmp_path)}
    cli("add", "job.long", "j1", check=0)
    p, err = start(cli, tmp_path, "--handler", f"job.long={h}", "--handler", "job.next=true",
                   "--grace", "2s", env=env)  # fmt: skip
    pid_file = tmp_path / "j1.pid"
    wait_for(lambda: (tmp_path / "j1.child").exists(), timeout=15, what="handler running")
    pid, child = int(pid_file.read_text()), int((tmp_path / "j1.child").read_text())
    out = cli.json("cancel", "job.long", "j1")
    assert out["was"] == "processing"
    # stopped by SIGTERM to its group (the sleep too), well before its lease (60 s)
    wait_for(lambda: not alive(pid) and not alive(child), timeout=10, what="handler stopped")
    assert not (tmp_path / "j1.done").exists()
    (rec,) = _cancelled_records(rs)
    assert rec["type"] == "job.long" and rec["id"] == "j1" and rec["attempt"] == 1
    assert rec["token"] and "cancelled while running" in rec["error"]
    assert [r["result"] for r in cli.json("history", "--queue", "default")] == ["cancelled"]
    wait_for(lambda: "cancelled job.long j1" in err.read_text(), timeout=10, what="log line")
    # the consumer goes on: the next task runs
    cli("add", "job.next", "n1", check=0)
    wait_for(lambda: gone(rs, "job.next", "n1"), timeout=15, what="next task run")
    assert stop(p) == 0
    text = err.read_text()
    assert "ack refused" not in text and "failure report refused" not in text
    assert "lease lost" not in text


def test_cancel_sigkills_a_handler_that_ignores_sigterm_after_the_grace(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    h = script(tmp_path, "stubborn.sh", """
        trap '' TERM
        echo $$ > "$OUT_DIR/pid"
        while :; do sleep 0.1; done
    """)  # fmt: skip
    cli("add", "job.stub", "s1", check=0)
    p, err = start(cli, tmp_path, "--handler", f"job.stub={h}", "--grace", "1s",
                   env={"OUT_DIR": str(tmp_path)})  # fmt: skip
    wait_for(lambda: (tmp_path / "pid").exists(), timeout=15, what="handler running")
    pid = int((tmp_path / "pid").read_text())
    cli("cancel", "job.stub", "s1", check=0)
    wait_for(lambda: "SIGKILL after 1s" in err.read_text(), timeout=10, what="SIGTERM sent")
    assert alive(pid)  # it ignores SIGTERM ...
    wait_for(lambda: not alive(pid), timeout=10, what="SIGKILL after the grace")  # ... not SIGKILL
    assert [r["result"] for r in history(rs)] == ["cancelled"]
    assert stop(p) == 0


PY_CANCEL = """
import os, time

HERE = os.path.dirname(os.path.abspath(__file__))


def work(task):
    open(os.path.join(HERE, "started"), "w").close()
    deadline = time.monotonic() + 60
    while not task.cancelled and time.monotonic() < deadline:
        task.cancel_event.wait(0.05)
    with open(os.path.join(HERE, "saw"), "w") as fh:
        fh.write("cancelled" if task.cancelled else "timed out")
"""


def test_a_python_handler_sees_the_cancellation_and_its_result_does_not_count(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    (tmp_path / "pcancel.py").write_text(textwrap.dedent(PY_CANCEL))
    cli("add", "py.work", "w1", check=0)
    p, err = start(cli, tmp_path, "--call", "py.work=pcancel:work")
    wait_for(lambda: (tmp_path / "started").exists(), timeout=15, what="handler running")
    cli("cancel", "py.work", "w1", check=0)
    wait_for(lambda: (tmp_path / "saw").exists(), timeout=10, what="handler returned")
    assert (tmp_path / "saw").read_text() == "cancelled"
    wait_for(lambda: "its handler stopped" in err.read_text(), timeout=10, what="settled")
    assert [r["result"] for r in history(rs)] == ["cancelled"]
    assert rs.redis.hget(rs.keys.queue("default").stats, "ok|py.work") is None
    assert stop(p) == 0
    assert "ack refused" not in err.read_text()


def test_cancelled_is_a_history_result_value() -> None:
    from rsched.tools.history import FAILED_RESULTS, RESULTS

    assert "cancelled" in RESULTS and "cancelled" not in FAILED_RESULTS


def test_options_are_checked_in_one_place_before_any_redis_io() -> None:
    from rsched.consumer.options import consumer_options
    from rsched.core.errors import BadInput

    for kw, message in (
        ({"lease_ms": "100ms"}, "--lease: 100ms is too short; give at least 300ms"),
        (
            {"backoff_ms": "2s", "backoff_max_ms": "1s"},
            "--backoff-max: 1000ms is shorter than --backoff (2000ms)",
        ),
        ({"concurrency": "0"}, "--concurrency: '0' is not a whole number from 1 to 1024"),
        ({"max_attempts": "x"}, "--max-attempts: 'x' is not a whole number from 1 to"),
    ):
        with pytest.raises(BadInput) as exc:
            consumer_options(None, ["default"], **kw)
        assert str(exc.value).startswith(message), (kw, str(exc.value))
    with pytest.raises(BadInput, match="--queue: give at least one queue"):
        consumer_options(None, [])
    opts = consumer_options(None, ["a", "b", "a"], concurrency="4", lease_ms="2s", grace_ms=500)
    assert opts.queues == ("a", "b") and opts.concurrency == 4 and opts.grace_ms == 500
    assert opts.per_queue["a"].lease_ms == 2000 and opts.per_queue["b"].timeout_ms is None
