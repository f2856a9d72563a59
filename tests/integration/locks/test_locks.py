"""Owned locks: fencing tokens, owner-checked renew/release, the watchdog,
`rsched locks` and `rsched unlock`."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from rsched.api import Rsched
from rsched.core.errors import BadInput, Conflict, LockHeld, NotFound
from rsched.locks.admin import list_locks, unlock
from rsched.locks.exec import make_exec_spec
from rsched.locks.lock import Lock
from tests.proxy import TcpProxy
from tests.support import ROOT, Cli, wait_for


def test_context_manager_yields_increasing_fencing_tokens(rs: Rsched) -> None:
    tokens = []
    for _ in range(3):
        with rs.lock("job", ttl_ms=5000) as tok:
            tokens.append(tok)
            assert rs.redis.exists(rs.keys.lock("job").lock)
        assert not rs.redis.exists(rs.keys.lock("job").lock)
    assert tokens == sorted(tokens) and len(set(tokens)) == 3


def test_busy_lock_raises_or_waits(rs: Rsched) -> None:
    with rs.lock("busy", ttl_ms=5000):
        with pytest.raises(LockHeld) as e:
            with rs.lock("busy"):
                pass
        assert "fencing token" in str(e.value)
    done = threading.Event()

    def hold() -> None:
        with rs.lock("busy2", ttl_ms=5000):
            done.wait(5)

    t = threading.Thread(target=hold)
    t.start()
    wait_for(lambda: rs.redis.exists(rs.keys.lock("busy2").lock), what="holder")
    threading.Timer(0.3, done.set).start()
    with rs.lock("busy2", wait=5) as tok:
        assert tok == 2
    t.join()


def test_renew_and_release_only_by_owner(rs: Rsched) -> None:
    a = Lock(rs, "own", ttl_ms=5000, watchdog=False)
    b = Lock(rs, "own", ttl_ms=5000, watchdog=False)
    assert a.acquire() == 1
    assert b.renew() == 0  # not the owner
    assert b.release() is False
    assert rs.redis.hget(rs.keys.lock("own").lock, "token") == "1"
    assert a.renew() == 1
    assert a.release() is True
    assert a.release() is False  # already released: never deletes someone else's


def test_watchdog_keeps_lock_past_ttl_and_reports_loss(rs: Rsched) -> None:
    lost: list[str] = []
    lk = Lock(rs, "dog", ttl_ms=600, on_lost=lost.append)
    with lk as tok:
        key = rs.keys.lock("dog").lock
        # Three TTLs later it is still ours: the watchdog renews every TTL/3.
        wait_for(
            lambda: rs.redis.pttl(key) > 0 and lk._watchdog and lk._watchdog._last_ok, timeout=2
        )
        first = rs.redis.hget(key, "since")
        threading.Event().wait(1.8)  # the condition under test is elapsed time itself
        assert rs.redis.hget(key, "token") == str(tok) and rs.redis.hget(key, "since") == first
        unlock(rs, "dog", force=True)  # an operator takes it away
        wait_for(lambda: lk.lost.is_set(), timeout=2, what="loss noticed")
        assert lost and "expired or was taken" in lost[0]


def test_unlock_by_token(rs: Rsched) -> None:
    lk = Lock(rs, "u", ttl_ms=5000, watchdog=False)
    tok = lk.acquire()
    with pytest.raises(Conflict):
        unlock(rs, "u", str(tok + 1))
    assert unlock(rs, "u", str(tok)) == tok
    with pytest.raises(NotFound):
        unlock(rs, "u", str(tok))


def test_list_locks_fields(rs: Rsched) -> None:
    with rs.lock("alpha", ttl_ms=5000) as tok, rs.lock("beta", ttl_ms=5000):
        rows = list_locks(rs)
        assert [r.name for r in rows] == ["alpha", "beta"]
        j = rows[0].to_json()
        assert {"name", "owner", "host", "pid", "ttl_ms", "held_ms", "token"} <= set(j)
        assert j["token"] == tok and 0 < j["ttl_ms"] <= 5000 and j["held_ms"] >= 0
        assert [r.name for r in list_locks(rs, "al*")] == ["alpha"]


def test_cli_locks_and_unlock(cli: Cli, rs: Rsched) -> None:
    lk = Lock(rs, "cli-lock", ttl_ms=10_000, watchdog=False)
    tok = lk.acquire()
    rows = cli.json("locks")
    assert rows[0]["name"] == "cli-lock" and rows[0]["token"] == tok
    assert rows[0]["owner"] == f"{rows[0]['host']}:{rows[0]['pid']}"
    assert cli.json("locks", "nomatch*") == []
    r = cli("unlock", "cli-lock", "--token", str(tok + 5))
    assert r.returncode == 4, r.stderr
    assert cli("unlock", "cli-lock").returncode == 2  # neither --token nor --force
    cli("unlock", "cli-lock", "--token", str(tok), check=0)
    assert cli("unlock", "cli-lock", "--force").returncode == 3
    assert cli("unlock", "bad name!", "--force").returncode == 2


def test_cli_unlock_json_and_messages_name_the_lock(cli: Cli, rs: Rsched) -> None:
    tok = Lock(rs, "j-lock", ttl_ms=10_000, watchdog=False).acquire()
    res = cli("unlock", "j-lock", "--token", str(tok + 1))
    assert res.returncode == 4
    assert res.stderr == (
        f'rsched: error: lock "j-lock" is held with fencing token {tok}, not {tok + 1}\n'
    )
    res = cli("unlock", "j-lock", "--token", str(tok), "--json", check=0)
    assert json.loads(res.stdout) == {"name": "j-lock", "released": True, "token": tok}
    assert res.stderr == ""
    res = cli("unlock", "j-lock", "--force")
    assert res.returncode == 3 and res.stderr == 'rsched: error: no lock "j-lock" is held\n'
    tok = Lock(rs, "j-lock", ttl_ms=10_000, watchdog=False).acquire()
    res = cli("--format", "json", "unlock", "j-lock", "--force", check=0)  # the global option too
    assert json.loads(res.stdout) == {"name": "j-lock", "released": True, "token": tok}
    res = cli("unlock", "j-lock", "--force", "--format", "plain")
    assert res.returncode == 3


WORKER = """
import sys, time
from rsched.api import Rsched
rs = Rsched.from_url(sys.argv[1], sys.argv[2])
out = sys.argv[3]
for _ in range(10):
    with rs.lock("shared", ttl_ms=2000, wait=30) as token:
        with open(out, "a") as fh:
            fh.write(f"enter {token}\\n")
        time.sleep(0.005)
        with open(out, "a") as fh:
            fh.write(f"leave {token}\\n")
