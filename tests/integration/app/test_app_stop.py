"""A Python task handler is stopped like a command handler: when its lease is
lost, when the task is cancelled while it runs, at the end of the shutdown
grace (real `rsched run worker` processes; its work provably does not go on:
the file it would write after the point of stop never appears). Also
`fn.at(...)` and the loop options of `run worker`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest

from rsched import App
from tests.support import Cli, wait_for

APP = textwrap.dedent(
    """
    import asyncio, os, time
    from rsched import App

    app = App()
    OUT = os.environ["APP_OUT"]

    def note(name, text=""):
        with open(os.path.join(OUT, name), "a") as fh:
            fh.write(text + "\\n")

    def hold(task):
        # until the test lets it go (it never does when the handler was stopped)
        while not os.path.exists(os.path.join(OUT, "go")):
            time.sleep(0.02)

    @app.task("job.work", timeout="60s", lease="1s")
    def work(task):
        note(f"{task.id}.pid", str(os.getpid()))
        try:
            hold(task)
            note(f"{task.id}.after", task.id)
        finally:
            note(f"{task.id}.finally", task.id)

    @app.task("job.stubborn", timeout="60s")
    def stubborn(task):
        note(f"{task.id}.pid", str(os.getpid()))
        while True:
            try:
                hold(task)
                note(f"{task.id}.after", task.id)
                return
            except SystemExit:
                note(f"{task.id}.term", task.id)  # ignores the SIGTERM ...

    @app.task("job.async", timeout="60s", lease="1s")
    async def awork(task):
        note(f"{task.id}.started", task.id)
        try:
            while not os.path.exists(os.path.join(OUT, "go")):
                await asyncio.sleep(0.02)
            note(f"{task.id}.after", task.id)
        except asyncio.CancelledError:
            note(f"{task.id}.cancelled", task.id)
            raise

    @app.task("mail.send", queue="mail")
    def send(task):
        note("mail", task.id)

    @app.cron("* * * * * ?", name="stop.tick")
    def tick(run):
        note("ticks", str(run.fire_ms))
    """
)


@pytest.fixture
def appdir(tmp_path: Path) -> Path:
    (tmp_path / "stopapp.py").write_text(APP)
    (tmp_path / "out").mkdir()
    return tmp_path


def worker(cli: Cli, appdir: Path, *args: str) -> tuple[subprocess.Popen[str], Path]:
    err = appdir / f"worker-{len(cli.procs)}.err"
    with err.open("w") as fh:  # (the worker has its own copy)
        p = cli.spawn(
            "run",
            "worker",
            "stopapp:app",
            "--no-crons",
            *args,
            env={"APP_OUT": str(appdir / "out")},
            stderr=fh,
        )
    return p, err


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie not reaped yet is not running either
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def started(appdir: Path, task_id: str) -> int:
    f = appdir / "out" / f"{task_id}.pid"
    return int(wait_for(lambda: f.exists() and f.read_text().strip(), 15, what="handler running"))


def let_go_and_check(appdir: Path, task_id: str) -> None:
    """The handler's process is gone: letting it go now cannot make it write."""
    (appdir / "out" / "go").touch()
    assert not (appdir / "out" / f"{task_id}.after").exists()


def results(rs, queue: str = "default") -> list[str]:
    hist = rs.redis.xrange(rs.keys.queue(queue).history)
    return [json.loads(f["j"])["result"] for _, f in hist]


def test_a_lost_lease_kills_a_forked_python_handler(cli: Cli, appdir: Path, rs) -> None:
    rs.add("job.work", "w1", max_attempts=1)
    p, err = worker(cli, appdir)
    pid = started(appdir, "w1")
    # its lease is gone (reaped by another consumer, say): the next heartbeat finds it lost
    rs.redis.zrem(rs.keys.queue("default").proc, "job.work w1")
    wait_for(lambda: not alive(pid), timeout=10, what="the handler killed (lease lost)")
    wait_for(lambda: "lease lost for job.work w1" in err.read_text(), 10, what="log line")
    let_go_and_check(appdir, "w1")
    assert not (appdir / "out" / "w1.finally").exists()  # SIGKILL: nothing more ran
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 0
    assert rs.redis.hget(rs.keys.queue("default").stats, "ok|job.work") is None


