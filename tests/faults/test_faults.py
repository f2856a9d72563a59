"""Fault injection: every guarantee of SPEC.md section 1 under the fault it is about.

Real servers, real ``python -m rsched`` processes, real signals: consumers
``kill -9``'d at random, a consumer frozen past its lease, Redis ``kill -9``'d
and restarted from its AOF, Redis frozen, a cron holder frozen past its lock
TTL, ``SCRIPT FLUSH`` in a loop, clocks 30 s off (libfaketime), and a
least-privilege ACL user.

Executions are recorded by the handlers themselves (task id, claim token,
attempt, which consumer) in an ``O_APPEND`` file, independently of what rsched
says about itself, and compared with Redis's own records afterwards.

Each scenario prints its figures (``FIGURE name {...}``, visible with ``-s``)
for rsched-operations(7)'s guarantees. The short versions run in CI; the
``slow`` ones are soaks for a developer machine (``pytest -m slow``).
Single Redis only: Sentinel failover is in ``test_sentinel.py`` (and ``--wait-replicas``
in ``test_replicas.py``), Cluster in ``test_cluster.py``.
"""

from __future__ import annotations

import glob
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from rsched.api import Rsched
from rsched.core.timeutil import iso
from rsched.queue.ops import make_spec

# ----------------------------------------------------------------------------- constants
#: Every Redis command rsched issues (directly or from its Lua scripts) for add, cancel,
#: list, show, queues, requeue-stale, dead/retry/purge, run consumer, run cron, exec,
#: locks, crons, history and metrics. Found by running those against a server under
#: MONITOR, and from the Lua sources; ``doctor`` additionally reads ``INFO``/``CONFIG
#: GET`` and says "could not verify" when they are refused. No pub/sub, no KEYS, no
#: FLUSH*, no CONFIG, nothing outside the namespace (a script's keys are checked too).
# The list lives in rsched.tools.doctor (doctor checks a user against it and prints this line).
from rsched.tools.doctor import ACL_COMMANDS, acl_setuser  # noqa: E402
from tests.support import Cli, RedisServer, wait_for

#: The least-privilege user for the default namespace ``rsched`` (rsched-operations(7), reliability
#: section). Put the real password instead of CHANGE-ME and give it to rsched through
#: ``RSCHED_REDIS_PASSWORD`` or ``redis.password_file``, with the user in the URL
#: (``redis://rsched@host:6379/0``) or ``redis.username``.
ACL_SETUSER = acl_setuser()

FAKETIME_LIB = next(
    iter(
        sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
        + sorted(glob.glob("/usr/lib/faketime/libfaketime.so.1"))
    ),
    None,
)

SEED = os.environ.get("RSCHED_FAULTS_SEED")  # reproduce a chaos run: RSCHED_FAULTS_SEED=1234

# ----------------------------------------------------------------------------- helpers


def figure(name: str, **values: Any) -> None:
    """One measured figure for rsched-operations(7)'s guarantees (``pytest -s`` shows it)."""
    print(f"\nFIGURE {name} {json.dumps(values, sort_keys=True)}")


def script(tmp_path: Path, name: str, body: str, shell: str = "/bin/sh") -> Path:
    p = tmp_path / name
    p.write_text(f"#!{shell}\n" + textwrap.dedent(body).lstrip())
    p.chmod(0o755)
    return p


#: A command handler: one O_APPEND line per run (a single short write(2), so lines
#: from concurrent handlers never interleave), then an optional sleep. $CONSUMER_TAG
#: names the consumer (not $PPID: a handler whose consumer was just killed sees 1).
EXEC_HANDLER = """
    echo "$1 $RSCHED_CLAIM_TOKEN $RSCHED_ATTEMPT $CONSUMER_TAG" >> "$EXEC_LOG"
    if [ -n "$HANDLER_SLEEP" ]; then sleep "$HANDLER_SLEEP"; fi
"""

#: The same as a Python callable (``--call TYPE=frec:run``), for high-rate load.
EXEC_MODULE = """
import os

_fd = os.open(os.environ["EXEC_LOG"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
_tag = os.environ.get("CONSUMER_TAG", "0")


def run(task):
    os.write(_fd, f"{task.id} {task.token} {task.attempt} {_tag}\\n".encode())
"""


SLOW_CALL = """

def slow(task):
    run(task)
    import time

    time.sleep(0.003)
"""


