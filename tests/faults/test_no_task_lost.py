"""Guarantee 1, no task is lost: consumers `kill -9`'d at random while they drain, and Redis `kill -9`'d and restarted from its AOF during enqueue and drain.

Shared harness: tests/faults/harness.py."""

from __future__ import annotations

import os
import random
import signal
import textwrap
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rsched.api import Rsched
from rsched.queue.ops import make_spec
from tests.faults.harness import (
    EXEC_HANDLER,
    EXEC_MODULE,
    SEED,
    SLOW_CALL,
    Procs,
    Run,
    count_lines,
    figure,
    fresh,
    history,
    jsonl,
    pace,
    pct,
    runs,
    script,
    settled,
    stop,
)
from tests.support import Cli, RedisServer, wait_for

# --- 1. kill -9 chaos


@dataclass
class Chaos:
    kills: list[tuple[int, int, int]] = field(default_factory=list)  # (pid, server ms, held)
    leases: list[dict[str, float]] = field(default_factory=list)  # lease expiries after each
    started: int = 0


def _chaos_drain(
    cli: Cli,
    rs: Rsched,
    tmp_path: Path,
    n: int,
    max_s: float,
    seed: int | None = None,
    queue: str = "default",
    kind: str = "command",
) -> None:
    """4 consumers drain ``n`` tasks; every 0.5-1 s one of them is kill -9'd and replaced.

    ``kind``: command handlers (a consumer holds at most ``--concurrency`` tasks) or
    Python callables (batches: a consumer holds up to PY_HELD_MAX claimed tasks)."""
    seed = seed if seed is not None else int(SEED or random.randrange(1 << 30))
    rng = random.Random(seed)
    print(f"\nchaos seed {seed} (RSCHED_FAULTS_SEED={seed} replays the schedule)")
    tmp_path = tmp_path / queue
    tmp_path.mkdir()
    log = tmp_path / "exec.log"
    env = {"EXEC_LOG": str(log)}
    lease_ms = 2000
    conc = 2
    if kind == "command":
        handler = ("--handler", f"t.chaos={script(tmp_path, 'h.sh', EXEC_HANDLER)}")
        max_held = conc
    else:  # 3 ms a task, so that the drain lasts long enough for several kills
        assert cli.cwd is not None  # consumers import handlers from their working directory
        (Path(cli.cwd) / "frec.py").write_text(textwrap.dedent(EXEC_MODULE) + SLOW_CALL)
        handler = ("--call", "t.chaos=frec:slow")
        from rsched.consumer.loop import PY_HELD_MAX

        max_held = PY_HELD_MAX
    procs = Procs(cli, tmp_path)
    args = ("--queue", queue, *handler, "--concurrency", str(conc), "--lease", f"{lease_ms}ms")
    q = rs.keys.queue(queue)
    r = rs.redis
    live = [procs.consumer(*args, env=env)[0] for _ in range(4)]
    wait_for(lambda: r.zcard(q.consumers) >= 4, timeout=30, what="4 consumers registered")
    ids = [f"c{i}" for i in range(n)]
    rs.add_many([make_spec("t.chaos", i, queue=queue) for i in ids])
    chaos = Chaos()
    t0 = time.monotonic()
    killed: set[int] = set()
    drained = lambda: r.hlen(q.tasks) == 0  # noqa: E731
    while not drained():
        assert time.monotonic() - t0 < max_s, f"not drained after {max_s}s ({r.hlen(q.tasks)} left)"
        pace(rng.uniform(0.5, 1.0), drained)
        if drained():
            break
        victim = live.pop(rng.randrange(len(live)))
        held = r.zcard(q.proc)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=10)
        chaos.kills.append((victim.pid, rs.now_ms(), held))
        chaos.leases.append(dict(r.zrange(q.proc, 0, -1, withscores=True)))
        killed.add(victim.pid)
        live.append(procs.consumer(*args, env=env)[0])
        chaos.started += 1
    drain_s = time.monotonic() - t0
    # The last victims' tasks come back after their lease: wait until all is acked.
    wait_for(lambda: settled(r, rs, queue), timeout=lease_ms / 1000 * 3 + 30, what="all acked")
    # A replacement started just before the drain ended may still be importing: SIGTERM
    # then would kill it before its handler is installed. Registered = handler installed.
    wait_for(
        lambda: (
            {p.pid for p in live} <= {int(m.split(":")[-2]) for m in r.zrange(q.consumers, 0, -1)}
        ),
        timeout=30,
        what="every live consumer registered",
    )
    assert [stop(p) for p in live] == [0] * len(live)
    all_runs = runs(log)
    by_id: dict[str, list[Run]] = defaultdict(list)
    for x in all_runs:
        by_id[x.id].append(x)
    hist = history(r, rs, queue)
    ok = {(x["id"], x["token"]) for x in hist if x["result"] == "ok"}
    lost = [x for x in hist if x["result"] == "lost"]
    lost_tokens = {x["token"] for x in lost}
    token_pid = {x.token: procs.tags[x.pid] for x in all_runs}

    # 0 lost: every task ran and was acknowledged exactly once.
    never = sorted(set(ids) - set(by_id))
    assert not never, f"{len(never)} tasks never ran: {never[:10]}"
    assert int(r.hget(q.stats, "ok|t.chaos") or 0) == n
    assert len(ok) == n and {i for i, _ in ok} == set(ids)
    assert r.zcard(q.dead) == 0
    # Reaped leases are exactly the tasks a killed consumer held: a live consumer never
    # loses its lease (its heartbeats kept up on this loaded machine).
    spurious = [x for x in lost if x["token"] in token_pid and token_pid[x["token"]] not in killed]
    assert not spurious, (
        f"leases of live consumers reaped: {spurious[:5]}; their runs: "
        f"{[by_id[x['id']] for x in spurious[:5]]}; kills: {chaos.kills}; "
        f"history: {[x for x in hist if x['id'] in {s['id'] for s in spurious[:5]}]}; "
        f"stderr: {procs.errors()}"
    )
    in_flight = len(lost)
    assert in_flight <= max_held * len(chaos.kills)
    # A task ran more than once only because it was in flight at a kill.
    dups = len(all_runs) - n
    for tid, rr in by_id.items():
        if len(rr) == 1:
            continue
        for x in rr:
            if (tid, x.token) in ok:
                continue
            assert procs.tags[x.pid] in killed and x.token in lost_tokens, (
                f"{tid} ran again but its earlier run {x} was not in flight at a kill"
            )
    assert dups <= in_flight
    # Takeover: a killed consumer's task is reaped once its lease expires (not before).
    kill_ms = {pid: ms for pid, ms, _ in chaos.kills}
    takeover = [
        x["finished_ms"] - kill_ms[token_pid[x["token"]]]
        for x in lost
        if x["token"] in token_pid and token_pid[x["token"]] in kill_ms
    ]
    assert all(t > 0 for t in takeover), takeover
    # ...and never before the lease it had when its consumer died expired.
    for x in lost:
        m = f"t.chaos {x['id']}"
        seen = [lz[m] for (_, ms, _), lz in zip(chaos.kills, chaos.leases, strict=True)
                if ms <= x["finished_ms"] and m in lz]  # fmt: skip
        assert seen, f"reaped, but no consumer holding it was killed: {x}"
        assert x["finished_ms"] >= seen[-1], f"reaped before its lease expired: {x}"
    figure(
        "consumer_kill9_chaos",
        handlers=kind,
        queue=queue,
        tasks=n,
        consumers=4,
        concurrency=conc,
        lease_ms=lease_ms,
        kills=len(chaos.kills),
        lost=len(never),
        in_flight_at_kills=in_flight,
        duplicated_runs=dups,
        drain_s=round(drain_s, 1),
        takeover_ms_median=round(pct(takeover, 0.5)),
        takeover_ms_max=round(max(takeover, default=0)),
    )


