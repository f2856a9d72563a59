"""Fixtures of the web console's tests: a real `rsched web` process on a free
port, against the suite's test server and the test's namespace."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support import RSCHED, Cli, free_port, rsched_env, wait_for

httpx = pytest.importorskip("httpx", reason="the web extra's tests need httpx")
pytest.importorskip("starlette", reason="rsched web needs the web extra (starlette)")


@dataclass
class Web:
    proc: subprocess.Popen[str]
    base: str
    token: str | None
    _log: str | None = None

    def client(self, **kw: Any) -> Any:
        return httpx.Client(base_url=self.base, timeout=10, follow_redirects=False, **kw)

    def bearer(self) -> dict[str, str]:
        assert self.token
        return {"Authorization": f"Bearer {self.token}"}

    def log(self) -> str:
        """Stop the server (SIGTERM: it exits 0) and return what it wrote on stderr."""
        if self._log is None:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGTERM)
            _, err = self.proc.communicate(timeout=15)
            assert self.proc.returncode == 0, err
            self._log = err
        return self._log


def start_web(
    cli: Cli, *args: str, token: str | None = None, env: dict[str, str] | None = None
) -> Web:
    port = free_port()
    extra = dict(env or {})
    if token is not None:
        extra["RSCHED_WEB_TOKEN"] = token
    proc = subprocess.Popen(
        [*RSCHED, "web", "--port", str(port), *args],
        env=rsched_env(cli.server, cli.namespace, **extra),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    cli.procs.append(proc)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"rsched web exited {proc.returncode}: {proc.stderr.read()}")  # type: ignore[union-attr]
        try:
            return httpx.get(base + "/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(up, timeout=20, what="rsched web to answer /healthz")
    return Web(proc, base, token)


@pytest.fixture
def web(cli: Cli) -> Iterator[Web]:
    """An open console (no token, loopback)."""
    yield start_web(cli)