@dataclass
class Run:
    id: str
    token: str
    attempt: int
    pid: int


def runs(log: Path) -> list[Run]:
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) == 4:  # a line being written has no newline yet: skipped above
            out.append(Run(parts[0], parts[1], int(parts[2]), int(parts[3])))
    return out


def count_lines(log: Path) -> int:
    try:
        with open(log, "rb") as fh:
            return fh.read().count(b"\n")
    except FileNotFoundError:
        return 0


def history(r: redis.Redis, rs: Rsched, queue: str = "default") -> list[dict[str, Any]]:
    return [json.loads(f["j"]) for _, f in r.xrange(rs.keys.queue(queue).history)]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] not in "ZX"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


class Procs:
    """Long-running rsched processes of one test, each logging stderr to its own file."""

    def __init__(self, cli: Cli, tmp_path: Path):
        self.cli = cli
        self.tmp = tmp_path
        self.n = 0
        self.tags: dict[int, int] = {}

    def spawn(
        self, *args: str, env: dict[str, str] | None = None, name: str = "p"
    ) -> tuple[subprocess.Popen[str], Path]:
        self.n += 1
        err_path = self.tmp / f"{name}-{self.n}.err"
        fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            p = self.cli.spawn(*args, env=env, stdout=subprocess.DEVNULL, stderr=fd)
        finally:
            os.close(fd)
        return p, err_path

    def errors(self) -> list[str]:
        """Error lines of every process (consumers say "error:", cron runners "unavailable")."""
        out = []
        for p in sorted(self.tmp.glob("*.err")):
            out += [
                f"{p.name}: {x}"
                for x in p.read_text().splitlines()
                if "error" in x or "unavailable" in x
            ]
        return out

    def consumer(
        self, *args: str, env: dict[str, str] | None = None, name: str = "c"
    ) -> tuple[subprocess.Popen[str], Path]:
        """A consumer; its handlers see CONSUMER_TAG, which ``self.tags`` maps to its pid."""
        tag = str(self.n + 1)
        p, err = self.spawn("run", "consumer", *args, env={**(env or {}), "CONSUMER_TAG": tag},
                            name=name)  # fmt: skip
        self.tags[int(tag)] = p.pid
        return p, err


def stop(p: subprocess.Popen[str], timeout: float = 30) -> int:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGCONT)
        p.send_signal(signal.SIGTERM)
    return p.wait(timeout=timeout)


def errors_in(path: Path) -> list[str]:
    return [x for x in path.read_text().splitlines() if "error" in x.lower()]


def settled(r: redis.Redis, rs: Rsched, queue: str = "default") -> bool:
    """Nothing left: no task record, nothing scheduled, processing or dead."""
    q = rs.keys.queue(queue)
    pipe = r.pipeline(transaction=False)
    pipe.hlen(q.tasks).zcard(q.sched).zcard(q.proc).zcard(q.dead)
    return not any(pipe.execute())


def jsonl(task_type: str, ids: list[str], **extra: Any) -> str:
    return "".join(json.dumps({"type": task_type, "id": i, **extra}) + "\n" for i in ids)


def pace(seconds: float, until: Callable[[], bool]) -> None:
    """The chaos schedule: wait ``seconds`` before the next fault, or less when ``until``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not until():
        time.sleep(0.02)


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


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


def fresh(server: RedisServer, namespace: str) -> Rsched:
    """A library handle with a new connection (after the server was restarted)."""
    return Rsched(server.client(socket_timeout=10), namespace)


# ============================================================================ 1. kill -9 chaos


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


# ============================================================================ 2. frozen consumer

#: Logs its start (with its own pid) and end; the first attempt of ``long*`` outlives
#: any freeze, of ``short*`` ends while its consumer is frozen.
FREEZE_HANDLER = """
    echo "start $1 $RSCHED_CLAIM_TOKEN $RSCHED_ATTEMPT $CONSUMER_TAG $$" >> "$EXEC_LOG"
    if [ "$RSCHED_ATTEMPT" = 1 ]; then
        case "$1" in long*) sleep 60;; short*) sleep 0.3;; esac
    fi
    echo "end $1 $RSCHED_CLAIM_TOKEN $RSCHED_ATTEMPT $CONSUMER_TAG" >> "$EXEC_LOG"
