"""`rsched run expired`: keyspace-notification triggers, against real servers
and real subscriber processes. Every wait is a deadline on a condition."""

from __future__ import annotations

import signal
import subprocess
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from rsched.api import Rsched
from rsched.core.keys import ExpiredKeys
from rsched.expired import arm, disarm
from rsched.expired.notify import glob_regex, notify_flags_ok
from tests.support import Cli, RedisServer, wait_for

# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def ks_server() -> Iterator[RedisServer]:
    """Publishes expiry events; DEBUG allowed (to hold active expiry off in one test)."""
    s = RedisServer(extra=["notify-keyspace-events Ex", "enable-debug-command yes"]).start()
    yield s
    s.stop()


@pytest.fixture
def kcli(ks_server: RedisServer, namespace: str, tmp_path: Path) -> Iterator[Cli]:
    c = Cli(ks_server, namespace, cwd=str(tmp_path))
    yield c
    c.close()


@pytest.fixture
def krs(ks_server: RedisServer, namespace: str) -> Rsched:
    return Rsched(ks_server.client(), namespace)


@pytest.fixture(autouse=True)
def _slow_only_when_asked(request: pytest.FixtureRequest) -> None:
    """``slow`` tests (a frozen Redis noticed by PING) run with ``-m slow`` only."""
    if request.node.get_closest_marker("slow") and "slow" not in (
        request.config.getoption("markexpr") or ""
    ):
        pytest.skip("slow: run with -m slow")


# ----------------------------------------------------------------------------- helpers


def handler(tmp_path: Path, name: str = "h.sh", extra: str = "") -> tuple[Path, Path]:
    """A handler that appends one line per run: its arguments (|-joined) and env."""
    out = tmp_path / f"{name}.out"
    p = tmp_path / name
    p.write_text(
        "#!/bin/sh\n"
        + textwrap.dedent(
            f"""\
            {extra}
            in=$(cat)
            line=""
            for a in "$@"; do line="$line|$a"; done
            printf '%s\\t%s\\t%s\\t%s\\t%s\\n' "$line" "$RSCHED_KEY" "$RSCHED_FIRED_BY" \\
                "${{RSCHED_EXPIRE_AT:-}}" "$in" >> '{out}'
            """
        )
    )
    p.chmod(0o755)
    return p, out


def runs(out: Path) -> list[list[str]]:
    if not out.exists():
        return []
    return [line.split("\t") for line in out.read_text().splitlines()]


def start(
    cli: Cli, tmp_path: Path, *args: str, name: str = "sub"
) -> tuple[subprocess.Popen[str], Path]:
    """A `run expired -v` process; its stderr goes to a file we can read while it runs."""
    err_path = tmp_path / f"{name}.err"
    with open(err_path, "w") as err:
        p = cli.spawn("-v", "run", "expired", *args, stdout=subprocess.DEVNULL, stderr=err)
    return p, err_path


def subscribed(server: RedisServer, n: int) -> None:
    """Wait until ``n`` clients hold a pattern subscription (our subscribers)."""
    r = server.client()
    wait_for(
        lambda: sum(1 for c in r.client_list() if int(c.get("psub", 0)) > 0) >= n,
        timeout=15,
        what=f"{n} subscriber(s)",
    )


def stop(p: subprocess.Popen[str], err: Path) -> str:
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=15) == 0, err.read_text()
    return err.read_text()


# ----------------------------------------------------------------------------- pure


def test_glob_is_redis_glob() -> None:
    m = glob_regex("order:timeout:*").fullmatch
    assert m("order:timeout:1") and m("order:timeout:") and not m("order:other:1")
    assert glob_regex("a?c").fullmatch("abc") and not glob_regex("a?c").fullmatch("ac")
    assert glob_regex("k[0-9]").fullmatch("k7") and not glob_regex("k[0-9]").fullmatch("kx")
    assert glob_regex("k[^0-9]").fullmatch("kx") and not glob_regex("k[^0-9]").fullmatch("k1")
    assert glob_regex(r"a\*b").fullmatch("a*b") and not glob_regex(r"a\*b").fullmatch("axb")
    assert glob_regex("x.y(").fullmatch("x.y(") and not glob_regex("x.y").fullmatch("xzy")
    assert glob_regex("*").fullmatch("multi\nline")


