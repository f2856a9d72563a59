"""Guarantee 2, one clock: producers and consumers 30 s off (libfaketime) are neither early nor starved.

Shared harness: tests/faults/harness.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from rsched.api import Rsched
from rsched.core.timeutil import iso
from tests.faults.harness import (
    FAKETIME_LIB,
    Procs,
    figure,
    history,
    jsonl,
    pct,
    runs,
    script,
    settled,
    stop,
)
from tests.support import Cli, wait_for

# --- 6. clock skew


def _skewed(skew: str) -> dict[str, str]:
    assert FAKETIME_LIB is not None
    # Monotonic stays real: libfaketime breaks timed waits on a faked monotonic clock.
    return {
        "LD_PRELOAD": FAKETIME_LIB,
        "FAKETIME": skew,
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


SKEW_HANDLER = """
    echo "$1 $RSCHED_CLAIM_TOKEN $RSCHED_ATTEMPT $CONSUMER_TAG" >> "$EXEC_LOG"
    case "$1" in long*) sleep 2;; esac
"""


@pytest.mark.skipif(FAKETIME_LIB is None, reason="faketime (libfaketime) is not installed")
def test_skewed_producers_and_consumers_neither_early_nor_starved(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    log = tmp_path / "exec.log"
    h = script(tmp_path, "h.sh", SKEW_HANDLER)
    procs = Procs(cli, tmp_path)
    consumers = [
        procs.consumer("--handler", f"t.sk={h}", "--concurrency", "4", "--lease", "1s",
                       env={"EXEC_LOG": str(log), **_skewed(skew)}, name=f"c{skew}")
        for skew in ("+30s", "-30s")
    ]  # fmt: skip
    q = rs.keys.queue("default")
    wait_for(lambda: rs.redis.zcard(q.consumers) == 2, timeout=30, what="2 skewed consumers")
    # The skewed clocks really are skewed (as the consumers see them).
    for skew, sign in (("+30s", 1), ("-30s", -1)):
        out = subprocess.run([sys.executable, "-c", "import time; print(time.time())"],
                             env={**os.environ, **_skewed(skew)}, capture_output=True, text=True)  # fmt: skip
        assert abs(float(out.stdout) - time.time() - sign * 30) < 5
    expected: dict[str, int] = {}  # id -> due ms by the server's clock, known independently
    windows: dict[str, tuple[int, int]] = {}
    for skew in ("+30s", "-30s"):
        tag = "p" if skew == "+30s" else "m"
        for i in range(3):
            t0 = rs.now_ms()
            res = cli.json("add", "--in", "2s", "t.sk", f"{tag}in{i}", env=_skewed(skew))
            t1 = rs.now_ms()
            windows[f"{tag}in{i}"] = (t0 + 2000, t1 + 2000)
            assert t0 + 2000 <= res["due_ms"] <= t1 + 2000, (skew, res)
        at = rs.now_ms() + 3000
        res = cli.json("add", "--at", str(iso(at)), "t.sk", f"{tag}at", env=_skewed(skew))
        assert res["due_ms"] == at
        expected[f"{tag}at"] = at
        t0 = rs.now_ms()
        cli("add", "--from", "-", env=_skewed(skew), check=0,
            input=jsonl("t.sk", [f"{tag}bulk{i}" for i in range(20)], **{"in": "2s"}))  # fmt: skip
        t1 = rs.now_ms()
        for i in range(20):
            windows[f"{tag}bulk{i}"] = (t0 + 2000, t1 + 2000)
        # Long runs: each skewed consumer must keep its lease by the server's clock.
        cli("add", "t.sk", f"long{tag}", env=_skewed(skew), check=0)
    total = len(windows) + len(expected) + 2
    wait_for(lambda: settled(rs.redis, rs), timeout=40, what="every task run")
    recs = [x for x in history(rs.redis, rs) if x["result"] in ("ok", "lost")]
    assert not [x for x in recs if x["result"] == "lost"], "a skewed clock stole a lease"
    by_id = {x["id"]: x for x in recs}
    assert len(by_id) == total
    late = []
    for tid, x in by_id.items():
        lo, hi = windows.get(tid, (expected.get(tid, x["fire_ms"]),) * 2)
        assert lo <= x["fire_ms"] <= hi, (tid, x)
        assert x["started_ms"] >= x["fire_ms"], f"{tid} ran early by the server's clock: {x}"
        late.append(x["started_ms"] - x["fire_ms"])
    # none starves: 48 tasks fall due in two bursts on 8 slots (two of them busy for 2 s)
    assert max(late) < 5000, f"tasks waited: {sorted(late)[-5:]}"
    executed = Counter(x.id for x in runs(log))
    assert len(executed) == total and max(executed.values()) == 1
    assert {x.pid for x in runs(log)} == set(procs.tags)  # both skewed consumers worked
    assert [stop(p) for p, _ in consumers] == [0, 0]
    figure(
        "clock_skew",
        skews=["+30s", "-30s"],
        tasks=total,
        run_early=0,
        lost_leases=0,
        lateness_ms_p50=pct(late, 0.5),
        lateness_ms_max=max(late),
    )
