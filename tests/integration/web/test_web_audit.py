"""The audit trail of operator actions: the web console and the CLI each record
one entry per action (who, when, done or refused), shown by `rsched history
--actions`, `/api/audit` and the History page."""

from __future__ import annotations

import getpass
import socket

from rsched.api import Rsched
from tests.integration.web.conftest import start_web
from tests.support import Cli

FIELDS = {"id", "at", "at_ms", "action", "target", "who", "result", "reason"}


def test_web_and_cli_actions_are_recorded_once_with_who(cli: Cli, rs: Rsched) -> None:
    token = "tok-" + "a" * 24
    rs.add("mail", "m1", queue="mail", delay="1h")
    w = start_web(cli, token=token)
    before = rs.now_ms()
    with w.client() as c:
        r = c.post("/api/queues/mail/pause", headers=w.bearer())
        assert r.status_code == 200
        # a refused action is recorded too, with its reason
        r = c.post("/api/locks/nolock/unlock", headers=w.bearer(), json={"token": "7"})
        assert r.status_code == 404
    cli("resume", "--queue", "mail")
    rows = cli.json("history", "--actions")
    assert [r["action"] for r in rows] == ["queue.resume", "lock.unlock", "queue.pause"]
    assert all(set(r) == FIELDS for r in rows)
    resume, unlock, pause = rows
    assert pause["target"] == {"queue": "mail"} and pause["result"] == "done"
    assert pause["who"] == {"via": "web", "user": "bearer", "addr": "127.0.0.1"}
    assert pause["reason"] is None and pause["at_ms"] >= before - 1000
    assert pause["at"].endswith("Z")
    assert unlock["result"] == "refused" and "nolock" in unlock["reason"]
    assert unlock["target"]["lock"] == "nolock"
    assert resume["who"] == {"via": "cli", "user": getpass.getuser(), "addr": socket.gethostname()}
    assert resume["result"] == "done" and resume["target"] == {"queue": "mail"}
    # the web shows the same records; no token anywhere in them
    with w.client() as c:
        api = c.get("/api/audit", headers=w.bearer()).json()
        page = c.get("/history", headers=w.bearer()).text
    assert api == rows
    assert 'id="audit"' in page and "queue.pause" in page and "lock.unlock" in page
    assert token not in str(api) and token not in page
    # --limit, and the table form
    assert [r["action"] for r in cli.json("history", "--actions", "--limit", "1")] == [
        "queue.resume"
    ]
    out = cli("history", "--actions").stdout
    assert "queue.pause" in out and "refused" in out


def test_history_actions_refuses_a_filter(cli: Cli) -> None:
    res = cli("history", "--actions", "--queue", "q", check=2)
    assert "--actions" in res.stderr
