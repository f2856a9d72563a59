"""`rsched run expired` on Redis Cluster, against a real 3-primary cluster and
real `rsched run expired` processes: trigger keys in every slot fire once with
two runners, the backup sweep finds the per-slot armed sets of keys that
expired while no runner ran, and a runner follows a failover to the promoted
replica. Plus the slot arithmetic (checked against redis-py's ``key_slot``).
Every wait is a deadline on a condition."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
import redis.crc

from rsched.api import Rsched
from rsched.core.keys import CLUSTER_SLOTS, ExpiredKeys, key_slot, slot_tag
from rsched.expired import arm, disarm
from rsched.expired.notify import notify_flags_ok
from tests.clusters import Cluster, ClusterCli, ccli, cluster, needs_cluster
from tests.support import RSCHED, wait_for

__all__ = ["ccli", "cluster"]  # fixtures, imported for pytest


# ----------------------------------------------------------------------------- helpers


def handler(tmp_path: Path) -> tuple[Path, Path]:
    """A handler that appends "KEY<TAB>FIRED_BY<TAB>stdin" per run."""
    out = tmp_path / "runs.out"
    h = tmp_path / "h.sh"
    h.write_text(
        "#!/bin/sh\n"
        'in=$(cat)\nprintf \'%s\\t%s\\t%s\\n\' "$RSCHED_KEY" "$RSCHED_FIRED_BY" "$in"'
        f" >> '{out}'\n"
    )
    h.chmod(0o755)
    return h, out


def runs(out: Path) -> list[list[str]]:
    if not out.exists():
        return []
    return [line.split("\t") for line in out.read_text().splitlines()]


def start(
    ccli: ClusterCli, tmp_path: Path, *args: str, name: str
) -> tuple[subprocess.Popen[str], Path]:
    """A `run expired -v` process; stderr to a file we can read while it runs."""
    err_path = tmp_path / f"{name}.err"
    with open(err_path, "w") as err:
        p = subprocess.Popen(
            [*RSCHED, "-v", "run", "expired", *args],
            env=ccli.env(),
            cwd=ccli.cwd,
            text=True,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    ccli.procs.append(p)
    return p, err_path


def stop(p: subprocess.Popen[str], err: Path) -> str:
    os.killpg(p.pid, signal.SIGTERM)
    assert p.wait(timeout=20) == 0, err.read_text()
    return err.read_text()


def primaries(cl: Cluster) -> list[int]:
    out = []
    for n in cl.nodes:
        if not n.alive():
            continue
        c = n.client()
        try:
            if c.info("replication").get("role") == "master":
                out.append(n.port)
        finally:
            c.close()
    return out


def subscribers(cl: Cluster, port: int) -> int:
    n = next(n for n in cl.nodes if n.port == port)
    c = n.client()
    try:
        return sum(1 for x in c.client_list() if int(x.get("psub", 0)) > 0)
    finally:
        c.close()


def subscribed_everywhere(cl: Cluster, n: int) -> None:
    wait_for(
        lambda: all(subscribers(cl, port) >= n for port in primaries(cl)),
        timeout=20,
        what=f"{n} subscriber(s) on every primary",
    )


def set_notify(cl: Cluster) -> None:
    for n in cl.nodes:
        if n.alive():
            c = n.client()
            try:
                c.config_set("notify-keyspace-events", "Ex")
            finally:
                c.close()


def armed_entries(cl: Cluster, namespace: str) -> int:
    """Entries left in every armed set of the namespace, on every primary."""
    total = 0
    for port in primaries(cl):
        n = next(n for n in cl.nodes if n.port == port)
        c = n.client()
        try:
            for k in c.scan_iter(match=ExpiredKeys.scan_pattern(namespace), _type="zset"):
                total += int(c.zcard(k))
        finally:
            c.close()
    return total


def cluster_rs(cl: Cluster, namespace: str) -> Rsched:
    return Rsched.from_url(cl.url.replace("redis://", "redis+cluster://"), namespace)


# ----------------------------------------------------------------------------- slots (pure)


def test_key_slot_is_redis_key_slot() -> None:
    rnd = random.Random(7)
    names: list[bytes] = [
        b"",
        b"{",
        b"}",
        b"{}",
        b"{}x",
        b"x{}",
        b"{}{a}",
        b"{a}{b}",
        b"a{b}c{d}",
        b"{{a}}",
        b"}{a}",
        b"a{",
        b"a{b",
        b"{user1000}.following",
        b"foo{}{bar}",
        b"foo{{bar}}zap",
        b"foo{bar}{zap}",
        b"order:timeout:1001",
    ]
    alphabet = b"{}ab:x\x00\xff"
    for _ in range(5000):
        names.append(bytes(rnd.choice(alphabet) for _ in range(rnd.randint(0, 12))))
        names.append(rnd.randbytes(rnd.randint(0, 40)))
    for raw in names:
        assert key_slot(raw) == redis.crc.key_slot(raw), raw
    # str names: UTF-8, and surrogate escapes give back the original bytes
    for text in ("café:{ü}", "x{é}y", "\udcff\udcfe{a}", "{}é"):
        assert key_slot(text) == redis.crc.key_slot(text.encode("utf-8", "surrogateescape"))
    # well-known slots
    assert key_slot("foo") == 12182 and key_slot("{user1000}.following") == key_slot("user1000")


def test_slot_tags_cover_every_slot_and_expired_keys_share_their_trigger_slot() -> None:
    import rsched.core.keys as keys_mod

    keys_mod._slot_tags = None
    t0 = time.perf_counter()
    slot_tag(0)
    built_ms = (time.perf_counter() - t0) * 1000
    print(f"\nslot tag table built in {built_ms:.1f} ms")
    assert built_ms < 1000  # about 30 ms; generous for a loaded machine
    tags = [slot_tag(s) for s in range(CLUSTER_SLOTS)]
    assert all(t.isdigit() and len(t) <= 6 for t in tags)
    for s in range(CLUSTER_SLOTS):
        assert redis.crc.key_slot(b"ns:x:{" + tags[s].encode() + b"}:armed") == s
    for trigger in ("order:timeout:1001", "{tag}x", "k{}", b"\xff{\x00}"):
        ek = ExpiredKeys.for_key("ns", trigger, cluster=True)
        slot = key_slot(trigger)
        name = trigger if isinstance(trigger, str) else trigger.decode("utf-8", "surrogateescape")
        for k in (ek.armed, ek.values, ek.claim(name)):
            assert redis.crc.key_slot(k.encode("utf-8", "surrogateescape")) == slot, k
        assert ExpiredKeys.slot_of_armed("ns", ek.armed) == slot
        assert ExpiredKeys.slot_of_armed("ns", ek.values) is None
        assert ExpiredKeys.slot_of_armed("other", ek.armed) is None
    # a key that matches the SCAN glob but is not the slot's canonical name
    assert ExpiredKeys.slot_of_armed("ns", "ns:x:{007}:armed") is None
    # the single-Redis layout is unchanged
    single = ExpiredKeys.for_key("ns", "anything", cluster=False)
    assert (single.armed, single.values, single.claim("k")) == (
        "ns:{x}:armed",
        "ns:{x}:values",
        "ns:{x}:claim:k",
    )


# ----------------------------------------------------------------------------- the cluster


@needs_cluster
def test_keys_in_every_slot_fire_once_with_two_runners(
    cluster: Cluster, ccli: ClusterCli, tmp_path: Path
) -> None:
    set_notify(cluster)
    ns = ccli.namespace
    h, out = handler(tmp_path)
    procs = [
        start(
            ccli,
            tmp_path,
            "--pattern",
            f"{ns}:t:*",
            "--backup-sweep",
            "--concurrency",
            "4",
            "--",
            str(h),
            name=f"r{i}",
        )
        for i in range(2)
    ]
    subscribed_everywhere(cluster, 2)
    rs = cluster_rs(cluster, ns)
    try:
        armed, slots = [], set()
        for i in range(100_000):  # 200 keys in 200 different slots
            k = f"{ns}:t:a{i}"
            if key_slot(k) not in slots:
                slots.add(key_slot(k))
                armed.append(k)
                if len(armed) == 200:
                    break
        plain = [f"{ns}:t:p{i}" for i in range(40)]
        nodes = Counter(cluster.node_of(k).port for k in armed)
        assert len(nodes) == 3 and min(nodes.values()) > 30, nodes  # spread over the primaries
        assert len({key_slot(k) for k in armed}) == 200  # one slot each
        for i, k in enumerate(armed):
            arm(rs, k, 300 + 5 * i, value=f"v{k.rsplit(':a', 1)[1]}")
        for i, k in enumerate(plain):
            rs.redis.set(k, "x", px=300 + 10 * i)
        # a disarmed one never fires
        arm(rs, f"{ns}:t:cancelled", 200)
        assert disarm(rs, f"{ns}:t:cancelled") is True
        want = set(armed) | set(plain)
        wait_for(lambda: {r[0] for r in runs(out)} >= want, timeout=30, what="every key to fire")
        wait_for(lambda: armed_entries(cluster, ns) == 0, timeout=15, what="empty armed sets")
        logs = [stop(p, err) for p, err in procs]
    finally:
        rs.redis.close()
    counts = Counter(r[0] for r in runs(out))
    assert set(counts) == want, set(counts) ^ want
    assert all(n == 1 for n in counts.values()), {k: n for k, n in counts.items() if n != 1}
    for key, _by, stdin in runs(out):
        if ":t:a" in key:
            assert stdin == f"v{key.rsplit(':a', 1)[1]}"  # arm()'s value on stdin
    # both runners saw every event (one per primary each) and one of them claimed it
    dups = sum(int(log.rsplit(" failed, ", 1)[1].split(" dup")[0]) for log in logs)
    assert dups >= len(want) - 10, logs
    assert all("Traceback" not in log and "error" not in log for log in logs), logs


@needs_cluster
def test_backup_sweep_finds_per_slot_sets_of_keys_that_expired_with_no_runner(
    cluster: Cluster, ccli: ClusterCli, tmp_path: Path
) -> None:
    for n in cluster.nodes:  # expiry events off: --set-notify turns them on, on each primary
        n.client().config_set("notify-keyspace-events", "")
    ns = ccli.namespace
    h, out = handler(tmp_path)
    rs = cluster_rs(cluster, ns)
    try:
        keys = [f"{ns}:o:{i}" for i in range(60)]
        for k in keys:
            arm(rs, k, 100)
        assert len({cluster.node_of(k).port for k in keys}) == 3
        # Touch them past their expiry: Redis deletes them now, their events go
        # out while nobody listens.
        wait_for(lambda: sum(rs.redis.exists(k) for k in keys) == 0, what="the keys to expire")
        assert armed_entries(cluster, ns) == len(keys)
    finally:
        rs.redis.close()
    p, err = start(
        ccli,
        tmp_path,
        *("--pattern", f"{ns}:o:*", "--backup-sweep", "--set-notify", "--", str(h)),
        name="sweeper",
    )
    wait_for(lambda: len(runs(out)) >= len(keys), timeout=30, what="the sweep to fire them")
    wait_for(lambda: armed_entries(cluster, ns) == 0, timeout=10, what="empty armed sets")
    log = stop(p, err)
    for n in cluster.nodes:
        assert notify_flags_ok(
            n.client().config_get("notify-keyspace-events")["notify-keyspace-events"]
        )
    assert log.count("set notify-keyspace-events") == 3, log
    got = Counter((r[0], r[1]) for r in runs(out))
    assert got == {(k, "sweep"): 1 for k in keys}, got
    assert f"{len(keys)} fired ({len(keys)} by the sweep)" in log, log


# ----------------------------------------------------------------------------- failover


@needs_cluster
def test_primary_killed_runner_follows_the_promoted_replica(tmp_path: Path) -> None:
    """3 primaries with a replica each. Keys armed on one primary; it is SIGKILLed
    and its replica promoted. The running `run expired` subscribes to the new
    primary (and stops following the dead one); the keys fire once each, those
    due during the failover and those due after it."""
    cl = Cluster(primaries=3, replicas=1, node_timeout_ms=1000)
    ccli = ClusterCli("", f"f{uuid.uuid4().hex[:8]}", str(tmp_path))
    try:
        cl.start()
        ccli.url = cl.url
        set_notify(cl)
        ns = ccli.namespace
        h, out = handler(tmp_path)
        victim = next(n for n in cl.nodes if n.port in primaries(cl) and n is not cl.nodes[0])
        replica = cl.replica_of(victim)
        p, err = start(
            ccli, tmp_path, "--pattern", f"{ns}:f:*", "--backup-sweep", "--", str(h), name="runner"
        )
        subscribed_everywhere(cl, 1)
        rs = cluster_rs(cl, ns)
        try:
            on_victim = [k for k in (f"{ns}:f:{i}" for i in range(200)) if cl.node_of(k) is victim][
                :30
            ]
            early, late = on_victim[:15], on_victim[15:]
            for k in early:
                arm(rs, k, 1_500)  # due while the slot has no primary
            for k in late:
                arm(rs, k, 8_000)  # due after the promotion
        finally:
            rs.redis.close()
        v = victim.client()
        wait_for(  # the arms reached the replica before the kill
            lambda: (
                int(replica.client().info("replication")["slave_repl_offset"])
                >= int(v.info("replication")["master_repl_offset"])
            ),
            what="the replica to catch up",
        )
        v.close()
        victim.kill()
        wait_for(lambda: replica.port in primaries(cl), timeout=30, what="the promotion")
        wait_for(
            lambda: subscribers(cl, replica.port) >= 1,
            timeout=20,
            what="a subscription on the promoted replica",
        )
        want = set(early) | set(late)
        wait_for(lambda: {r[0] for r in runs(out)} >= want, timeout=30, what="every key to fire")
        assert p.poll() is None, "the runner carries on without a restart"
        log = stop(p, err)
    finally:
        ccli.close()
        cl.stop()
    counts = Counter(r[0] for r in runs(out))
    assert counts == {k: 1 for k in want}, counts
    assert f"127.0.0.1:{replica.port} is a primary now" in log, log
    assert f"127.0.0.1:{victim.port} is no longer a primary" in log, log


# ----------------------------------------------------------------------------- idle cost


#: What the runner itself sends (Lua's inner commands are counted by commandstats too).
TOP_LEVEL = ("eval", "evalsha", "ping", "cluster|slots", "scan", "psubscribe")


@pytest.mark.slow
@needs_cluster
def test_idle_runner_costs_each_node_about_one_command_a_second(
    cluster: Cluster, ccli: ClusterCli, tmp_path: Path
) -> None:
    """INFO commandstats over 30 s windows: a runner with nothing armed, then one
    that found 60 keys armed for 10 minutes (about 20 armed sets per primary)."""
    set_notify(cluster)
    ns = ccli.namespace
    h, _ = handler(tmp_path)

    def rates(window_s: float) -> dict[int, float]:
        ports = primaries(cluster)
        nodes = {port: next(n for n in cluster.nodes if n.port == port) for port in ports}
        clients = {port: n.client() for port, n in nodes.items()}
        for c in clients.values():
            c.config_resetstat()
        t0 = time.monotonic()
        wait_for(
            lambda: time.monotonic() - t0 >= window_s,
            timeout=window_s + 5,
            interval=0.5,
            what="the measuring window",
        )
        dt = time.monotonic() - t0
        out = {}
        for port, c in clients.items():
            stats = c.info("commandstats")
            calls = sum(
                int(v["calls"]) for k, v in stats.items() if k.removeprefix("cmdstat_") in TOP_LEVEL
            )
            out[port] = round(calls / dt, 2)
            c.close()
        return out

    p, err = start(
        ccli, tmp_path, "--pattern", f"{ns}:i:*", "--backup-sweep", "--", str(h), name="a"
    )
    subscribed_everywhere(cluster, 1)
    idle = rates(30)
    stop(p, err)
    rs = cluster_rs(cluster, ns)
    try:
        for i in range(60):
            arm(rs, f"{ns}:i:{i}", 600_000)
        p, err = start(
            ccli, tmp_path, "--pattern", f"{ns}:i:*", "--backup-sweep", "--", str(h), name="b"
        )
        wait_for(
            lambda: err.read_text().count("more armed set(s) to sweep") >= 3,
            timeout=20,
            what="each node's armed sets found",
        )
        armed = rates(30)
        stop(p, err)
        for i in range(60):
            disarm(rs, f"{ns}:i:{i}")
    finally:
        rs.redis.close()
    print(f"\nidle run expired, commands/s per primary: nothing armed {idle}, 60 armed {armed}")
    assert all(r <= 1.0 for r in idle.values()), idle
    assert all(r <= 1.5 for r in armed.values()), armed