def test_notify_flags() -> None:
    assert notify_flags_ok("Ex") and notify_flags_ok("xE") and notify_flags_ok("AE")
    assert notify_flags_ok("KEA") and notify_flags_ok("Egx")
    assert not notify_flags_ok("") and not notify_flags_ok("Kx") and not notify_flags_ok("Eg")


# ----------------------------------------------------------------------------- input


def test_bad_input_is_refused_before_connecting(cli: Cli, tmp_path: Path) -> None:
    h, _ = handler(tmp_path)
    nowhere = {"RSCHED_REDIS_URL": "redis://127.0.0.1:1/0"}  # would be exit 69 if it connected
    for args, field in (
        (["--handler", str(h)], "--pattern"),
        (["--pattern", "k:*"], "--handler"),
        (["--pattern", "k:*", "--handler", str(h), "--", str(h)], "--handler"),
        (["--pattern", "k:*", "--", "./no-such-program"], "--handler"),
        (["--pattern", "k:*", "--concurrency", "0", "--", str(h)], "--concurrency"),
        (["--pattern", "k:*", "--timeout", "soon", "--", str(h)], "--timeout"),
        (["--pattern", "k:*", "--db", "-1", "--", str(h)], "--db"),
    ):
        res = cli("run", "expired", *args, env=nowhere)
        assert res.returncode == 2, (args, res.stderr)
        assert field in res.stderr, (args, res.stderr)


def test_help_says_the_queue_is_the_reliable_way(cli: Cli) -> None:
    res = cli("run", "expired", "--help", check=0)
    text = " ".join(res.stdout.split())
    assert "reliable way" in text and "fire-and-forget" in text and "lost" in text
    assert "CHANGES THE SERVER'S CONFIG" in text


# ----------------------------------------------------------------------------- firing


def test_key_with_px_fires_once_with_key_as_last_argument(
    kcli: Cli, ks_server: RedisServer, tmp_path: Path, namespace: str
) -> None:
    h, out = handler(tmp_path)
    p, err = start(kcli, tmp_path, "--pattern", f"{namespace}:order:*", "--", str(h), "a b", "c")
    subscribed(ks_server, 1)
    r = ks_server.client()
    key = f"{namespace}:order:1001"
    r.set(key, "x", px=200)
    r.set(f"{namespace}:other:1", "x", px=100)  # does not match: never runs
    wait_for(lambda: runs(out), timeout=10, what="the handler to run")
    log = stop(p, err)
    got = runs(out)
    assert len(got) == 1, got
    args, env_key, by, expire_at, stdin = got[0]
    assert args == f"|a b|c|{key}"  # the handler's own args, then the key, last
    assert env_key == key and by == "event" and expire_at == "" and stdin == ""
    assert "1 fired" in log and "stopped" in log


