"""The run-duration histogram's buckets: one list, in Lua (where runs are counted)
and in Python (where they are exported)."""

from __future__ import annotations

import re
from pathlib import Path

from rsched.tools import metrics

LUA = Path(metrics.__file__).parent.parent / "lua" / "_duration.lua"


def test_lua_and_python_buckets_agree() -> None:
    text = LUA.read_text()
    body = re.search(r"DURATION_BUCKETS_MS = \{([^}]*)\}", text, re.S)
    assert body is not None
    assert tuple(int(x) for x in re.findall(r"\d+", body.group(1))) == metrics.DURATION_BUCKETS_MS
    assert list(metrics.DURATION_BUCKETS_MS) == sorted(set(metrics.DURATION_BUCKETS_MS))


def test_buckets_are_cumulative_with_inf_and_sum() -> None:
    got = metrics.duration_buckets({"dur<100": 2, "dur<1000": 1, "dur<inf": 1, "dur_ms": 20_300})
    assert got is not None
    buckets, total_s = got
    d = dict(buckets)
    assert d["0.1"] == 2 and d["0.5"] == 2 and d["1"] == 3 and d["10800"] == 3
    assert d["+Inf"] == 4 and buckets[-1][0] == "+Inf"
    assert total_s == 20.3
    assert metrics.duration_buckets({"ok": 3}) is None
    # a task type's fields carry its suffix
    assert metrics.duration_buckets({"dur<500|t.x": 1, "dur_ms|t.x": 300}, "|t.x") is not None