"""


def _events(log: Path, kind: str) -> list[list[str]]:
    if not log.exists():
        return []
    return [x.split()[1:] for x in log.read_text().splitlines() if x.startswith(kind + " ")]


def test_consumer_frozen_past_its_lease_is_refused_and_its_run_does_not_count(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    """SIGSTOP a consumer holding two tasks: one whose handler finishes while it is
    frozen (its ack must be refused) and one still running when it wakes (its heartbeat
    must be refused and its handler killed). Both ran again elsewhere; only those runs
    count; the woken consumer goes on working."""
    log = tmp_path / "exec.log"
    h = script(tmp_path, "h.sh", FREEZE_HANDLER)
    env = {"EXEC_LOG": str(log)}
    procs = Procs(cli, tmp_path)
    args = ("--handler", f"t.f={h}", "--concurrency", "2", "--lease", "1s")
    a, a_err = procs.consumer(*args, env=env, name="a")
    rs.add_many([make_spec("t.f", "short1"), make_spec("t.f", "long1")])
    wait_for(lambda: len(_events(log, "start")) == 2, timeout=20, what="a runs both")
    long_pid = int(next(e for e in _events(log, "start") if e[0] == "long1")[4])
    try:
        os.kill(a.pid, signal.SIGSTOP)  # the consumer only; its handlers go on
        frozen_at = time.monotonic()
        b, b_err = procs.consumer(*args, env=env, name="b")
        b_tag = str(max(procs.tags))
        retaken: dict[str, float] = {}

        def both_retaken() -> bool:
            for e in _events(log, "start"):
                if e[3] == b_tag and e[0] not in retaken:
                    retaken[e[0]] = time.monotonic() - frozen_at
            return len(retaken) == 2

        wait_for(both_retaken, timeout=30, what="b takes both over")
        wait_for(lambda: settled(rs.redis, rs), timeout=20, what="b acks both")
        a_tag = str(min(procs.tags))
        assert [e[2:] for e in _events(log, "end") if e[0] == "short1"] == [
            ["1", a_tag],
            ["2", b_tag],
        ]
        os.kill(a.pid, signal.SIGCONT)
        wait_for(lambda: not alive(long_pid), timeout=15, what="a kills its stale handler")
        text = lambda: a_err.read_text()  # noqa: E731
        wait_for(lambda: "ack refused for t.f short1" in text(), timeout=15, what="ack refused")
        assert "lease lost for t.f long1" in text()
    finally:
        os.kill(a.pid, signal.SIGCONT)
        if alive(long_pid):
            os.kill(long_pid, signal.SIGKILL)
    assert not any(e[0] == "long1" and e[2] == "1" for e in _events(log, "end"))
    # Only b's runs count: one ok record per task, with b's token; the stale report
    # did not bring the tasks back or count them twice.
    q = rs.keys.queue("default")
    b_tokens = {e[0]: e[1] for e in _events(log, "start") if e[3] == b_tag}
    ok = [x for x in history(rs.redis, rs) if x["result"] == "ok"]
    assert sorted((x["id"], x["token"]) for x in ok) == sorted(b_tokens.items())
    assert all(x["attempt"] == 2 for x in ok)
    assert rs.redis.hget(q.stats, "ok|t.f") == "2"
    assert settled(rs.redis, rs)
    # The woken consumer is healthy: with b gone, it runs the next task itself.
    assert stop(b) == 0
    rs.add("t.f", "after1")
    wait_for(lambda: settled(rs.redis, rs), timeout=20, what="a runs a new task")
    assert [e[3] for e in _events(log, "start") if e[0] == "after1"] == [str(min(procs.tags))]
    assert stop(a) == 0
    figure(
        "consumer_sigstop_takeover",
        lease_ms=1000,
        takeover_ms_short=round(retaken["short1"] * 1000),
        takeover_ms_long=round(retaken["long1"] * 1000),
        stale_results_counted=0,
    )
    assert not errors_in(b_err)


# ============================================================================ 3. Redis kill -9


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
                    res = cli("add", "--from", "-", input=jsonl("t.aof", part), timeout=60)
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


# ============================================================================ 4. Redis frozen


def _cron_fires(log: Path) -> list[list[str]]:
    return [x.split() for x in log.read_text().splitlines()] if log.exists() else []


def _redis_freeze(
    own_server: RedisServer, cli: Cli, rs: Rsched, tmp_path: Path, n: int, freezes: int
) -> None:
    log = tmp_path / "exec.log"
    fires = tmp_path / "fires.log"
    h = script(tmp_path, "h.sh", EXEC_HANDLER)
    env = {"EXEC_LOG": str(log), "HANDLER_SLEEP": "0.02"}
    procs = Procs(cli, tmp_path)
    consumers = [
        procs.consumer("--handler", f"t.frz={h}", "--concurrency", "2", "--lease", "1s",
                       env=env, name=f"c{i}")
        for i in range(2)
    ]  # fmt: skip
    job = f'echo "$RSCHED_FIRE_AT $RSCHED_FENCING_TOKEN $PPID" >> {fires}'
    runners = [
        procs.spawn("run", "cron", "frz", "--schedule", "*/1 * * * * *", "--ttl", "1s",
                    "--", "sh", "-c", job, name=f"cron{i}")[0]
        for i in range(2)
    ]  # fmt: skip
    q = rs.keys.queue("default")
    wait_for(lambda: rs.redis.zcard(q.consumers) == 2, timeout=30, what="2 consumers")
    rs.add_many([make_spec("t.frz", f"f{i}") for i in range(n)])
    freeze_s = 3.0  # > the 1 s lease and the 1 s cron lock TTL
    task_recovery: list[float] = []
    cron_recovery: list[float] = []
    for k in range(freezes):
        before = (n * (k + 1) // (freezes + 1), len(_cron_fires(fires)) + 2)
        wait_for(
            lambda b=before: count_lines(log) >= b[0] and len(_cron_fires(fires)) >= b[1],  # type: ignore[misc]
            timeout=120,
            what=f"work and fires before freeze {k + 1}",
        )
        own_server.freeze()
        try:
            time.sleep(freeze_s)  # the outage under test, not a synchronisation
            at_thaw = (count_lines(log), len(_cron_fires(fires)))
        finally:
            own_server.thaw()
        thawed = time.monotonic()
        wait_for(lambda a=at_thaw: count_lines(log) > a[0], timeout=30, what="a task runs")  # type: ignore[misc]
        task_recovery.append(time.monotonic() - thawed)
        wait_for(lambda a=at_thaw: len(_cron_fires(fires)) > a[1], timeout=30, what="a fire")  # type: ignore[misc]
        cron_recovery.append(time.monotonic() - thawed)
    wait_for(lambda: settled(rs.redis, rs), timeout=120, what="everything run and acked")
    k = len(_cron_fires(fires))
    wait_for(lambda: len(_cron_fires(fires)) >= k + 2, timeout=20, what="cron goes on")
    everyone = [p for p, _ in consumers] + runners
    assert all(p.poll() is None for p in everyone)  # none exited, none was restarted
    assert [stop(p) for p in everyone] == [0] * 4
    all_runs = runs(log)
    ran = Counter(x.id for x in all_runs)
    assert len(ran) == n, f"{n - len(ran)} tasks lost"
    assert rs.redis.hget(q.stats, "ok|t.frz") == str(n)
    dups = sum(ran.values()) - n
    assert dups <= 2 * 2 * freezes  # at most what the two consumers held when Redis froze
    # Each tick fired once, fencing tokens only go up, and the history agrees.
    fired = _cron_fires(fires)
    twice = {f: c for f, c in Counter(f[0] for f in fired).items() if c > 1}
    assert not twice, f"ticks fired twice: {twice}"
    tokens = [int(f[1]) for f in fired]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    recs = cli.json("history", "frz", "--limit", "10000")
    # one run record per fired tick (the last may say "failed": stopped with its runner)
    run_ticks = Counter(r["fire_ms"] for r in recs if r["result"] not in ("skipped", "missed"))
    assert max(run_ticks.values()) == 1 and len(run_ticks) == len(fired), recs
    figure(
        "redis_sigstop",
        freezes=freezes,
        freeze_s=freeze_s,
        lease_ms=1000,
        cron_ttl_ms=1000,
        tasks=n,
        lost=n - len(ran),
        duplicated_runs=dups,
        cron_runners=2,
        cron_double_fires=len(twice),
        task_recovery_s=[round(x, 2) for x in task_recovery],
        cron_recovery_s=[round(x, 2) for x in cron_recovery],
    )


def test_redis_frozen_past_leases_consumers_and_cron_recover(
    own_server: RedisServer, own: tuple[Cli, Rsched], tmp_path: Path
) -> None:
    _redis_freeze(own_server, *own, tmp_path, 600, freezes=1)


@pytest.mark.slow
def test_redis_frozen_soak(
    own_server: RedisServer, own: tuple[Cli, Rsched], tmp_path: Path
) -> None:
    _redis_freeze(own_server, *own, tmp_path, 3000, freezes=5)


# ============================================================================ 5. SCRIPT FLUSH


def test_script_flush_in_a_loop_fails_no_operation(
    own_server: RedisServer, own: tuple[Cli, Rsched], tmp_path: Path
) -> None:
    cli, rs = own
    log = tmp_path / "exec.log"
    (tmp_path / "frec.py").write_text(textwrap.dedent(EXEC_MODULE))
    env = {"EXEC_LOG": str(log)}
    procs = Procs(cli, tmp_path)
    consumers = [
        procs.consumer("--call", "t.fl=frec:run", "--concurrency", "2", env=env, name=f"c{i}")
        for i in range(2)
    ]
    fires = tmp_path / "fires.log"
    runner, runner_err = procs.spawn(
        "run", "cron", "fl", "--schedule", "*/1 * * * * *", "--", "sh", "-c",
        f'echo "$RSCHED_FIRE_AT" >> {fires}', name="cron",
    )  # fmt: skip
    done = threading.Event()
    flushes = [0]

    def flusher() -> None:
        r = own_server.client()
        while not done.is_set():
            r.script_flush()
            flushes[0] += 1
            done.wait(0.002)

    t = threading.Thread(target=flusher, daemon=True)
    t.start()
    failed: list[str] = []

    def ok(*args: str, **kw: Any) -> None:
        res = cli(*args, **kw)
        if res.returncode != 0:
            failed.append(f"rsched {' '.join(args)} -> {res.returncode}: {res.stderr.strip()}")

    ids: list[str] = []
    try:
        for b in range(8):
            part = [f"b{b}-{i}" for i in range(250)]
            ids += part
            ok("add", "--from", "-", input=jsonl("t.fl", part))
            ok("add", "t.fl", f"s{b}")
            ids.append(f"s{b}")
            ok("add", "--in", "1h", "t.later", f"x{b}")
            ok("show", "t.later", f"x{b}")
            ok("cancel", "t.later", f"x{b}")
            ok("list", "--limit", "5")
            ok("queues")
            ok("requeue-stale")
            ok("exec", "--lock", "fl", "--", "true")
        everyone = [p for p, _ in consumers] + [runner]
        wait_for(
            lambda: {x.id for x in runs(log)} >= set(ids) or any(p.poll() for p in everyone),
            timeout=60,
            what="all tasks ran (or a process died)",
        )
        wait_for(lambda: len(_cron_fires(fires)) >= 2, timeout=20, what="cron fires")
    finally:
        done.set()
        t.join(timeout=10)
    alive_after = [p.poll() is None for p in everyone]
    errs = procs.errors()
    figure("script_flush", flushes=flushes[0], tasks=len(ids), failed_operations=len(failed),
           process_errors=len(errs))  # fmt: skip
    assert not failed, "\n".join(failed)
    assert all(alive_after), f"a process died under SCRIPT FLUSH: {errs[:5]}"
    assert not errs, errs[:5]
    wait_for(lambda: settled(rs.redis, rs), timeout=30, what="everything acked")
    assert [stop(p) for p in everyone] == [0, 0, 0]
    assert flushes[0] > 100


# ============================================================================ 6. clock skew


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


# ============================================================================ 7. ACL user


def acl_rules(namespace: str, password: str) -> list[str]:
    """``ACL_SETUSER``'s rules for a test namespace and password."""
    words = ACL_SETUSER.split()[3:]
    return [
        f">{password}"
        if w == ">CHANGE-ME"
        else f"~{namespace}:*"
        if w == "~rsched:*"
        else f"&{namespace}:*"
        if w == "&rsched:*"
        else w
        for w in words
    ]