def test_three_subscribers_fire_each_expiry_exactly_once(
    kcli: Cli, ks_server: RedisServer, krs: Rsched, tmp_path: Path, namespace: str
) -> None:
    h, out = handler(tmp_path)
    procs = [
        start(
            kcli,
            tmp_path,
            "--pattern",
            f"{namespace}:t:*",
            "--backup-sweep",
            "--",
            str(h),
            name=f"s{i}",
        )
        for i in range(3)
    ]
    subscribed(ks_server, 3)
    r = ks_server.client()
    plain = [f"{namespace}:t:plain:{i}" for i in range(40)]
    armed = [f"{namespace}:t:armed:{i}" for i in range(20)]
    pipe = r.pipeline(transaction=False)
    for i, k in enumerate(plain):
        pipe.set(k, "x", px=100 + 10 * i)
    pipe.execute()
    for i, k in enumerate(armed):
        arm(krs, k, 100 + 10 * i, value=f"v{i}")
    want = set(plain) | set(armed)
    wait_for(lambda: {row[1] for row in runs(out)} >= want, timeout=20, what="every key to fire")
    # Let the sweepers pass over the (now empty) set at least once more, then stop.
    wait_for(lambda: krs.redis.zcard(ExpiredKeys.for_namespace(namespace).armed) == 0)
    logs = [stop(p, err) for p, err in procs]
    counts = Counter(row[1] for row in runs(out))
    assert set(counts) == want
    assert all(n == 1 for n in counts.values()), {k: n for k, n in counts.items() if n != 1}
    fired_by = Counter(row[1].split(":")[2] for row in runs(out))
    assert fired_by == {"plain": 40, "armed": 20}
    # every process saw every event: two of three found each one claimed already
    dups = sum(int(log.rsplit(" failed, ", 1)[1].split(" dup")[0]) for log in logs)
    assert dups >= 2 * len(want) - 5, logs
    for row in runs(out):
        if ":armed:" in row[1]:
            assert row[4] == f"v{row[1].rsplit(':', 1)[1]}"  # arm()'s value on stdin
            assert row[3].endswith("Z")


def test_backup_sweep_fires_what_expired_while_no_subscriber_ran(
    kcli: Cli, ks_server: RedisServer, krs: Rsched, tmp_path: Path, namespace: str
) -> None:
    h, out = handler(tmp_path)
    r = ks_server.client()
    ek = ExpiredKeys.for_namespace(namespace)
    lost, lazy, plain = (f"{namespace}:o:lost", f"{namespace}:o:lazy", f"{namespace}:o:plain")
    r.execute_command("DEBUG", "SET-ACTIVE-EXPIRE", "0")
    try:
        arm(krs, lost, 100)
        arm(krs, lazy, 100)
        r.set(plain, "x", px=100)  # not armed: its lost event cannot be recovered
        # Past their expiry. Touching `lost` and `plain` makes Redis delete them now:
        # their events go out while nobody listens. `lazy` stays, expired but not deleted.
        wait_for(lambda: r.exists(lost) + r.exists(plain) == 0, what="the keys to expire")
        assert r.execute_command("DEBUG", "OBJECT", lazy)  # still there: Redis was not asked
        assert r.zcard(ek.armed) == 2
        p, err = start(
            kcli, tmp_path, "--pattern", f"{namespace}:o:*", "--backup-sweep", "--", str(h)
        )
        wait_for(lambda: len(runs(out)) >= 2, timeout=10, what="the sweep to fire both")
        # The sweep's PTTL made Redis delete `lazy`, whose event then reached us too.
        wait_for(lambda: "skip" in err.read_text(), timeout=10, what="the late event")
        log = stop(p, err)
    finally:
        r.execute_command("DEBUG", "SET-ACTIVE-EXPIRE", "1")
    got = Counter((row[1], row[2]) for row in runs(out))
    assert got == {(lost, "sweep"): 1, (lazy, "sweep"): 1}, got
    assert "1 duplicates skipped" in log, log
    assert r.zcard(ek.armed) == 0 and r.hlen(ek.values) == 0


def test_disarmed_key_never_fires(
    kcli: Cli, ks_server: RedisServer, krs: Rsched, tmp_path: Path, namespace: str
) -> None:
    h, out = handler(tmp_path)
    p, err = start(kcli, tmp_path, "--pattern", f"{namespace}:d:*", "--backup-sweep", "--", str(h))
    subscribed(ks_server, 1)
    r = ks_server.client()
    ek = ExpiredKeys.for_namespace(namespace)
    cancelled = f"{namespace}:d:cancelled"
    arm(krs, cancelled, 100)
    assert disarm(krs, cancelled) is True
    assert disarm(krs, cancelled) is False
    # Key and sweep entry went together: no expiry event, nothing for the sweep.
    assert not r.exists(cancelled) and r.zscore(ek.armed, cancelled) is None
    assert not r.hexists(ek.values, cancelled)
    arm(krs, f"{namespace}:d:kept", 400)
    wait_for(lambda: runs(out), timeout=10, what="the kept key to fire")
    stop(p, err)
    assert [row[1] for row in runs(out)] == [f"{namespace}:d:kept"]
    assert r.zcard(ek.armed) == 0