"""


def test_mutual_exclusion_across_processes(server: Any, rs: Rsched, tmp_path: Any) -> None:
    out = tmp_path / "trace"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, server.url, rs.namespace, str(out)], cwd=str(ROOT)
        )
        for _ in range(5)
    ]
    assert [p.wait(120) for p in procs] == [0] * 5
    events = [line.split() for line in out.read_text().splitlines()]
    assert len(events) == 100
    tokens = []
    for i in range(0, 100, 2):  # strictly enter/leave pairs: never two holders at once
        (e, t1), (leave, t2) = events[i], events[i + 1]
        assert (e, leave) == ("enter", "leave") and t1 == t2, events[i : i + 2]
        tokens.append(int(t1))
    assert tokens == sorted(tokens) and len(set(tokens)) == 50  # fencing tokens strictly increase


# --- a partitioned holder learns it lost the lock before anyone else can take it ---------
def _took(lk: Lock) -> float | None:
    """Monotonic time ``lk`` got the lock on this try, else None."""
    return time.monotonic() if isinstance(lk.try_acquire(), int) else None


@pytest.mark.parametrize(
    "ttl_ms", [1000, 2000, pytest.param(30_000, marks=pytest.mark.slow, id="30000")]
)
def test_partitioned_holder_declares_loss_before_the_lease_can_expire(
    server: Any, rs: Rsched, namespace: str, ttl_ms: int
) -> None:
    """The holder talks to Redis through a proxy that stops forwarding (nothing is
    closed: its renewal just gets no answer, for the 10 s socket timeout). ``on_lost``
    fires before the lease can have expired: less than a TTL after the send of the
    last renewal that got through, and before another client takes the lock."""
    ttl = ttl_ms / 1000
    with TcpProxy(server.port) as proxy:
        holder_rs = Rsched.from_url(proxy.url, namespace)
        lost: list[tuple[float, str]] = []
        lk = Lock(
            holder_rs, "part", ttl_ms=ttl_ms, on_lost=lambda r: lost.append((time.monotonic(), r))
        )
        tok = lk.acquire()
        dog = lk._watchdog
        assert dog is not None
        first = dog.last_ok
        wait_for(lambda: dog.last_ok > first, timeout=ttl * 2, what="a renewal")
        proxy.cut()
        other = Lock(rs, "part", ttl_ms=ttl_ms, watchdog=False)  # straight to the server
        took = wait_for(lambda: _took(other), timeout=ttl * 2 + 5, what="the lease to expire")
        wait_for(lambda: lost, timeout=15, what="on_lost")
        lost_t, reason = lost[0]
        assert other.token == tok + 1
        assert lost_t < took, "on_lost fired after another client held the lock"
        assert lost_t - dog.last_ok < ttl  # from the send time of the last renewal that succeeded
        assert lost_t < proxy.last_to_server + ttl  # nothing after that reached the server
        assert lk.lost.is_set() and "no renewal got through" in reason
        proxy.restore()
        assert lk.release() is False  # it is the other's now: left alone
        assert rs.redis.hget(rs.keys.lock("part").lock, "token") == str(tok + 1)
        holder_rs.redis.close()


#: A job that holds an flock while it lives and ignores SIGTERM: only SIGKILL stops it.
STUBBORN_JOB = """
import fcntl, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
fh = open(sys.argv[1], "a+")
fcntl.flock(fh, fcntl.LOCK_EX)
open(sys.argv[2], "w").write("running")
while True:
    time.sleep(1)