def _acl_cli(own_server: RedisServer, namespace: str, tmp_path: Path) -> tuple[Cli, str]:
    """A Cli that logs in as a fresh least-privilege user of ``namespace`` (password
    from the environment, never argv); also returns the password."""
    admin = own_server.client()
    password = "s3cret-" + namespace
    user = "rsched-" + namespace
    assert admin.execute_command("ACL", "SETUSER", user, *acl_rules(namespace, password)) == "OK"
    url = f"redis://{user}@127.0.0.1:{own_server.port}/0"
    cli = Cli(own_server, namespace, cwd=str(tmp_path))
    base_env = cli.env
    cli.env = lambda **extra: {  # type: ignore[method-assign]
        **base_env(), "RSCHED_REDIS_URL": url, "RSCHED_REDIS_PASSWORD": password, **extra
    }  # fmt: skip
    return cli, password


def test_acl_user_outside_its_namespace_is_a_configuration_error_exit_78(
    own_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    cli, _ = _acl_cli(own_server, namespace, tmp_path)
    try:
        for args in (
            ["add", "t.acl", "x1"],
            ["add", "--from", "-"],
            ["list"],
            ["requeue-stale", "--queue", "default"],
            ["run", "consumer", "--handler", "t.acl=true", "--burst"],
            ["exec", "--lock", "x", "--", "true"],
        ):
            res = cli("--namespace", "other", *args, input=jsonl("t.acl", ["x2"]))
            assert res.returncode == 78 and "permission" in res.stderr, (args, res)
            assert "internal error" not in res.stderr
    finally:
        cli.close()


def test_least_privilege_acl_user_runs_everything_and_is_refused_the_rest(
    own_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    admin = own_server.client()
    cli, password = _acl_cli(own_server, namespace, tmp_path)
    user = "rsched-" + namespace
    procs = Procs(cli, tmp_path)
    log = tmp_path / "exec.log"
    h = script(tmp_path, "h.sh", EXEC_HANDLER + '\n    [ "$1" = slow1 ] && sleep 60; true\n')
    env = {"EXEC_LOG": str(log), "CONSUMER_TAG": "0"}
    try:
        # the user cannot do more than rsched needs
        user_client = redis.Redis(host="127.0.0.1", port=own_server.port, username=user,
                                  password=password, decode_responses=True)  # fmt: skip
        assert user_client.ping()
        for refused in (
            lambda: user_client.flushall(),
            lambda: user_client.flushdb(),
            lambda: user_client.config_set("appendonly", "no"),
            lambda: user_client.config_get("*"),
            lambda: user_client.set("other:key", "x"),
            lambda: user_client.get("other:key"),
            lambda: user_client.keys("*"),
            lambda: user_client.execute_command("SCRIPT", "FLUSH"),
            lambda: user_client.acl_setuser("rsched-more", enabled=True),
            lambda: user_client.execute_command("MODULE", "LIST"),
            lambda: user_client.shutdown(),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                refused()
        # EVAL is allowed, but a script is held to the same keys
        with pytest.raises(
            redis.exceptions.ResponseError, match="permission|NOPERM|access|can.t run"
        ):
            user_client.eval("return redis.call('GET', KEYS[1])", 1, "other:key")
        with pytest.raises(
            redis.exceptions.ResponseError, match="permission|NOPERM|access|can.t run"
        ):
            user_client.eval("return redis.call('FLUSHALL')", 0)
        # ...and everything rsched does works with it, without a single refusal (the ACL
        # log also catches what a script swallowed with pcall, such as a ZMSCORE fallback)
        admin.execute_command("ACL", "LOG", "RESET")
        cli("add", "t.acl", "a1", check=0)
        cli("add", "--from", "-", input=jsonl("t.acl", ["a2", "a3"]), check=0)
        cli("add", "--in", "1h", "t.acl", "later", check=0)
        assert cli.json("show", "t.acl", "later")["state"] == "scheduled"
        assert len(cli.json("list", "--state", "all")) == 4
        assert cli.json("queues")[0]["due"] == 3
        cli("cancel", "t.acl", "later", check=0)
        cli("run", "consumer", "--handler", f"t.acl={h}", "--burst", env=env, check=0)
        assert {x.id for x in runs(log)} == {"a1", "a2", "a3"}
        # a consumer kill -9'd mid-task; requeue-stale brings its task back
        cli("add", "t.acl", "slow1", check=0)
        c, _ = procs.consumer("--handler", f"t.acl={h}", "--lease", "500ms", env=env)
        wait_for(lambda: "slow1" in {x.id for x in runs(log)}, timeout=20, what="slow1 runs")
        os.kill(c.pid, signal.SIGKILL)
        c.wait(timeout=10)
        requeued: list[dict[str, int]] = []
        wait_for(
            lambda: requeued.append(cli.json("requeue-stale")) or requeued[-1]["requeued"],
            timeout=10,
            what="requeue-stale requeues it once its lease expired",
        )
        assert requeued[-1] == {"requeued": 1, "dead": 0}
        assert cli.json("show", "t.acl", "slow1")["state"] == "due"
        cli("cancel", "t.acl", "slow1", check=0)
        cli("history", "--queue", "default", check=0)
        # cron runner, exec (plain and once per tick), locks, crons, pause/resume
        fires = tmp_path / "fires.log"
        runner, runner_err = procs.spawn(
            "run", "cron", "acl", "--schedule", "*/1 * * * * *", "--", "sh", "-c",
            f'echo "$RSCHED_FIRE_AT" >> {fires}', name="cron",
        )  # fmt: skip
        wait_for(lambda: len(_cron_fires(fires)) >= 2, timeout=20, what="cron fires")
        cli("crons", check=0)
        cli("history", "acl", check=0)
        assert stop(runner) == 0
        cli("exec", "--lock", "acl-lock", "--", "true", check=0)
        cli("exec", "--lock", "acl-once", "--once-per", "1m", "--", "true", check=0)
        cli("exec", "--lock", "acl-watch", "--ttl", "600ms", "--", "sleep", "1", check=0)
        cli("locks", check=0)
        cli("pause", "acl", check=0)
        cli("resume", "acl", check=0)
        cli("pause", "--queue", "default", "--create", check=0)
        cli("resume", "--queue", "default", check=0)
        cli("cancel", "--all", "--type", "t.acl", "--dry-run", check=0)
        cli("cancel", "--all", "--type", "t.acl", check=0)
        cli("forget", "acl", check=0)
        assert "rsched_" in cli("metrics", check=0).stdout
        # Run loops try INFO/CONFIG once at start for doctor's startup warnings and say
        # "could not verify" when refused; every other denial means ACL_COMMANDS is short.
        denied = [
            d for d in admin.acl_log()
            if not (d.get("reason") == "command" and str(d.get("object", "")).split("|")[0] in ("info", "config"))
        ]  # fmt: skip
        assert not denied, f"rsched needs more than ACL_COMMANDS: {denied}"
        # a namespace outside the user's keys is refused, and nothing is written there
        res = cli("--namespace", "other", "add", "t.acl", "x1")
        assert res.returncode != 0 and "permission" in res.stderr, res
        assert not list(admin.scan_iter("other:*"))
        # none of that leaked the password
        leaked = [p for p in tmp_path.glob("*.err") if password in p.read_text()]
        assert not leaked
        assert not [x for x in procs.errors() if "NOPERM" in x or "permission" in x]
    finally:
        cli.close()
    figure("acl", user_commands=len(ACL_COMMANDS), acl_line=ACL_SETUSER)


# ============================================================================ cron runner frozen


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
        first = wait_for(lambda: _cron_fires(fires), timeout=20, what="the first run")[0]
        holder = next(p for p in runners if str(p.pid) == first[2])
        other = next(p for p in runners if p is not holder)
        os.kill(holder.pid, signal.SIGSTOP)  # the runner; its job (own group) goes on
        frozen_at = time.monotonic()
        second = wait_for(lambda: _cron_fires(fires)[1:], timeout=15, what="takeover")[0]
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
        assert len(_cron_fires(fires)) == 2  # nobody fired a third time meanwhile
        # The woken runner is healthy: when the holder goes away, it takes over.
        os.kill(int(second[3]), signal.SIGKILL)
        third = wait_for(lambda: _cron_fires(fires)[2:], timeout=15, what="next fire")[0]
        assert int(third[1]) > int(second[1])
        assert stop(other) == 0  # SIGTERM stops its job too

        def woken_fires() -> list[list[str]]:
            return [f for f in _cron_fires(fires)[2:] if f[2] == str(holder.pid)]

        fourth = wait_for(woken_fires, timeout=20, what="the once-frozen runner fires again")[0]
        tokens = [int(f[1]) for f in _cron_fires(fires)]
        assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), tokens
        assert int(fourth[1]) > int(second[1])
        assert stop(holder) == 0
    finally:
        for f in _cron_fires(fires):
            if alive(int(f[3])):
                os.kill(int(f[3]), signal.SIGKILL)
    figure("cron_runner_sigstop", ttl_ms=1000, takeover_ms=round(takeover * 1000),
           fencing_went_backwards=0)  # fmt: skip
