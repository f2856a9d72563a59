"""sd_notify over a real unix datagram socket (path and abstract)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from rsched.runtime import systemd


def _recv(sock: socket.socket) -> list[str]:
    sock.settimeout(5)
    return sock.recv(4096).decode().split("\n")


@pytest.fixture
def notify_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> socket.socket:
    path = f"/tmp/rsched-notify-{os.getpid()}-{tmp_path.name[-12:]}.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    yield s
    s.close()
    os.unlink(path)


def test_ready_status_stopping(notify_socket: socket.socket) -> None:
    assert systemd.ready("consuming default")
    msg = _recv(notify_socket)
    assert (
        msg[0] == "READY=1"
        and f"MAINPID={os.getpid()}" in msg
        and "STATUS=consuming default" in msg
    )
    assert systemd.status("3 running\nnext")
    assert _recv(notify_socket) == ["STATUS=3 running next"]
    assert systemd.stopping()
    assert _recv(notify_socket) == ["STOPPING=1"]


def test_watchdog_only_when_asked(
    notify_socket: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    assert systemd.watchdog_interval_s() is None
    assert systemd.watchdog() is False
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert systemd.watchdog_interval_s() == 2.0
    assert systemd.watchdog()
    assert _recv(notify_socket) == ["WATCHDOG=1"]
    monkeypatch.setenv("WATCHDOG_PID", "1")  # someone else's watchdog
    assert systemd.watchdog_interval_s() is None


def test_abstract_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"rsched-test-{os.getpid()}"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind("\0" + name)
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert systemd.ready()
        assert _recv(s)[0] == "READY=1"
    finally:
        s.close()


def test_no_socket_is_a_quiet_noop(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert systemd.ready() is False
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "missing.sock"))
    assert systemd.ready() is False  # never raises