"""


def _job_alive(path: Any) -> bool:
    """True while the job holds its flock (it is released when the process dies)."""
    import fcntl

    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False


@pytest.mark.parametrize("ttl", ["1s", "2s"])
def test_partitioned_exec_kills_its_job_before_another_host_gets_the_lock(
    server: Any, cli: Cli, rs: Rsched, tmp_path: Any, ttl: str
) -> None:
    """`rsched exec` whose connection is cut: its job (which ignores SIGTERM) is dead
    before the lease can have expired, so before another host can run it."""
    flock, ready = tmp_path / "job.lock", tmp_path / "ready"
    ttl_ms = int(ttl[:-1]) * 1000
    with TcpProxy(server.port) as proxy:
        p = cli.spawn(
            "-v", "exec", "--lock", "pexec", "--ttl", ttl, "--",
            sys.executable, "-c", STUBBORN_JOB, str(flock), str(ready),
            env={"RSCHED_REDIS_URL": proxy.url},
        )  # fmt: skip
        wait_for(ready.exists, timeout=30, what="the job running")
        key = rs.keys.lock("pexec").lock
        tok = int(rs.redis.hget(key, "token"))
        # a renewal went through (the lease was set again after it was taken)
        low = wait_for(lambda: (t := rs.redis.pttl(key)) < ttl_ms * 0.8 and t, what="time passing")
        wait_for(lambda: rs.redis.pttl(key) > low + 50, timeout=ttl_ms / 500, what="a renewal")
        proxy.cut()
        assert _job_alive(flock)
        other = Lock(rs, "pexec", ttl_ms=ttl_ms, watchdog=False)
        wait_for(lambda: _took(other), timeout=ttl_ms / 500 + 5, what="the lease to expire")
        assert not _job_alive(flock), "the job still ran when another host got the lock"
        assert other.token == tok + 1
        proxy.restore()
        out, err = p.communicate(timeout=60)
        assert p.returncode == 128 + signal.SIGKILL, err
        assert "lost: no renewal got through" in err
        rec = cli.json("history", "pexec")[0]
        assert rec["result"] == "lost" and rec["token"] == tok


# --- a dropped lock is not renewed forever ----------------------------------------------
def test_a_dropped_lock_stops_being_renewed_and_says_so(rs: Rsched) -> None:
    lk = Lock(rs, "dropped", ttl_ms=600)
    lk.acquire()
    dog = lk._watchdog
    assert dog is not None
    first = dog.last_ok
    wait_for(lambda: dog.last_ok > first, timeout=2, what="a renewal")
    with pytest.warns(RuntimeWarning, match="'dropped' .* garbage-collected while held"):
        del lk
        gc.collect()
    assert dog.stopped
    key = rs.keys.lock("dropped").lock
    wait_for(lambda: not rs.redis.exists(key), timeout=5, what="the lease to run out")
    dog.join(2)
    assert not dog._thread.is_alive()


def test_a_released_or_lost_lock_is_collected_without_a_warning(rs: Rsched) -> None:
    lk = Lock(rs, "tidy", ttl_ms=600)
    with lk:
        pass
    dog = lk._watchdog
    del lk
    gc.collect()  # filterwarnings=error: a warning here would fail the test
    assert dog is not None and dog.stopped


# --- wait=-1 is refused -----------------------------------------------------------------
@pytest.mark.parametrize("bad", [-1, -0.001, float("nan"), "5", True])
def test_a_negative_or_nonsense_wait_is_refused(rs: Rsched, bad: Any) -> None:
    with pytest.raises(BadInput) as e:
        Lock(rs, "w", wait=bad)
    assert e.value.field == "wait"
    with pytest.raises(BadInput):
        rs.lock("w", wait=bad)
    assert not rs.redis.exists(rs.keys.lock("w").lock, rs.keys.lock("w").fence)


def test_exec_wait_timeouts_that_are_not_positive_are_refused(cli: Cli, rs: Rsched) -> None:
    for bad in (-1, 0, 1.5, True):
        with pytest.raises(BadInput) as e:
            make_exec_spec("w", ["true"], if_locked="wait", wait_timeout=bad)  # type: ignore[arg-type]
        assert e.value.field == "--wait-timeout"
    down = {"RSCHED_REDIS_URL": "redis://127.0.0.1:1/0"}  # refused before connecting
    for bad in ("-1s", "0s", "-1"):
        r = cli(
            "exec",
            "--lock",
            "w",
            "--if-locked",
            "wait",
            f"--wait-timeout={bad}",
            "--",
            "true",
            env=down,
        )
        assert r.returncode == 2 and "--wait-timeout" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    assert not rs.redis.exists(rs.keys.lock("w").lock, rs.keys.lock("w").fence)


# --- a release wakes a waiter: a notification, not a poll -------------------------------
def _script_calls(client: Any) -> int:
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


def _blocked(client: Any) -> int:
    return int(client.info("clients")["blocked_clients"])


def test_a_waiter_is_woken_by_the_release_not_by_polling(own_server: Any, namespace: str) -> None:
    admin = own_server.client()
    rs = Rsched(own_server.client(), namespace)
    with Lock(rs, "warm-up", watchdog=False):  # the scripts are loaded: one call each from here
        pass
    holder = Lock(rs, "hand", ttl_ms=60_000, watchdog=False)
    tok = holder.acquire()
    got: list[int] = []
    waiter = Lock(
        Rsched(own_server.client(), namespace), "hand", ttl_ms=60_000, wait=60, watchdog=False
    )
    t = threading.Thread(target=lambda: got.append(waiter.acquire()))
    t.start()
    wait_for(lambda: _blocked(admin) == 1, what="the waiter blocked on the wake key")
    before = _script_calls(admin)
    # Elapsed time is the condition under test: a poller (50 ms doubling to 1 s) would
    # have tried 4 times by now.
    threading.Event().wait(1.6)
    assert _script_calls(admin) == before, "the waiter tried again while the lock was held"
    assert _blocked(admin) == 1
    assert holder.release() is True
    t.join(10)
    assert got == [tok + 1]
    assert _script_calls(admin) == before + 2  # the release, and the waiter's one try
    assert waiter.release() is True


def test_a_waiter_gets_a_lock_whose_lease_ran_out(rs: Rsched) -> None:
    """No release, no wake-up: the wait is bounded by the holder's TTL (the safety net)."""
    Lock(rs, "lapse", ttl_ms=800, watchdog=False).acquire()  # never released
    with rs.lock("lapse", ttl_ms=5000, wait=20) as tok:
        assert tok == 2