def test_db_option_watches_that_database(
    kcli: Cli, ks_server: RedisServer, tmp_path: Path, namespace: str
) -> None:
    h, out = handler(tmp_path)
    p, err = start(kcli, tmp_path, "--pattern", f"{namespace}:*", "--db", "3", "--", str(h))
    subscribed(ks_server, 1)
    ks_server.client().set(f"{namespace}:db0", "x", px=50)
    ks_server.client(db=3).set(f"{namespace}:db3", "x", px=100)
    wait_for(lambda: runs(out), timeout=10, what="the db 3 key to fire")
    stop(p, err)
    assert [row[1] for row in runs(out)] == [f"{namespace}:db3"]


def test_claim_window_of_unarmed_keys_and_rearmed_keys(
    kcli: Cli, ks_server: RedisServer, krs: Rsched, tmp_path: Path, namespace: str
) -> None:
    """The documented window: a key set with PX by other code that expires again
    within --claim-window is taken for a duplicate; an armed key is not."""
    h, out = handler(tmp_path)
    p, err = start(
        kcli, tmp_path, "--pattern", f"{namespace}:w:*", "--claim-window", "3s", "--", str(h)
    )
    subscribed(ks_server, 1)
    r = ks_server.client()
    ek = ExpiredKeys.for_namespace(namespace)
    plain, armed = f"{namespace}:w:plain", f"{namespace}:w:armed"
    r.set(plain, "x", px=20)
    arm(krs, armed, 20)
    wait_for(lambda: len(runs(out)) == 2, timeout=10, what="the first expiries")
    assert r.pttl(ek.claim(plain)) > 2000
    r.set(plain, "x", px=20)  # again within the window: a duplicate
    arm(krs, armed, 20)  # re-armed: its own firing
    wait_for(lambda: len(runs(out)) == 3, timeout=10, what="the re-armed key")
    wait_for(lambda: "skip" in err.read_text(), timeout=10, what="the duplicate")
    wait_for(lambda: not r.exists(ek.claim(plain)), timeout=10, what="the window to pass")
    r.set(plain, "x", px=20)  # after the window: fires again
    wait_for(lambda: len(runs(out)) == 4, timeout=10)
    stop(p, err)
    assert Counter(row[1] for row in runs(out)) == {plain: 2, armed: 2}


def test_key_name_with_shell_metacharacters_is_one_literal_argument(
    kcli: Cli, ks_server: RedisServer, krs: Rsched, tmp_path: Path, namespace: str
) -> None:
    h, out = handler(tmp_path)
    pwned = tmp_path / "pwned"
    p, err = start(kcli, tmp_path, "--pattern", f"{namespace}:*", "--handler", str(h))
    subscribed(ks_server, 1)
    r = ks_server.client()
    k1 = f"{namespace}:$(touch {pwned});"
    k2 = f"{namespace}:`touch {pwned}` && touch {pwned} | x; 'q' \"d\" $HOME *"
    r.set(k1, "x", px=100)
    arm(krs, k2, 100)
    wait_for(lambda: len(runs(out)) >= 2, timeout=10, what="both keys to fire")
    stop(p, err)
    got = {row[1]: row[0] for row in runs(out)}
    assert got == {k1: f"|{k1}", k2: f"|{k2}"}  # one argument each, unchanged
    assert not pwned.exists()


def test_sigterm_waits_for_a_running_handler_and_exits_0(
    kcli: Cli, ks_server: RedisServer, tmp_path: Path, namespace: str
) -> None:
    marker = tmp_path / "started"
    h, out = handler(tmp_path, extra=f"touch '{marker}'; sleep 1")
    p, err = start(kcli, tmp_path, "--pattern", f"{namespace}:s:*", "--", str(h))
    subscribed(ks_server, 1)
    ks_server.client().set(f"{namespace}:s:1", "x", px=50)
    wait_for(marker.exists, timeout=10, what="the handler to start")
    log = stop(p, err)
    assert len(runs(out)) == 1  # it finished before the process exited
    assert "stopping (SIGTERM)" in log and "1 ok" in log


