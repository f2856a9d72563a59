"""clients.Interruptible: a loop's stop ends its blocking read at once, whenever the
stop comes (before the read is sent, while it blocks, or after), against a real
server. Before it, a stop that came just before the read was sent was missed
(redis-py reconnects a shut connection on its next send) and the read blocked its
whole timeout: a cron runner then took 10 s more to exit after SIGTERM."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from rsched.core import clients
from tests.support import RedisServer


@pytest.mark.parametrize("stop_at", ["before the read is sent", "while it blocks"])
def test_close_ends_a_blocking_read_at_once(server: RedisServer, stop_at: str) -> None:
    base = server.client()
    blocking = clients.Interruptible(lambda: clients.clone(base, socket_timeout=30))
    inside = threading.Event()

    def read(client: Any) -> Any:
        inside.set()
        if stop_at == "before the read is sent":
            time.sleep(0.3)  # the stop comes now, before the XREAD goes out
        return client.xread({"rsched-test:nothing": "$"}, block=20_000)

    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(blocking.call(read)), daemon=True)
    t.start()
    assert inside.wait(10)
    time.sleep(0.05 if stop_at == "before the read is sent" else 0.5)
    t0 = time.monotonic()
    blocking.close()
    t.join(5)
    assert not t.is_alive(), "the read went on blocking after close()"
    assert out == [None]
    print(f"{stop_at}: ended {time.monotonic() - t0:.3f}s after close()")
    # and once closed, a call does not start
    assert blocking.call(lambda c: pytest.fail("called after close")) is None
    base.close()


def test_an_error_of_an_open_client_is_raised(server: RedisServer) -> None:
    base = server.client()
    blocking = clients.Interruptible(lambda: clients.clone(base, socket_timeout=30))
    with pytest.raises(Exception, match="wrong number of arguments|unknown command"):
        blocking.call(lambda c: c.execute_command("XREAD"))
    assert blocking.call(lambda c: c.ping()) is True
    blocking.close()
    base.close()