def test_unlock_wakes_a_waiter(own_server: Any, namespace: str) -> None:
    admin = own_server.client()
    rs = Rsched(own_server.client(), namespace)
    tok = Lock(rs, "op", ttl_ms=60_000, watchdog=False).acquire()
    got: list[int] = []
    t = threading.Thread(
        target=lambda: got.append(Lock(rs, "op", wait=60, watchdog=False).acquire())
    )
    t.start()
    wait_for(lambda: _blocked(admin) == 1, what="the waiter blocked")
    assert unlock(rs, "op", str(tok)) == tok
    t.join(10)
    assert got == [tok + 1]


def test_exec_if_locked_wait_is_woken_by_the_release(
    own_server: Any, namespace: str, tmp_path: Any
) -> None:
    admin = own_server.client()
    rs = Rsched(own_server.client(), namespace)
    holder = Lock(rs, "xw", ttl_ms=60_000, watchdog=False)
    holder.acquire()
    cli = Cli(own_server, namespace, cwd=str(tmp_path))
    marker = tmp_path / "ran"
    try:
        p = cli.spawn("exec", "--lock", "xw", "--if-locked", "wait", "--", "touch", str(marker))
        wait_for(lambda: _blocked(admin) == 1, timeout=30, what="exec blocked on the wake key")
        before = _script_calls(admin)
        threading.Event().wait(1.6)  # the condition under test: exec polled every <= 0.5 s
        assert _script_calls(admin) == before and not marker.exists()
        holder.release()
        assert p.wait(30) == 0 and marker.exists()
    finally:
        cli.close()


