"""TLS (``rediss://``, SPEC §2): a real server with ``tls-port`` and a test CA made
with ``openssl``; rsched verifies the server against ``RSCHED_TLS_CA`` and refuses
an unverifiable one (exit 69)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import RSCHED, free_port, server_binary, wait_for

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def tls_server() -> Iterator[tuple[int, Path]]:
    d = Path(tempfile.mkdtemp(prefix="rsched-test-tls-"))
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
             "-out", "ca.crt", "-days", "2", "-subj", "/CN=rsched-test-ca", cwd=d)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "s.key", "-out", "s.csr",
             "-subj", "/CN=127.0.0.1", cwd=d)  # fmt: skip
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("x509", "-req", "-in", "s.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "s.crt", "-days", "2", "-extfile", "ext", cwd=d)  # fmt: skip
    port = free_port()
    proc = subprocess.Popen(
        [server_binary(), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(d / "s.crt"), "--tls-key-file", str(d / "s.key"),
         "--tls-ca-cert-file", str(d / "ca.crt"), "--tls-auth-clients", "no",
         "--save", "", "--dir", str(d)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        try:
            wait_for(
                lambda: proc.poll() is not None or _ping(port, d / "ca.crt"),
                timeout=15,
                what="the TLS server",
            )
        except AssertionError:
            pytest.skip("this server binary does not accept TLS connections")
        if proc.poll() is not None:
            pytest.skip("this server binary was built without TLS")
        yield port, d / "ca.crt"
    finally:
        proc.kill()
        proc.wait(timeout=10)
        shutil.rmtree(d, ignore_errors=True)


def _ping(port: int, ca: Path) -> bool:
    import redis

    try:
        with redis.Redis(host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(ca)) as c:
            return bool(c.ping())
    except redis.RedisError:
        return False


def _rsched(port: int, *args: str, ca: Path | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RSCHED_", "REDIS_URL"))}
    env.update(RSCHED_REDIS_URL=f"rediss://127.0.0.1:{port}/0", RSCHED_NAMESPACE="tls",
               NO_COLOR="1")  # fmt: skip
    if ca is not None:
        env["RSCHED_TLS_CA"] = str(ca)
    return subprocess.run([*RSCHED, *args], capture_output=True, text=True, env=env, timeout=60)


def test_add_list_and_consume_over_verified_tls(
    tls_server: tuple[int, Path], tmp_path: Path
) -> None:
    port, ca = tls_server
    assert _rsched(port, "add", "t.s", "1", ca=ca).returncode == 0  # the lean client
    assert _rsched(port, "add", "t.s", "2", "--json", ca=ca).returncode == 0
    out = tmp_path / "ran"
    h = tmp_path / "h.sh"
    h.write_text(f'#!/bin/sh\necho "$1" >> {out}\n')
    h.chmod(0o755)
    r = _rsched(port, "run", "consumer", "--burst", "--handler", f"t.s={h}", ca=ca)
    assert r.returncode == 0, r.stderr
    assert sorted(out.read_text().split()) == ["1", "2"]
    r = _rsched(port, "queues", "--json", ca=ca)
    assert r.returncode == 0 and '"queue": "default"' in r.stdout


def test_an_unverifiable_server_is_refused(tls_server: tuple[int, Path]) -> None:
    port, _ = tls_server
    for cmd in (("add", "t.s", "x"), ("list",)):  # the lean client and redis-py
        r = _rsched(port, *cmd, ca=None)
        assert r.returncode == 69, r
        assert "certificate verify failed" in r.stderr and len(r.stderr.splitlines()) == 1