def test_timeout_kills_the_handler(
    kcli: Cli, ks_server: RedisServer, tmp_path: Path, namespace: str
) -> None:
    h, out = handler(tmp_path, extra="sleep 30")
    p, err = start(
        kcli, tmp_path, "--pattern", f"{namespace}:k:*", "--timeout", "300ms", "--", str(h)
    )
    subscribed(ks_server, 1)
    ks_server.client().set(f"{namespace}:k:1", "x", px=50)
    wait_for(lambda: "timed out" in err.read_text(), timeout=10, what="the timeout")
    log = stop(p, err)
    assert "1 failed" in log and not runs(out)


# ----------------------------------------------------------------------------- server config


def test_missing_notify_config_exits_78_with_the_fix(tmp_path: Path, namespace: str) -> None:
    s = RedisServer().start()
    try:
        r = s.client()
        r.config_set("notify-keyspace-events", "")
        c = Cli(s, namespace, cwd=str(tmp_path))
        h, _ = handler(tmp_path)
        res = c("run", "expired", "--pattern", "k:*", "--", str(h))
        assert res.returncode == 78, res.stderr
        assert "notify-keyspace-events" in res.stderr
        assert "CONFIG SET notify-keyspace-events Ex" in res.stderr
        assert "--set-notify" in res.stderr
        # Flags already set are kept in the suggested fix.
        r.config_set("notify-keyspace-events", "Kg")
        res = c("run", "expired", "--pattern", "k:*", "--", str(h))
        assert res.returncode == 78 and "notify-keyspace-events" in res.stderr
        assert r.config_get("notify-keyspace-events")["notify-keyspace-events"] == "gK"
    finally:
        s.stop()


def test_set_notify_sets_it_and_fires(tmp_path: Path, namespace: str) -> None:
    s = RedisServer().start()
    c = Cli(s, namespace, cwd=str(tmp_path))
    try:
        r = s.client()
        r.config_set("notify-keyspace-events", "Kg")
        h, out = handler(tmp_path)
        p, err = start(c, tmp_path, "--pattern", "k:*", "--set-notify", "--", str(h))
        subscribed(s, 1)
        value = r.config_get("notify-keyspace-events")["notify-keyspace-events"]
        assert notify_flags_ok(value) and "K" in value and "g" in value  # merged, not replaced
        assert "set notify-keyspace-events" in err.read_text()
        r.set("k:1", "x", px=50)
        wait_for(lambda: runs(out), timeout=10, what="the key to fire")
        stop(p, err)
    finally:
        c.close()
        s.stop()


def test_config_denied_warns_could_not_verify_and_runs(tmp_path: Path, namespace: str) -> None:
    s = RedisServer(extra=["notify-keyspace-events Ex"]).start()
    c = Cli(s, namespace, cwd=str(tmp_path))
    try:
        admin = s.client()
        admin.execute_command("ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-config")
        h, out = handler(tmp_path)
        url = f"redis://app:pw@127.0.0.1:{s.port}/0"
        err_path = tmp_path / "acl.err"
        with open(err_path, "w") as fh:
            p = c.spawn(
                "run",
                "expired",
                "--pattern",
                "k:*",
                "--",
                str(h),
                env={"RSCHED_REDIS_URL": url},
                stdout=subprocess.DEVNULL,
                stderr=fh,
            )
        wait_for(lambda: "could not verify" in err_path.read_text(), timeout=10)
        subscribed(s, 1)
        admin.set("k:1", "x", px=50)
        wait_for(lambda: runs(out), timeout=10, what="the key to fire")
        stop(p, err_path)
    finally:
        c.close()
        s.stop()


# ----------------------------------------------------------------------------- outages


