"""The Redis cost of an open overview stays under 5 commands/s however many
queues there are: the page polls less often when a snapshot costs more."""

from __future__ import annotations

import re
from pathlib import Path

from rsched.api import Rsched
from tests.integration.web.conftest import start_web
from tests.support import Cli, RedisServer, wait_for


def _commands(server: RedisServer) -> int:
    """Commands the server ran, INFO itself left out."""
    c = server.client()
    try:
        stats = c.info("commandstats")
    finally:
        c.close()
    return sum(v["calls"] for k, v in stats.items() if k != "cmdstat_info")


def _page(c: object) -> tuple[int, int]:
    html = c.get("/").text  # type: ignore[attr-defined]
    poll = re.search(r'<body data-poll="(\d+)"', html)
    snap = re.search(r'data-snapshot-ms="(\d+)"', html)
    assert poll and snap, html[:300]
    return int(poll.group(1)), int(snap.group(1))


def test_an_open_overview_polls_slower_when_a_snapshot_costs_more(
    own_server: RedisServer, tmp_path: Path
) -> None:
    cli = Cli(own_server, "webcost", cwd=str(tmp_path))
    try:
        rs = Rsched(own_server.client(), "webcost")
        w = start_web(cli)
        with w.client() as c:
            few, _ = _page(c)
            assert few == 15  # little to read: the shortest interval
            for i in range(40):
                rs.add("t", "x", queue=f"q{i:02d}", delay="1h")
            # the next snapshot (after the 2 s cache) sees 40 queues: one snapshot's
            # commands are what the server ran until a page shows a new one (a
            # cached page costs nothing)
            _, first = _page(c)
            before = _commands(own_server)
            poll, _ = wait_for(
                lambda: (got := _page(c))[1] != first and got,
                timeout=15,
                interval=0.2,
                what="a new snapshot",
            )
            cost = _commands(own_server) - before
        print(f"snapshot of 40 queues: {cost} commands, poll {poll} s")
        assert cost > 15 * 5, cost  # 40 queues: an every-15-s poll would pass 5/s
        assert poll > 15
        assert cost / poll < 5, (cost, poll)
    finally:
        cli.close()
