"""Owned locks: fencing tokens, owner-checked renew/release, the watchdog,
`rsched locks` and `rsched unlock`."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from typing import Any

import pytest

from rsched.client import Rsched
from rsched.errors import Conflict, LockHeld, NotFound
from rsched.locks import Lock, list_locks, unlock
from tests.support import ROOT, Cli, wait_for


def test_context_manager_yields_increasing_fencing_tokens(rs: Rsched) -> None:
    tokens = []
    for _ in range(3):
        with rs.lock("job", ttl_ms=5000) as tok:
            tokens.append(tok)
            assert rs.redis.exists(rs.keys.lock("job").lock)
        assert not rs.redis.exists(rs.keys.lock("job").lock)
    assert tokens == sorted(tokens) and len(set(tokens)) == 3


def test_busy_lock_raises_or_waits(rs: Rsched) -> None:
    with rs.lock("busy", ttl_ms=5000):
        with pytest.raises(LockHeld) as e:
            with rs.lock("busy"):
                pass
        assert "fencing token" in str(e.value)
    done = threading.Event()

    def hold() -> None:
        with rs.lock("busy2", ttl_ms=5000):
            done.wait(5)

    t = threading.Thread(target=hold)
    t.start()
    wait_for(lambda: rs.redis.exists(rs.keys.lock("busy2").lock), what="holder")
    threading.Timer(0.3, done.set).start()
    with rs.lock("busy2", wait=5) as tok:
        assert tok == 2
    t.join()


def test_renew_and_release_only_by_owner(rs: Rsched) -> None:
    a = Lock(rs, "own", ttl_ms=5000, watchdog=False)
    b = Lock(rs, "own", ttl_ms=5000, watchdog=False)
    assert a.acquire() == 1
    assert b.renew() == 0  # not the owner
    assert b.release() is False
    assert rs.redis.hget(rs.keys.lock("own").lock, "token") == "1"
    assert a.renew() == 1
    assert a.release() is True
    assert a.release() is False  # already released: never deletes someone else's


def test_watchdog_keeps_lock_past_ttl_and_reports_loss(rs: Rsched) -> None:
    lost: list[str] = []
    lk = Lock(rs, "dog", ttl_ms=600, on_lost=lost.append)
    with lk as tok:
        key = rs.keys.lock("dog").lock
        # Three TTLs later it is still ours: the watchdog renews every TTL/3.
        wait_for(
            lambda: rs.redis.pttl(key) > 0 and lk._watchdog and lk._watchdog._last_ok, timeout=2
        )
        first = rs.redis.hget(key, "since")
        threading.Event().wait(1.8)  # the condition under test is elapsed time itself
        assert rs.redis.hget(key, "token") == str(tok) and rs.redis.hget(key, "since") == first
        unlock(rs, "dog", force=True)  # an operator takes it away
        wait_for(lambda: lk.lost.is_set(), timeout=2, what="loss noticed")
        assert lost and "expired or was taken" in lost[0]


def test_unlock_by_token(rs: Rsched) -> None:
    lk = Lock(rs, "u", ttl_ms=5000, watchdog=False)
    tok = lk.acquire()
    with pytest.raises(Conflict):
        unlock(rs, "u", str(tok + 1))
    assert unlock(rs, "u", str(tok)) == tok
    with pytest.raises(NotFound):
        unlock(rs, "u", str(tok))


def test_list_locks_fields(rs: Rsched) -> None:
    with rs.lock("alpha", ttl_ms=5000) as tok, rs.lock("beta", ttl_ms=5000):
        rows = list_locks(rs)
        assert [r.name for r in rows] == ["alpha", "beta"]
        j = rows[0].to_json()
        assert {"name", "owner", "host", "pid", "ttl_ms", "held_ms", "token"} <= set(j)
        assert j["token"] == tok and 0 < j["ttl_ms"] <= 5000 and j["held_ms"] >= 0
        assert [r.name for r in list_locks(rs, "al*")] == ["alpha"]


def test_cli_locks_and_unlock(cli: Cli, rs: Rsched) -> None:
    lk = Lock(rs, "cli-lock", ttl_ms=10_000, watchdog=False)
    tok = lk.acquire()
    rows = cli.json("locks")
    assert rows[0]["name"] == "cli-lock" and rows[0]["token"] == tok
    assert rows[0]["owner"] == f"{rows[0]['host']}:{rows[0]['pid']}"
    assert cli.json("locks", "nomatch*") == []
    r = cli("unlock", "cli-lock", "--token", str(tok + 5))
    assert r.returncode == 4, r.stderr
    assert cli("unlock", "cli-lock").returncode == 2  # neither --token nor --force
    cli("unlock", "cli-lock", "--token", str(tok), check=0)
    assert cli("unlock", "cli-lock", "--force").returncode == 3
    assert cli("unlock", "bad name!", "--force").returncode == 2


def test_cli_unlock_json_and_messages_name_the_lock(cli: Cli, rs: Rsched) -> None:
    tok = Lock(rs, "j-lock", ttl_ms=10_000, watchdog=False).acquire()
    res = cli("unlock", "j-lock", "--token", str(tok + 1))
    assert res.returncode == 4
    assert res.stderr == (
        f'rsched: error: lock "j-lock" is held with fencing token {tok}, not {tok + 1}\n'
    )
    res = cli("unlock", "j-lock", "--token", str(tok), "--json", check=0)
    assert json.loads(res.stdout) == {"name": "j-lock", "released": True, "token": tok}
    assert res.stderr == ""
    res = cli("unlock", "j-lock", "--force")
    assert res.returncode == 3 and res.stderr == 'rsched: error: no lock "j-lock" is held\n'
    tok = Lock(rs, "j-lock", ttl_ms=10_000, watchdog=False).acquire()
    res = cli("--format", "json", "unlock", "j-lock", "--force", check=0)  # the global option too
    assert json.loads(res.stdout) == {"name": "j-lock", "released": True, "token": tok}
    res = cli("unlock", "j-lock", "--force", "--format", "plain")
    assert res.returncode == 3


WORKER = """
import sys, time
from rsched.client import Rsched
rs = Rsched.from_url(sys.argv[1], sys.argv[2])
out = sys.argv[3]
for _ in range(10):
    with rs.lock("shared", ttl_ms=2000, wait=30) as token:
        with open(out, "a") as fh:
            fh.write(f"enter {token}\\n")
        time.sleep(0.005)
        with open(out, "a") as fh:
            fh.write(f"leave {token}\\n")
"""


def test_mutual_exclusion_across_processes(server: Any, rs: Rsched, tmp_path: Any) -> None:
    out = tmp_path / "trace"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, server.url, rs.namespace, str(out)], cwd=str(ROOT)
        )
        for _ in range(5)
    ]
    assert [p.wait(120) for p in procs] == [0] * 5
    events = [line.split() for line in out.read_text().splitlines()]
    assert len(events) == 100
    tokens = []
    for i in range(0, 100, 2):  # strictly enter/leave pairs: never two holders at once
        (e, t1), (leave, t2) = events[i], events[i + 1]
        assert (e, leave) == ("enter", "leave") and t1 == t2, events[i : i + 2]
        tokens.append(int(t1))
    assert tokens == sorted(tokens) and len(set(tokens)) == 50  # fencing tokens strictly increase
