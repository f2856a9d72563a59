"""Python applications (rsched.App, `rsched run worker`, rsched.aio) against a
real server, with real worker processes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rsched import App, LockHeld
from rsched.aio import Rsched as AsyncRsched
from rsched.core.errors import BadInput, NotFound
from tests.support import Cli, rsched_env, wait_for

APP = textwrap.dedent(
    """
    import asyncio, os, time
    from rsched import App

    app = App()
    OUT = os.environ["APP_OUT"]

    def note(name, text):
        with open(os.path.join(OUT, name), "a") as fh:
            fh.write(text + "\\n")

    @app.task("order.close", lease="1s")
    def close_order(task):
        time.sleep(0.005)
        note("closed", task.id)

    @app.task("order.slow", timeout="300ms", max_attempts=1)
    def slow(task):
        note("slow.pid", str(os.getpid()))
        time.sleep(3)
        note("slow.after", task.id)

    @app.task("order.long", timeout="60s", lease="1s")
    def long(task):
        note("long.pid", str(os.getpid()))
        time.sleep(60)
        note("long.after", task.id)

    @app.task("order.aslow", timeout="300ms", max_attempts=1)
    async def aslow(task):
        try:
            await asyncio.sleep(3)
            note("aslow.after", task.id)
        except asyncio.CancelledError:
            note("aslow.cancelled", task.id)
            raise

    @app.task("order.async", queue="web")
    async def from_web(task):
        await asyncio.sleep(0)
        note("web", f"{task.id} {task.payload['order']}")

    if os.environ.get("APP_CRON"):
        @app.cron("* * * * * ?", name="tick")
        def tick(run):
            note("ticks", f"{run.fire_ms} {run.fencing_token} {run.name}")

        @app.cron("* * * * * ?", name="atick")
        async def atick(run):
            await asyncio.sleep(0)
            note("aticks", f"{run.fire_ms} {run.fire_at}")

        @app.cron("* * * * * ?", name="split", shards=2)
        def split(run):
            note("split", f"{run.fire_ms} {run.shard_index} {run.shard_total}")
    """
)


@pytest.fixture
def appdir(tmp_path: Path) -> Path:
    (tmp_path / "shopapp.py").write_text(APP)
    (tmp_path / "out").mkdir()
    return tmp_path


def worker(cli: Cli, appdir: Path, *args: str, cron: bool = False) -> subprocess.Popen[str]:
    env = {"APP_OUT": str(appdir / "out")}
    if cron:
        env["APP_CRON"] = "1"
    return cli.spawn("run", "worker", "shopapp:app", *args, env=env)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def records(cli: Cli, **kw: str) -> list[dict]:
    args = [a for k, v in kw.items() for a in (f"--{k}", v)]
    return list(cli.json("history", "--limit", "500", *args))


def test_two_workers_fire_each_tick_once(cli: Cli, appdir: Path, rs) -> None:
    a = worker(cli, appdir, cron=True)
    b = worker(cli, appdir, cron=True)
    runners = rs.keys.cron("tick").runners
    wait_for(lambda: rs.redis.zcard(runners) == 2, timeout=15, what="both workers registered")
    ticks = appdir / "out" / "ticks"
    aticks, split = appdir / "out" / "aticks", appdir / "out" / "split"
    # (generous deadlines: in a loaded CI run 4 ticks once took over 20 s)
    wait_for(lambda: len(lines(ticks)) >= 4, timeout=60, what="4 ticks")
    wait_for(lambda: len(lines(aticks)) >= 2, timeout=30, what="2 ticks of the async cron")
    wait_for(lambda: len(lines(split)) >= 4, timeout=30, what="4 shard runs")
    for p in (a, b):
        p.send_signal(signal.SIGTERM)
    for p in (a, b):
        assert p.wait(timeout=30) == 0, p.stderr.read() if p.stderr else ""
    fired = [int(line.split()[0]) for line in lines(ticks)]
    assert len(fired) == len(set(fired)), f"a tick ran twice: {fired}"
    tokens = [int(line.split()[1]) for line in lines(ticks)]
    assert len(set(tokens)) == len(tokens)
    assert all(line.split()[2] == "tick" for line in lines(ticks))
    afired = [line.split() for line in lines(aticks)]
    assert len({f for f, _ in afired}) == len(afired)
    from rsched.core.timeutil import iso

    assert all(iso(int(f)) == at for f, at in afired)  # fire_ms and fire_at agree
    items = [tuple(map(int, line.split())) for line in lines(split)]
    assert len(set(items)) == len(items), f"a shard of a tick ran twice: {items}"
    assert {(i, n) for _, i, n in items} <= {(0, 2), (1, 2)}
    recs = [r for r in records(cli) if r["kind"] == "cron" and r["name"] == "tick"]
    ran = [r["fire_ms"] for r in recs]
    assert len(ran) == len(set(ran)), "a tick recorded twice"
    assert set(fired) <= set(ran)  # (the last may be recorded killed by the SIGTERM)
    assert sum(r["result"] == "ok" for r in recs) >= 3
    assert {r["pid"] for r in recs} <= {a.pid, b.pid}


def test_task_scheduled_from_an_async_handler_runs_in_a_worker(
    cli: Cli, appdir: Path, server, namespace: str
) -> None:
    async def web_handler(order: int) -> str:
        """What a FastAPI/Starlette endpoint does: await the add, answer."""
        rs = AsyncRsched.from_url(server.url, namespace=namespace)
        try:
            res = await rs.add("order.async", str(order), queue="web", payload={"order": order})
        finally:
            await rs.close()
        return res.status

    assert asyncio.run(web_handler(1001)) == "added"
    worker(cli, appdir)
    web = appdir / "out" / "web"
    wait_for(lambda: lines(web) == ["1001 1001"], timeout=15, what="the async handler ran")


def test_a_timed_out_handler_is_stopped_and_recorded_timeout(cli: Cli, appdir: Path, rs) -> None:
    rs.add("order.slow", "s1", max_attempts=1)
    rs.add("order.aslow", "a1", max_attempts=1)
    worker(cli, appdir)

    def timed_out() -> list[dict]:
        got = [r for r in records(cli, queue="default") if r["result"] == "timeout"]
        return got if len(got) == 2 else []

    recs = wait_for(timed_out, timeout=20, what="two timeout records")
    assert {r["type"] for r in recs} == {"order.slow", "order.aslow"}
    assert all("stopped after 0.3s" in r["error"] for r in recs)
    # The sync handler ran in a child that is gone: its work cannot go on.
    pid = int(lines(appdir / "out" / "slow.pid")[0])
    assert pid != 0

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(gone, timeout=5, what="the handler's process killed")
    # The coroutine was cancelled at its await (it did not go on sleeping).
    assert lines(appdir / "out" / "aslow.cancelled") == ["a1"]
    assert not (appdir / "out" / "slow.after").exists()
    assert not (appdir / "out" / "aslow.after").exists()
    assert rs.show("order.slow", "s1").state == "dead"


def test_a_worker_killed_with_kill_9_loses_no_task(cli: Cli, appdir: Path, rs) -> None:
    n = 300
    for i in range(n):
        rs.add("order.close", f"k{i}")
    closed = appdir / "out" / "closed"
    a = worker(cli, appdir, "--concurrency", "4")
    wait_for(lambda: len(lines(closed)) >= 20, timeout=15, what="the first worker at work")
    os.kill(a.pid, signal.SIGKILL)
    a.wait(timeout=10)
    assert len(set(lines(closed))) < n, "the kill came too late to test anything"
    assert rs.queues()[0].processing > 0  # the killed worker held tasks
    worker(cli, appdir, "--concurrency", "4")
    want = {f"k{i}" for i in range(n)}
    wait_for(lambda: set(lines(closed)) >= want, timeout=30, what="every task run")
    wait_for(lambda: rs.queues()[0].processing == 0, timeout=10, what="nothing held")
    assert rs.list() == []


def test_a_forked_handler_dies_with_its_worker(cli: Cli, appdir: Path, rs) -> None:
    rs.add("order.long", "l1")
    a = worker(cli, appdir)
    pidfile = appdir / "out" / "long.pid"
    pid = int(wait_for(lambda: lines(pidfile), timeout=15, what="the handler running")[0])
    os.kill(a.pid, signal.SIGKILL)
    a.wait(timeout=10)

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(gone, timeout=10, what="the forked handler killed with its worker")
    assert not (appdir / "out" / "long.after").exists()


def test_locked_raises_lock_held_while_another_process_holds_it(
    appdir: Path, server, namespace: str
) -> None:
    script = textwrap.dedent(
        """
        import os, sys, time
        from rsched import App
        app = App()
        @app.locked("reindex", ttl="2s")
        def hold():
            open(sys.argv[1], "w").close()
            while not os.path.exists(sys.argv[2]):
                time.sleep(0.02)
        hold()
        """
    )
    inside, go = appdir / "inside", appdir / "go"
    holder = subprocess.Popen(
        [sys.executable, "-c", script, str(inside), str(go)],
        env=rsched_env(server, namespace),
        cwd=str(appdir),
    )
    try:
        wait_for(inside.exists, timeout=15, what="the other process inside the lock")
        app = App(url=server.url, namespace=namespace)
        calls: list[str] = []

        @app.locked("reindex", ttl="2s")
        def reindex() -> str:
            calls.append("ran")
            return "done"

        with pytest.raises(LockHeld, match="reindex"):
            reindex()
        assert calls == []
        go.touch()
        assert holder.wait(timeout=15) == 0
        assert reindex() == "done"
        assert calls == ["ran"]

        @app.locked("reindex", ttl="2s")
        async def areindex() -> str:
            return "async done"

        assert asyncio.run(areindex()) == "async done"
        app.close()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_async_client_round_trip(server, namespace: str, rs) -> None:
    async def main() -> None:
        ars = AsyncRsched.from_url(server.url, namespace=namespace)
        try:
            res = await ars.add("order.close", "1001", delay="30m", payload={"order": 1001})
            assert res.status == "added"
            assert res.task.state == "scheduled"
            again = await ars.add("order.close", "1001", delay="30m")
            assert again.status == "kept"
            # The same result objects as the synchronous client
            assert await ars.show("order.close", "1001") == rs.show("order.close", "1001")
            listed = await ars.list()
            assert [t.id for t in listed] == ["1001"]
            assert listed == rs.list()
            (qs,) = await ars.queues()
            assert (qs.queue, qs.scheduled) == ("default", 1)
            many = await asyncio.gather(
                *(ars.add("bulk.t", str(i), queue="bulk") for i in range(50))
            )
            assert {r.status for r in many} == {"added"}
            assert {t.id for t in rs.list("bulk", limit=100)} == {str(i) for i in range(50)}
            assert await ars.cancel("order.close", "1001") == "scheduled"
            with pytest.raises(NotFound):
                await ars.show("order.close", "1001")
            with pytest.raises(NotFound):
                await ars.cancel("order.close", "1001")
            with pytest.raises(BadInput, match="--in"):
                await ars.add("order.close", "1002", delay="soon")
        finally:
            await ars.close()

    asyncio.run(main())
    with pytest.raises(NotFound):  # bad input wrote nothing
        rs.show("order.close", "1002")


def test_delay_schedules_with_the_tasks_queue_and_attempts(server, namespace: str, rs) -> None:
    app = App(url=server.url, namespace=namespace)

    @app.task("report.build", queue="reports", max_attempts=2)
    def build(task) -> None:  # pragma: no cover - not run here
        pass

    res = build.delay("r1", delay="1h", payload={"day": "2026-12-01"})
    assert res.status == "added"
    assert rs.add("report.build", "r1", queue="reports").status == "kept"  # the same task
    t = rs.show("report.build", "r1", queue="reports")
    assert (t.max_attempts, t.payload, t.state) == (2, {"day": "2026-12-01"}, "scheduled")
    assert build.delay("r2", at=res.task.due_ms).task.due_ms == res.task.due_ms
    app.close()


def test_bad_declarations_name_the_argument() -> None:
    app = App()
    with pytest.raises(BadInput, match="@app.task type"):
        app.task("not a type")
    with pytest.raises(BadInput, match="timeout"):
        app.task("a.b", timeout="soon")
    with pytest.raises(BadInput, match="schedule"):
        app.cron("61 * * * *")(lambda run: None)
    with pytest.raises(BadInput, match="concurrency"):
        app.cron("* * * * *", concurrency="sometimes")(lambda run: None)
    with pytest.raises(BadInput, match="ttl"):
        app.locked("x", ttl="1ms")
    with pytest.raises(BadInput, match="@app.task rate_limit.*N/DUR"):
        app.task("a.b", rate_limit="fast")


MAIL_APP = textwrap.dedent(
    """
    from rsched import App

    app = App()

    @app.task("mail.send", rate_limit="5/1s")
    def send(task):
        pass

    @app.task("mail.log")
    def log(task):
        pass
    """
)


def test_a_task_rate_limit_holds_back_its_type_across_workers(cli: Cli, tmp_path: Path, rs) -> None:
    """@app.task(rate_limit=...): at most N runs of that type in any window, by two
    workers together; the other task type of the queue is not held up by it."""
    (tmp_path / "mailapp.py").write_text(MAIL_APP)
    for i in range(15):
        rs.add("mail.send", str(i))
    for i in range(30):
        rs.add("mail.log", str(i))
    for _ in range(2):
        cli.spawn("run", "worker", "mailapp:app", "--concurrency", "4")
    recs = wait_for(
        lambda: (r := records(cli, queue="default")) and len(r) == 45 and r,
        timeout=30,
        what="every run",
    )
    sent = sorted(r["claimed_ms"] for r in recs if r["type"] == "mail.send")
    logged = [r["claimed_ms"] for r in recs if r["type"] == "mail.log"]
    assert all(sent[i + 5] - sent[i] >= 1000 for i in range(len(sent) - 5)), sent
    assert max(logged) < sent[-1] - 1000, "mail.log waited behind the throttled type"
    [q] = cli.json("queues")
    assert q["type_rate_limits"] == {"mail.send": "5/1s"}


def test_run_worker_refuses_what_is_not_an_app(cli: Cli, appdir: Path) -> None:
    (appdir / "notapp.py").write_text("app = 42\n")
    res = cli("run", "worker", "notapp:app", check=2)
    assert "MODULE:ATTR" in res.stderr and "not an rsched.App" in res.stderr
    res = cli("run", "worker", "nosuchmodule:app", check=2)
    assert "cannot import" in res.stderr


def test_async_client_on_a_partitioned_queue(server, namespace: str, rs) -> None:
    rs.add("p.t", "seed", queue="parts", partitions=4, delay="1h")

    async def main() -> None:
        ars = AsyncRsched.from_url(server.url, namespace=namespace)
        try:
            res = await asyncio.gather(
                *(ars.add("p.t", str(i), queue="parts", delay="1h") for i in range(40))
            )
            assert len({r.task.id for r in res}) == 40
            assert (await ars.show("p.t", "7", queue="parts")).state == "scheduled"
            assert await ars.cancel("p.t", "8", queue="parts") == "scheduled"
            with pytest.raises(BadInput, match="partitions"):
                await ars.add("p.t", "x", queue="parts", partitions=4)
        finally:
            await ars.close()

    asyncio.run(main())
    # where the synchronous client (and so every consumer) looks for them
    assert rs.show("p.t", "39", queue="parts").state == "scheduled"
    with pytest.raises(NotFound):
        rs.show("p.t", "8", queue="parts")
    stored = {rs.add("p.t", str(i), queue="parts").stored_queue for i in range(40)}
    assert len(stored) > 1  # spread over the partitions


@pytest.mark.parametrize("cron", [False, True], ids=["tasks", "tasks+crons"])
def test_worker_systemd_notify_and_metrics(
    cli: Cli, appdir: Path, tmp_path: Path, cron: bool
) -> None:
    import socket
    import urllib.request

    from tests.support import free_port

    path = f"/tmp/rsched-worker-notify-{os.getpid()}-{tmp_path.name[-12:]}.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(15)
    port = free_port()
    try:
        env = {"APP_OUT": str(appdir / "out"), "NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000"}
        if cron:
            env["APP_CRON"] = "1"
        p = cli.spawn("run", "worker", "shopapp:app", "--metrics-port", str(port), env=env)
        seen: list[str] = []
        for field in ("READY=1", "WATCHDOG=1"):
            while field not in seen:
                seen += s.recv(4096).decode().split("\n")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            assert b"rsched_" in r.read()
        p.send_signal(signal.SIGTERM)
        while "STOPPING=1" not in seen:
            seen += s.recv(4096).decode().split("\n")
        assert p.wait(15) == 0
    finally:
        s.close()
        os.unlink(path)


def test_worker_bad_options_exit_2_before_connecting(cli: Cli, appdir: Path) -> None:
    res = cli(
        "--redis-url",
        "redis://127.0.0.1:1/0",
        "run",
        "worker",
        "shopapp:app",
        "--concurrency",
        "0",
        env={"APP_OUT": str(appdir / "out")},
        check=2,
    )
    assert "--concurrency" in res.stderr
    (appdir / "badcron.py").write_text(
        "from rsched import App\napp = App()\n@app.cron('61 * * * *')\ndef f(run): pass\n"
    )
    res = cli("run", "worker", "badcron:app", check=2)
    assert "schedule" in res.stderr


def test_a_worker_of_crons_only_runs_and_stops_on_sigterm(cli: Cli, appdir: Path) -> None:
    (appdir / "cronsonly.py").write_text(
        textwrap.dedent(
            """
            import os
            from rsched import App
            app = App()
            @app.cron("* * * * * ?")
            def beat(run):
                with open(os.path.join(os.environ["APP_OUT"], "beats"), "a") as fh:
                    fh.write(f"{run.name} {run.fire_ms}\\n")
            """
        )
    )
    p = cli.spawn("run", "worker", "cronsonly:app", env={"APP_OUT": str(appdir / "out")})
    beats = appdir / "out" / "beats"
    wait_for(lambda: lines(beats), timeout=15, what="a beat")
    assert lines(beats)[0].split()[0] == "cronsonly.beat"  # the default name: module.function
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 0


def test_worker_alert_flags_tell_of_a_dead_task(cli: Cli, appdir: Path, rs) -> None:
    """`run worker` takes the run loops' --alert-command: a task that times out on
    its last attempt is one task.dead event, delivered to the sink."""
    from tests.integration.events.sinks import appender
    from tests.integration.events.sinks import lines as events_of

    out = appdir / "events.jsonl"
    w = worker(cli, appdir, "--alert-command", appender(out))
    try:
        rs.add("order.slow", "s9")
        got = wait_for(
            lambda: [e for e in events_of(out) if e["event"] == "task.dead"],
            timeout=30,
            what="the task.dead event at the sink",
        )
        assert [(e["type"], e["id"], e["result"], e["kind"]) for e in got] == [
            ("order.slow", "s9", "timeout", "task")
        ]
    finally:
        w.send_signal(signal.SIGTERM)
        assert w.wait(timeout=30) == 0
