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
    assert unlock["target"] == {"lock": "nolock", "token": "7"}
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


def test_failed_logins_and_bearer_tokens_are_rate_limited(cli: Cli) -> None:
    token = "tok-" + "b" * 24
    w = start_web(cli, "--secure-cookie", token=token)
    bad = {"Authorization": "Bearer wrong"}
    with w.client() as c:
        for _ in range(5):
            assert c.post("/login", data={"token": "nope"}).status_code == 401
        for _ in range(5):
            assert c.get("/api/queues", headers=bad).status_code == 401
        # the 11th try from this address, right or wrong, login or bearer: 429
        for r in (
            c.get("/api/queues", headers=bad),
            c.get("/api/queues", headers=w.bearer()),
            c.post("/api/queues/q/pause", headers=w.bearer()),
            c.post("/login", data={"token": token}),
        ):
            assert r.status_code == 429, r.url
            assert 1 <= int(r.headers["retry-after"]) <= 60
            assert "set-cookie" not in r.headers
    assert "too many failures" in w.log()


def test_secure_cookie_and_a_good_login_is_not_counted(cli: Cli) -> None:
    token = "tok-" + "c" * 24
    w = start_web(cli, "--secure-cookie", token=token)
    with w.client() as c:
        for _ in range(15):  # right tokens never count
            assert c.get("/api/queues", headers=w.bearer()).status_code == 200
        r = c.post("/login", data={"token": token})
        assert r.status_code == 303
        cookie = r.headers["set-cookie"]
        assert "; secure" in cookie.lower() and "httponly" in cookie.lower()
    plain = start_web(cli, token=token)
    with plain.client() as c:
        r = c.post("/login", data={"token": token})
        assert r.status_code == 303 and "secure" not in r.headers["set-cookie"].lower()


def test_every_cli_action_is_recorded(cli: Cli, rs: Rsched) -> None:
    rs.add("mail", "c1", delay="1h")
    cli("cancel", "mail", "c1")
    cli("retry", "--all")
    cli("purge", "--dead", "--older-than", "1h")
    cli("trigger", "no.runner", check=3)
    cli("pause", "job.x", "--create")
    cli("unlock", "nolock", "--token", "5", check=3)
    cli("retry", "mail", "nope", check=3)  # no such dead task
    cli("pause", "--queue", "bad name!", check=2)  # bad input: refused before connecting
    rows = cli.json("history", "--actions")
    got = [(r["action"], r["result"]) for r in reversed(rows)]
    assert got == [
        ("task.cancel", "done"),
        ("dead.retry", "done"),
        ("dead.purge", "done"),
        ("cron.trigger", "refused"),
        ("cron.pause", "done"),
        ("lock.unlock", "refused"),
        ("task.retry", "refused"),
    ]
    by = {r["action"]: r for r in rows}
    assert by["task.cancel"]["target"] == {
        "queue": "default",
        "type": "mail",
        "id": "c1",
        "was": "scheduled",
    }
    assert by["dead.retry"]["target"] == {"queue": None, "count": 0}
    assert by["dead.purge"]["target"] == {"queue": None, "older_than_ms": 3_600_000, "count": 0}
    assert by["task.retry"]["target"] == {"queue": "default", "type": "mail", "id": "nope"}
    assert "no.runner" in by["cron.trigger"]["reason"]
    assert all(r["who"]["via"] == "cli" for r in rows)