def test_kill9_chaos_four_consumers_lose_nothing(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    _chaos_drain(cli, rs, tmp_path, 3000, max_s=120)


def test_kill9_chaos_python_callables_in_batches_lose_nothing(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    _chaos_drain(cli, rs, tmp_path, 5000, max_s=120, kind="python")


@pytest.mark.slow
def test_kill9_chaos_soak(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    """Six rounds of 8,000 tasks, command and Python handlers in turn (a queue each: the
    history stream keeps 10,000 records)."""
    for i in range(6):
        kind = ("command", "python")[i % 2]
        _chaos_drain(cli, rs, tmp_path, 8000, max_s=600, queue=f"soak{i}", kind=kind)


# --- 3. Redis kill -9


def _producer(
    cli: Cli, ids: list[str], batch: int, acked: list[str], failures: list[int]
) -> threading.Thread:
    """``add --from -`` in batches (one ``rsched add`` for every 4th batch's first id),
    retrying a batch until it exits 0, as an at-least-once producer would: ``acked``
    gets the ids of every batch that exited 0, in order."""

    def run() -> None:
        for n, i in enumerate(range(0, len(ids), batch)):
            part = ids[i : i + batch]
            single = n % 4 == 3
            while True:
                if single:
                    res = cli("add", "t.aof", part[0], timeout=60)
                    if res.returncode == 0:
                        acked.append(part[0])
                        single, part = False, part[1:]
                        if not part:
                            break
                        continue
                else:
                    # --retry-for 0: fail at once, this producer retries the batch itself
                    # (the default 30 s ride-out would outlast the wait for the outage)
                    res = cli(
                        "add",
                        "--from",
                        "-",
                        "--retry-for",
                        "0",
                        input=jsonl("t.aof", part),
                        timeout=60,
                    )
                    if res.returncode == 0:
                        acked.extend(part)
                        break
                assert res.returncode == 69, res.stderr  # only "Redis unreachable"
                failures.append(res.returncode)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _redis_kill9(own_server: RedisServer, cli: Cli, tmp_path: Path, n: int, kills: int) -> None:
    namespace = cli.namespace
    rs = fresh(own_server, namespace)
    log = tmp_path / "exec.log"
    h = script(tmp_path, "h.sh", EXEC_HANDLER)
    env = {"EXEC_LOG": str(log), "HANDLER_SLEEP": "0.01"}
    procs = Procs(cli, tmp_path)
    consumers = [
        procs.consumer("--handler", f"t.aof={h}", "--lease", "3s", env=env, name=f"c{i}")
        for i in range(2)
    ]
    q = rs.keys.queue("default")
    wait_for(lambda: rs.redis.zcard(q.consumers) == 2, timeout=30, what="2 consumers")
    ids = [f"a{i}" for i in range(n)]
    acked: list[str] = []
    failures: list[int] = []
    producer = _producer(cli, ids, 100, acked, failures)
    recoveries: list[float] = []
    acked_before_kill: list[str] = []
    for k in range(kills):
        # the first kill during enqueue, the others during the drain
        threshold = n * (k + 1) // (kills + 2)
        wait_for(
            lambda t=threshold: len(acked) >= t and count_lines(log) >= t // 2,  # type: ignore[misc]
            timeout=120,
            what=f"work before kill {k + 1}",
        )
        acked_before_kill = list(acked)
        own_server.kill()  # SIGKILL: no shutdown, no final fsync beyond 'appendfsync always'
        before = count_lines(log)
        refused = len(failures)
        wait_for(
            lambda: (
                all("Redis unreachable" in e.read_text() for _, e in consumers)
                and (len(failures) > refused or not producer.is_alive())  # noqa: B023
            ),
            timeout=30,
            what="both consumers and the producer see the outage",
        )
        own_server.start()  # same port and dir: reloads the AOF
        up = time.monotonic()
        rs = fresh(own_server, namespace)
        registered = rs.redis.zrange(q.consumers, 0, -1, withscores=True)
        # Both consumers talk to the new server (their registration is renewed) by
        # themselves: the same processes, never restarted.
        wait_for(
            lambda r=rs, old=dict(registered): (
                sum(  # type: ignore[misc]
                    1
                    for m, sc in r.redis.zrange(q.consumers, 0, -1, withscores=True)
                    if sc > old.get(m, 0)
                    and int(m.rsplit(":", 2)[1]) in {p.pid for p, _ in consumers}
                )
                == 2
            ),
            timeout=30,
            what="both consumers back",
        )
        wait_for(lambda b=before: count_lines(log) > b, timeout=30, what="a task runs again")  # type: ignore[misc]
        recoveries.append(time.monotonic() - up)
    producer.join(timeout=300)
    assert not producer.is_alive()
    rs = fresh(own_server, namespace)
    # Consumers reap the leases that the outage let expire; nothing stays in processing.
    wait_for(lambda: settled(rs.redis, rs), timeout=60, what="everything run and acked")
    assert all(p.poll() is None for p, _ in consumers)  # never restarted, never exited
    all_runs = runs(log)
    ran = {x.id for x in all_runs}
    lost = sorted(set(acked) - ran)
    assert not lost, f"{len(lost)} acknowledged tasks never ran: {lost[:10]}"
    assert set(acked) == set(ids)
    assert set(acked_before_kill) <= ran
    assert set(acked) == set(ids)
    assert [stop(p) for p, _ in consumers] == [0, 0]
    figure(
        "redis_kill9_aof_restart",
        tasks=n,
        redis_kills=kills,
        add_calls_refused_while_down=len(failures),
        acknowledged_lost=len(lost),
        duplicated_runs=len(all_runs) - len(ran),
        stuck_in_processing=0,
        recovery_s=[round(x, 2) for x in recoveries],
    )


def test_redis_kill9_and_aof_restart_during_enqueue_and_drain(
    own_server: RedisServer, own: tuple[Cli, Rsched], tmp_path: Path
) -> None:
    _redis_kill9(own_server, own[0], tmp_path, 1200, kills=2)


@pytest.mark.slow
def test_redis_kill9_and_aof_restart_soak(
    own_server: RedisServer, own: tuple[Cli, Rsched], tmp_path: Path
) -> None:
    _redis_kill9(own_server, own[0], tmp_path, 6000, kills=6)