def test_reconnects_after_a_redis_restart_and_fires_what_expired_meanwhile_once(
    tmp_path: Path, namespace: str
) -> None:
    s = RedisServer(extra=["notify-keyspace-events Ex"], appendonly=True).start()
    c = Cli(s, namespace, cwd=str(tmp_path))
    try:
        h, out = handler(tmp_path)
        p, err = start(c, tmp_path, "--pattern", "r:*", "--backup-sweep", "--", str(h))
        subscribed(s, 1)
        # Armed just before the outage (AOF, fsync always); it expires while Redis is down.
        expiry = arm(Rsched(s.client(), namespace), "r:missed", 800)
        s.kill()
        wait_for(lambda: "retrying" in err.read_text(), timeout=10, what="the outage noticed")
        wait_for(lambda: time.time() * 1000 > expiry + 200, what="the expiry to pass")
        s.start()
        subscribed(s, 1)
        s.client().set("r:after", "x", px=50)
        wait_for(lambda: {row[1] for row in runs(out)} >= {"r:missed", "r:after"}, timeout=15)
        stop(p, err)
        assert Counter(row[1] for row in runs(out)) == {"r:missed": 1, "r:after": 1}
    finally:
        c.close()
        s.stop()


def test_key_name_that_is_not_utf8_reaches_the_handler_byte_for_byte(
    kcli: Cli, ks_server: RedisServer, tmp_path: Path, namespace: str
) -> None:
    out = tmp_path / "raw.out"
    h = tmp_path / "raw.sh"
    h.write_text(f"#!/bin/sh\nprintf '%s' \"$1\" > '{out}'\n")
    h.chmod(0o755)
    p, err = start(kcli, tmp_path, "--pattern", f"{namespace}:*", "--", str(h))
    subscribed(ks_server, 1)
    key = namespace.encode() + b":\xff\xfe bin\x01"
    ks_server.client().set(key, "x", px=50)
    wait_for(out.exists, timeout=10, what="the handler to run")
    stop(p, err)
    assert out.read_bytes() == key


def test_concurrency_runs_handlers_side_by_side(
    kcli: Cli, ks_server: RedisServer, tmp_path: Path, namespace: str
) -> None:
    started = tmp_path / "started"
    started.mkdir()
    gate = tmp_path / "gate"
    h, out = handler(
        tmp_path,
        extra=f"touch '{started}'/\"$RSCHED_KEY\"; while [ ! -e '{gate}' ]; do sleep 0.05; done",
    )
    p, err = start(
        kcli, tmp_path, "--pattern", f"{namespace}:c:*", "--concurrency", "3", "--", str(h)
    )
    subscribed(ks_server, 1)
    r = ks_server.client()
    for i in range(3):
        r.set(f"{namespace}:c:{i}", "x", px=50)
    # All three run at once (none can finish before the gate opens).
    wait_for(lambda: len(list(started.iterdir())) == 3, timeout=10, what="3 handlers at once")
    gate.touch()
    wait_for(lambda: len(runs(out)) == 3, timeout=10)
    assert "3 ok" in stop(p, err)


def test_systemd_notify_ready_watchdog_stopping(
    kcli: Cli, ks_server: RedisServer, tmp_path: Path, namespace: str
) -> None:
    import os
    import socket

    path = f"/tmp/rsched-expired-notify-{os.getpid()}-{tmp_path.name[-12:]}.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(15)
    try:
        h, _ = handler(tmp_path)
        err_path = tmp_path / "sd.err"
        with open(err_path, "w") as fh:
            p = kcli.spawn(
                "run",
                "expired",
                "--pattern",
                f"{namespace}:*",
                "--",
                str(h),
                env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000"},
                stdout=subprocess.DEVNULL,
                stderr=fh,
            )
        seen: list[str] = []
        while "WATCHDOG=1" not in seen or "READY=1" not in seen:
            seen += s.recv(4096).decode().split("\n")
        # READY only once subscribed: nothing that expires afterwards is missed
        assert any(line.startswith("STATUS=watching __keyevent@0__:expired") for line in seen)
        p.send_signal(signal.SIGTERM)
        while "STOPPING=1" not in seen:
            seen += s.recv(4096).decode().split("\n")
        assert p.wait(15) == 0
    finally:
        s.close()
        os.unlink(path)