def test_a_lost_lease_cancels_an_async_handler(cli: Cli, appdir: Path, rs) -> None:
    rs.add("job.async", "a1", max_attempts=1)
    p, err = worker(cli, appdir)
    wait_for(lambda: (appdir / "out" / "a1.started").exists(), 15, what="handler running")
    rs.redis.zrem(rs.keys.queue("default").proc, "job.async a1")
    wait_for(lambda: (appdir / "out" / "a1.cancelled").exists(), 10, what="coroutine cancelled")
    let_go_and_check(appdir, "a1")
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 0
    assert not (appdir / "out" / "a1.after").exists()
    assert "lease lost for job.async a1" in err.read_text()


def test_cancel_terminates_a_forked_handler_and_records_cancelled(
    cli: Cli, appdir: Path, rs
) -> None:
    rs.add("job.work", "c1")
    p, err = worker(cli, appdir, "--grace", "5s")
    pid = started(appdir, "c1")
    assert cli.json("cancel", "job.work", "c1")["was"] == "processing"
    # SIGTERM: SystemExit in the handler, its finally ran, well before the grace's SIGKILL
    wait_for(lambda: not alive(pid), timeout=4, what="the handler stopped by SIGTERM")
    assert (appdir / "out" / "c1.finally").read_text().split() == ["c1"]
    let_go_and_check(appdir, "c1")
    wait_for(lambda: "its handler stopped" in err.read_text(), 10, what="settled")
    assert results(rs) == ["cancelled"]
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 0


def test_cancel_sigkills_a_forked_handler_that_ignores_sigterm_after_the_grace(
    cli: Cli, appdir: Path, rs
) -> None:
    rs.add("job.stubborn", "s1")
    p, err = worker(cli, appdir, "--grace", "1s")
    pid = started(appdir, "s1")
    cli("cancel", "job.stubborn", "s1", check=0)
    wait_for(lambda: (appdir / "out" / "s1.term").exists(), 10, what="SIGTERM seen")
    assert "SIGKILL after 1s" in err.read_text()
    wait_for(lambda: not alive(pid), timeout=10, what="SIGKILL after the grace")
    let_go_and_check(appdir, "s1")
    assert results(rs) == ["cancelled"]
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 0


def test_end_of_the_shutdown_grace_kills_a_forked_handler_and_releases_its_task(
    cli: Cli, appdir: Path, rs
) -> None:
    rs.add("job.work", "g1")
    p, err = worker(cli, appdir, "--grace", "1s")
    pid = started(appdir, "g1")
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 0
    assert not alive(pid)
    let_go_and_check(appdir, "g1")
    assert "killed 1 unfinished handler" in err.read_text()
    assert rs.show("job.work", "g1").state == "due"  # given back, to run again


def test_run_worker_queue_filter_and_no_crons(cli: Cli, appdir: Path, rs) -> None:
    rs.add("mail.send", "m1", queue="mail")
    rs.add("job.work", "x1")
    p, err = worker(cli, appdir, "--queue", "mail")
    wait_for(lambda: (appdir / "out" / "mail").exists(), 15, what="the mail task ran")
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 0
    assert not (appdir / "out" / "x1.pid").exists()  # not its queue
    assert rs.show("job.work", "x1").state == "due"
    assert not (appdir / "out" / "ticks").exists()  # --no-crons


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--queue", "nosuch"], "--queue"),
        (["--queue", "bad queue"], "queue"),
        (["--grace", "soon"], "--grace"),
        (["--partitions", "0"], "partitions"),
        (["--wait-replicas", "x"], "--wait-replicas"),
        (["--wait-replicas-timeout", "x"], "--wait-replicas-timeout"),
    ],
)
def test_run_worker_loop_options_refused_before_connecting(
    cli: Cli, appdir: Path, rs, args: list[str], field: str
) -> None:
    res = cli(
        "run",
        "worker",
        "stopapp:app",
        *args,
        env={"APP_OUT": str(appdir / "out"), "RSCHED_REDIS_URL": "redis://127.0.0.1:1/0"},
        timeout=20,
    )
    assert res.returncode == 2, res.stderr
    assert field in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_at_schedules_like_delay_at(server, namespace: str, rs) -> None:
    app = App(url=server.url, namespace=namespace)

    @app.task("report.build", queue="reports", max_attempts=2)
    def build(task) -> None:  # pragma: no cover - not run here
        pass

    res = build.delay("r0", delay="1h")
    due = res.task.due_ms
    got = build.at("r1", due, payload={"n": 1})
    assert got.status == "added" and got.task.due_ms == due
    t = rs.show("report.build", "r1", queue="reports")
    assert (t.max_attempts, t.payload, t.state, t.due_ms) == (2, {"n": 1}, "scheduled", due)
    iso = build.at("r2", "2099-01-01T00:00:00Z")
    assert iso.task.due_ms == 4070908800000
    app.close()
