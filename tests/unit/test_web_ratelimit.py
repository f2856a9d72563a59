"""The web console's failure budget per client address (rsched/web/security.py)."""

from __future__ import annotations

from typing import Any

from rsched.web import security
from rsched.web.security import FAIL_LIMIT, FAIL_WINDOW_S, Guard


def test_the_budget_refills_as_failures_leave_the_window(monkeypatch: Any) -> None:
    now = [1000.0]
    monkeypatch.setattr(security.time, "monotonic", lambda: now[0])
    g = Guard("t" * 20)
    for _ in range(FAIL_LIMIT):
        assert g.retry_after("10.0.0.1") is None
        g.failed("10.0.0.1")
        now[0] += 1
    assert g.retry_after("10.0.0.1") == FAIL_WINDOW_S - FAIL_LIMIT
    assert g.retry_after("10.0.0.2") is None  # per address
    now[0] = 1000.0 + FAIL_WINDOW_S + 0.5  # the oldest failure has left the window
    assert g.retry_after("10.0.0.1") is None
    g.failed("10.0.0.1")
    assert g.retry_after("10.0.0.1") is not None
    now[0] += FAIL_WINDOW_S
    assert g.retry_after("10.0.0.1") is None and "10.0.0.1" not in g._failures