@pytest.mark.slow
def test_a_frozen_redis_is_noticed_and_the_subscription_recovers(
    tmp_path: Path, namespace: str
) -> None:
    s = RedisServer(extra=["notify-keyspace-events Ex"]).start()
    c = Cli(s, namespace, cwd=str(tmp_path))
    try:
        h, out = handler(tmp_path)
        p, err = start(c, tmp_path, "--pattern", "f:*", "--backup-sweep", "--", str(h))
        subscribed(s, 1)
        rs = Rsched(s.client(), namespace)
        arm(rs, "f:during", 2_000)  # due while Redis is frozen
        s.freeze()
        try:
            # No PING answer: the subscription is dropped and retried (not hung forever).
            wait_for(lambda: "did not answer PING" in err.read_text(), timeout=30)
        finally:
            s.thaw()
        subscribed(s, 1)
        s.client().set("f:after", "x", px=50)
        wait_for(lambda: {row[1] for row in runs(out)} >= {"f:during", "f:after"}, timeout=30)
        stop(p, err)
        assert Counter(row[1] for row in runs(out)) == {"f:during": 1, "f:after": 1}
    finally:
        c.close()
        s.stop()


def test_library_runner_with_a_python_handler_and_one_subscription_per_node(
    ks_server: RedisServer, krs: Rsched, namespace: str
) -> None:
    """The runner as a library: a callable gets a Firing. Two node subscriptions
    (as one per primary would be; here both reach the same server, so every
    event arrives twice) still fire each key once."""
    import threading

    from rsched.expired.runner import ExpiredRunner, Firing

    got: list[Firing] = []
    lines_: list[str] = []
    runner = ExpiredRunner(
        krs,
        f"{namespace}:lib:*",
        got.append,
        backup_sweep=True,
        nodes=[ks_server.client(), ks_server.client()],
        install_signals=False,
        log=lines_.append,
        verbose=1,
    )
    t = threading.Thread(target=runner.run)
    t.start()
    try:
        subscribed(ks_server, 2)
        expiry = arm(krs, f"{namespace}:lib:a", 50, value=b"\x00payload")
        ks_server.client().set(f"{namespace}:lib:b", "x", px=50)
        wait_for(lambda: len(got) == 2, timeout=10, what="both keys to fire")
        wait_for(lambda: runner.stats.duplicates >= 2, timeout=10, what="the second copies")
    finally:
        runner.stop()
        t.join(timeout=15)
    assert not t.is_alive()
    by_key = {f.key: f for f in got}
    a, b = by_key[f"{namespace}:lib:a"], by_key[f"{namespace}:lib:b"]
    assert a.value == b"\x00payload" and a.expire_ms == expiry and a.expire_at
    assert b.value is None and b.expire_ms is None and b.source == "event"
    assert runner.stats.fired == 2 and runner.stats.ok == 2
    assert any("stopped: 2 fired" in line for line in lines_)


def test_options_checked_in_one_place_keep_their_messages(tmp_path: Path) -> None:
    from rsched.core.errors import BadInput
    from rsched.expired.options import expired_options

    h, _ = handler(tmp_path)
    for kw, message in (
        ({"claim_window_ms": "50ms"}, "--claim-window: '50ms' is too short; give at least 100ms"),
        ({"claim_window_ms": 50}, "--claim-window: 50ms is too short; give at least 100ms"),
        ({"db": "x"}, "--db: 'x' is not a database number (0 or more)"),
        ({"db": -1}, "--db: -1 is not a database number (0 or more)"),
        ({"concurrency": 0}, "--concurrency: 0 is not a whole number from 1 to 1024"),
    ):
        with pytest.raises(BadInput) as exc:
            expired_options("k:*", [str(h)], **kw)
        assert str(exc.value) == message, (kw, str(exc.value))
    opts = expired_options("k:*", str(h), concurrency="3", timeout_ms="2s", claim_window_ms="")
    assert (opts.concurrency, opts.timeout_ms, opts.claim_window_ms) == (3, 2000, 10_000)
    assert opts.handler == [str(h)]
