"""`rsched history`: execution records of cron fires, exec runs and task runs."""

from __future__ import annotations

import json
from typing import Any

from rsched.api import Rsched
from rsched.tools import history
from tests.support import Cli

FIELDS = {
    "kind",
    "name",
    "queue",
    "type",
    "id",
    "fire_at",
    "started_at",
    "finished_at",
    "duration_ms",
    "result",
    "exit_code",
    "host",
    "attempt",
    "token",
}


def add(rs: Rsched, key: str, **rec: Any) -> None:
    """Append like the scripts do; the entry ID is the finish time (server clock)."""
    rec.setdefault("host", "h1")
    rs.redis.xadd(
        key,
        {"j": json.dumps(rec)},
        id=f"{rec['finished_ms']}-0",
        maxlen=rs.history_maxlen,
        approximate=True,
    )


def seed(rs: Rsched) -> None:
    rs.redis.sadd(rs.keys.crons, "nightly")
    rs.redis.sadd(rs.keys.locks, "backup")
    rs.redis.sadd(rs.keys.queues, "emails")
    add(
        rs,
        rs.keys.cron("nightly").history,
        kind="cron",
        name="nightly",
        fire_ms=1000,
        started_ms=1001,
        finished_ms=1500,
        duration_ms=499,
        result="ok",
        exit_code=0,
        attempt=1,
        token=1,
    )
    add(
        rs,
        rs.keys.lock("backup").history,
        kind="exec",
        name="backup",
        fire_ms=2000,
        started_ms=2001,
        finished_ms=2100,
        duration_ms=99,
        result="failed",
        exit_code=3,
        attempt=1,
        token=7,
        error="disk full",
    )
    add(
        rs,
        rs.keys.queue("emails").history,
        kind="task",
        queue="emails",
        type="mail.send",
        id="42",
        fire_ms=3000,
        started_ms=3002,
        finished_ms=3010,
        duration_ms=8,
        result="timeout",
        exit_code=137,
        attempt=2,
        token="5",
    )
    add(
        rs,
        rs.keys.cron("nightly").history,
        kind="cron",
        name="nightly",
        fire_ms=4000,
        started_ms=4000,
        finished_ms=4000,
        duration_ms=0,
        result="skipped",
        error="paused",
    )


def test_merge_all_newest_first(cli: Cli, rs: Rsched) -> None:
    seed(rs)
    rows = cli.json("history")
    assert [r["kind"] for r in rows] == ["cron", "task", "exec", "cron"]
    assert all(FIELDS <= set(r) for r in rows)
    task = rows[1]
    assert task["queue"] == "emails" and task["type"] == "mail.send" and task["id"] == "42"
    assert task["fire_at"] == "1970-01-01T00:00:03.000Z" and task["fire_ms"] == 3000
    assert task["started_at"] == "1970-01-01T00:00:03.002Z" and task["finished_ms"] == 3010
    assert [r["result"] for r in cli.json("history", "--failed")] == ["timeout", "failed"]
    assert len(cli.json("history", "--limit", "2")) == 2
    table = cli("history", check=0).stdout
    assert "mail.send" in table and "disk full" in table


def test_by_name_and_queue(cli: Cli, rs: Rsched) -> None:
    seed(rs)
    assert [r["result"] for r in cli.json("history", "nightly")] == ["skipped", "ok"]
    assert [r["name"] for r in cli.json("history", "backup")] == ["backup"]
    assert [r["id"] for r in cli.json("history", "--queue", "emails")] == ["42"]
    assert cli.json("history", "nobody") == []
    assert cli("history", "bad name!").returncode == 2
    assert cli("history", "nightly", "--queue", "emails").returncode == 2
    assert cli("history", "--limit", "0").returncode == 2


def test_paging_and_failed_filter_over_long_streams(rs: Rsched) -> None:
    key = rs.keys.cron("busy").history
    rs.redis.sadd(rs.keys.crons, "busy")
    pipe = rs.redis.pipeline()
    for i in range(1000):
        result = "failed" if i % 100 == 0 else "ok"
        pipe.xadd(
            key, {"j": json.dumps({"kind": "cron", "name": "busy", "fire_ms": i, "result": result})}
        )
    pipe.execute()
    recs = history.read(rs, "busy", limit=600)
    assert [r.get("fire_ms") for r in recs] == list(range(999, 399, -1))
    failed = history.read(rs, failed=True, limit=100)
    assert [r.get("fire_ms") for r in failed] == list(range(900, -1, -100))


def test_unreadable_record_does_not_break_listing(rs: Rsched) -> None:
    rs.redis.sadd(rs.keys.crons, "odd")
    rs.redis.xadd(rs.keys.cron("odd").history, {"j": "not json"})
    rs.redis.xadd(rs.keys.cron("odd").history, {"x": "1"})
    recs = history.read(rs, "odd")
    assert len(recs) == 2 and recs[1].to_json()["error"] == "unreadable record"
