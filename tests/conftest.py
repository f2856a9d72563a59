"""Fixtures: every test gets a real server (shared per session unless it needs
its own) and a fresh namespace; `cli` runs real rsched processes."""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Iterator

import pytest

from rsched.api import Rsched
from tests.support import Cli, RedisServer

_counter = itertools.count()


@pytest.fixture(scope="session")
def server() -> Iterator[RedisServer]:
    """One shared server for tests that only need isolation by namespace."""
    s = RedisServer().start()
    yield s
    s.stop()


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A server this test may kill, freeze or restart."""
    s = RedisServer(appendonly=True).start()
    yield s
    s.stop()


@pytest.fixture
def namespace() -> str:
    return f"t{next(_counter)}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def rs(server: RedisServer, namespace: str) -> Iterator[Rsched]:
    r = Rsched(server.client(), namespace)
    yield r
    r.redis.close()


@pytest.fixture
def cli(server: RedisServer, namespace: str, tmp_path: object) -> Iterator[Cli]:
    c = Cli(server, namespace, cwd=str(tmp_path))
    yield c
    c.close()


@pytest.fixture(autouse=True)
def _no_user_config(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    """Tests never read the developer's own config or environment."""
    for k in list(os.environ):
        if k.startswith("RSCHED_") and k != "RSCHED_TEST_SERVER" or k == "REDIS_URL":
            monkeypatch.delenv(k)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path) + "/xdg")


@pytest.fixture(autouse=True)
def _collect_garbage() -> Iterator[None]:
    """Collect cyclic garbage after each test. A client a test dropped without
    closing (redis-py's objects sit in reference cycles on some versions) would
    otherwise be found only when pytest exits, where pytest >= 9.1 turns the
    socket's ResourceWarning into a failure of the whole run that names no test.
    These are the test's own in-process clients (rsched's processes are separate),
    so their warning is dropped here."""
    yield
    import gc
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
