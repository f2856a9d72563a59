"""Fixtures of the fault suites."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rsched.api import Rsched
from tests.support import Cli, RedisServer


@pytest.fixture(autouse=True)
def _soaks_only_when_asked(request: pytest.FixtureRequest) -> None:
    """The ``slow`` soaks run with ``-m slow`` only, never in the plain CI run."""
    if request.node.get_closest_marker("slow") and "slow" not in (
        request.config.getoption("markexpr") or ""
    ):
        pytest.skip("soak: run with -m slow")


@pytest.fixture
def own(own_server: RedisServer, namespace: str, tmp_path: Path) -> Iterator[tuple[Cli, Rsched]]:
    """A CLI and a library handle on a server this test may kill, freeze or flush."""
    c = Cli(own_server, namespace, cwd=str(tmp_path))
    yield c, Rsched(own_server.client(), namespace)
    c.close()
