"""Guarantee 4, locks are owned and fencing tokens only go up: a cron holder frozen past its TTL is taken over.

Shared harness: tests/faults/harness.py."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from rsched.api import Rsched
from tests.faults.harness import Procs, alive, cron_fires, figure, stop
from tests.support import Cli, wait_for

# --- cron runner frozen


def test_cron_holder_frozen_past_its_ttl_is_taken_over_and_fencing_goes_up(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    """Two runners; the one running a long job is SIGSTOPped past its lock TTL. The
    other fires the next tick with a higher fencing token while the frozen one is
    stopped; once resumed, the frozen runner learns it lost the lock, stops its job,
    records the run as lost and leaves the new holder's lock alone."""
    fires = tmp_path / "fires.log"
    job = ["sh", "-c", f'echo "$RSCHED_FIRE_AT $RSCHED_FENCING_TOKEN $PPID $$" >> {fires}; '
           "exec sleep 60"]  # fmt: skip
    procs = Procs(cli, tmp_path)
    opts = ("--schedule", "*/1 * * * * *", "--ttl", "1s")
    runners = [procs.spawn("run", "cron", "held", *opts, "--", *job, name=f"r{i}")[0]
               for i in range(2)]  # fmt: skip
    k = rs.keys.cron("held")
    try:
        first = wait_for(lambda: cron_fires(fires), timeout=20, what="the first run")[0]
        holder = next(p for p in runners if str(p.pid) == first[2])
        other = next(p for p in runners if p is not holder)
        os.kill(holder.pid, signal.SIGSTOP)  # the runner; its job (own group) goes on
        frozen_at = time.monotonic()
        second = wait_for(lambda: cron_fires(fires)[1:], timeout=15, what="takeover")[0]
        takeover = time.monotonic() - frozen_at
        assert second[2] == str(other.pid)
        assert int(second[1]) > int(first[1])
        assert alive(int(first[3]))  # a frozen runner cannot stop its job...
        os.kill(holder.pid, signal.SIGCONT)
        wait_for(lambda: not alive(int(first[3])), timeout=10, what="...until it wakes")
        recs = wait_for(
            lambda: [r for r in cli.json("history", "held") if r["result"] == "lost"],
            timeout=10,
            what="the stale run recorded as lost",
        )
        assert [r["token"] for r in recs] == [int(first[1])] and "lock lost" in recs[0]["error"]
        # The new holder's lock and job are untouched by the woken runner.
        lock = rs.redis.hgetall(k.run_lock)
        assert lock and int(lock["token"]) == int(second[1]), lock
        assert alive(int(second[3]))
        assert len(cron_fires(fires)) == 2  # nobody fired a third time meanwhile
        # The woken runner is healthy: when the holder goes away, it takes over.
        os.kill(int(second[3]), signal.SIGKILL)
        third = wait_for(lambda: cron_fires(fires)[2:], timeout=15, what="next fire")[0]
        assert int(third[1]) > int(second[1])
        assert stop(other) == 0  # SIGTERM stops its job too

        def woken_fires() -> list[list[str]]:
            return [f for f in cron_fires(fires)[2:] if f[2] == str(holder.pid)]

        fourth = wait_for(woken_fires, timeout=20, what="the once-frozen runner fires again")[0]
        tokens = [int(f[1]) for f in cron_fires(fires)]
        assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), tokens
        assert int(fourth[1]) > int(second[1])
        assert stop(holder) == 0
    finally:
        for f in cron_fires(fires):
            if alive(int(f[3])):
                os.kill(int(f[3]), signal.SIGKILL)
    figure("cron_runner_sigstop", ttl_ms=1000, takeover_ms=round(takeover * 1000),
           fencing_went_backwards=0)  # fmt: skip