#: A cron job: when no other run of it is alive (its flock is free) it says "free", takes
#: the flock and runs until SIGKILL (it ignores SIGTERM); else it says "busy" and exits.
CRON_JOB = """
import fcntl, os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
fh = open(sys.argv[1], "a+")
try:
    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    open(sys.argv[2], "a").write(f"busy {os.getpid()}\\n")
    sys.exit(0)
open(sys.argv[2], "a").write(f"free {os.getpid()}\\n")
while True:
    time.sleep(1)
"""


def test_partitioned_cron_runner_kills_its_job_before_another_runner_runs_it(
    server: Any, cli: Cli, tmp_path: Any
) -> None:
    """Two `run cron` runners of one every-second cron (--concurrency forbid); the one
    whose job runs has its link cut. The other runs the next job only once the lease
    ran out, and by then the first job is dead (the job checks it with an flock)."""
    flock, log = tmp_path / "job.lock", tmp_path / "runs"
    cmd = ["--", sys.executable, "-c", CRON_JOB, str(flock), str(log)]
    opts = ["-v", "run", "cron", "pc", "--schedule", "*/1 * * * * *", "--ttl", "2s"]
    with TcpProxy(server.port) as proxy:
        a = cli.spawn(*opts, *cmd, env={"RSCHED_REDIS_URL": proxy.url})
        runs = lambda: log.read_text().split("\n")[:-1] if log.exists() else []  # noqa: E731
        try:
            wait_for(runs, timeout=30, what="the first runner's job")
            b = cli.spawn(*opts, *cmd)
            wait_for(
                lambda: any(r["result"] == "skipped" for r in cli.json("history", "pc")),
                timeout=30,
                what="the second runner skipping a tick (forbid)",
            )
            proxy.cut()
            wait_for(lambda: len(runs()) >= 2, timeout=20, what="the second runner's job")
            assert runs()[1].startswith("free"), f"the first job was still alive: {runs()}"
            assert b.poll() is None and a.poll() is None
        finally:
            proxy.restore()
            cli.close()
            for line in runs():
                try:
                    os.kill(int(line.split()[1]), signal.SIGKILL)
                except ProcessLookupError:
                    pass
