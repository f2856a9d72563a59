"""`rsched web` over HTTP: a real server process, a real test Redis, every page,
endpoint, action, refusal and header."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import httpx  # noqa: E402 - the conftest skipped the module when it is missing

from rsched.api import Rsched
from rsched.queue.specs import make_spec
from tests.integration.web.conftest import Web, start_web
from tests.support import RSCHED, Cli, RedisServer, rsched_env, wait_for

PAGES = ["/", "/queues/default", "/locks", "/history", "/crons/web.job"]
HEADERS = {
    "content-security-policy": "frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


def _cron(cli: Cli, name: str = "web.job") -> subprocess.Popen[str]:
    """A real cron runner firing every second (its runs keep a log)."""
    return cli.spawn(
        "run",
        "cron",
        name,
        "--schedule",
        "* * * * * *",
        "--",
        "sh",
        "-c",
        "echo hi-$RSCHED_FENCING_TOKEN",
    )


def _dead(cli: Cli, rs: Rsched, task_id: str = "d1") -> None:
    """A task that really died: a consumer ran its failing handler once."""
    rs.add("boom", task_id, max_attempts=1)
    c = cli.spawn("run", "consumer", "--handler", "boom=false")
    q = rs.keys.queue("default")
    wait_for(
        lambda: rs.redis.zscore(q.dead, f"boom {task_id}") is not None,
        timeout=15,
        what="the task to be dead",
    )
    c.terminate()
    c.wait(timeout=15)


def _csrf(html: str) -> str:
    m = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert m, "no CSRF token in the page"
    return m.group(1)


def _headers_ok(r: httpx.Response) -> None:
    for k, v in HEADERS.items():
        assert v in r.headers.get(k, ""), (r.url, k, r.headers.get(k))
    assert "unsafe-inline" not in r.headers["content-security-policy"]


def test_pages_api_and_headers(cli: Cli, rs: Rsched) -> None:
    rs.add("mail", "m1", delay="1h", payload={"to": "a@example.com"})
    runner = _cron(cli)
    wait_for(
        lambda: any(r.get("result") == "ok" for r in cli.json("history", "web.job")),
        timeout=20,
        what="a recorded run",
    )
    runner.terminate()
    runner.wait(timeout=15)
    w = start_web(cli)
    with w.client() as c:
        for path in [*PAGES, "/healthz", "/static/console.js", "/api/queues", "/nope"]:
            r = c.get(path)
            assert r.status_code == (404 if path == "/nope" else 200), (path, r.text[:300])
            _headers_ok(r)
        home = c.get("/").text
        assert 'id="queue-default"' in home and 'id="cron-web.job"' in home
        assert "<script" not in re.sub(
            r'<script src="/static/console.js" defer></script>', "", home
        )
        # the cron page: next 10 ticks, history with lateness and duration, a kept log
        page = c.get("/crons/web.job").text
        assert page.count('<td class="mono">20') >= 10
        [run] = [r for r in cli.json("history", "web.job") if r["has_log"]][:1]
        assert f"/crons/web.job/runs/{run['token']}" in page
        log = c.get(f"/crons/web.job/runs/{run['token']}")
        assert log.status_code == 200 and f"hi-{run['token']}" in log.text
        # the queue page: the task, its page, its payload
        assert "m1" in c.get("/queues/default").text
        t = c.get("/task", params={"queue": "default", "type": "mail", "id": "m1"}).text
        assert "a@example.com" in t
        # the JSON API is exactly the CLI's --json
        assert c.get("/api/tasks").json() == cli.json("list")
        assert c.get("/api/history", params={"name": "web.job", "limit": 5}).json() == cli.json(
            "history", "web.job", "--limit", "5"
        )
        assert c.get("/api/locks").json() == cli.json("locks") == []
        api = c.get("/api/crons").json()
        ref = cli.json("crons")
        assert [sorted(x) for x in api] == [sorted(x) for x in ref]
        assert [(x["name"], x["schedule"], x["last_fire_at"]) for x in api] == [
            (x["name"], x["schedule"], x["last_fire_at"]) for x in ref
        ]
        q_api, q_cli = c.get("/api/queues").json(), cli.json("queues")
        assert [sorted(x) for x in q_api] == [sorted(x) for x in q_cli]
        assert [(x["queue"], x["scheduled"], x["next_due_at"]) for x in q_api] == [
            (x["queue"], x["scheduled"], x["next_due_at"]) for x in q_cli
        ]
        # bad input: 400 naming the field
        for params, field in (
            ({"state": "bogus"}, "--state"),
            ({"limit": "0"}, "limit"),
            ({"cursor": "not-a-cursor"}, "cursor"),
            ({"queue": "bad queue"}, "--queue"),
        ):
            r = c.get("/api/tasks", params=params)
            assert r.status_code == 400 and r.json()["error"].startswith(field), (params, r.text)
        assert c.get("/crons/nope").status_code == 404
        assert c.get("/task", params={"type": "mail", "id": "zz"}).status_code == 404


def test_events_api_and_pages_show_what_rsched_events_shows(cli: Cli, rs: Rsched) -> None:
    cli("exec", "--lock", "web.fails", "--", "sh", "-c", "echo '<b>x</b>' >&2; exit 3", check=3)
    want = cli.json("events")
    assert [(e["event"], e["name"], e["exit_code"]) for e in want] == [
        ("run.failed", "web.fails", 3)
    ]
    w = start_web(cli)
    with w.client() as c:
        assert c.get("/api/events").json() == want
        for path in ("/", "/events"):
            page = c.get(path).text
            assert "run.failed" in page and "web.fails" in page, path
            assert "<b>x</b>" not in page  # the job's stderr tail is escaped


def test_tasks_page_with_a_cursor_and_a_link_header(cli: Cli, rs: Rsched) -> None:
    rs.add_many([make_spec("a" if i % 3 else "b", f"t{i:03d}", delay="1h") for i in range(120)])
    rs.add("a", "due-now")
    w = start_web(cli)
    seen: list[str] = []
    url: str | None = "/api/tasks?limit=50"
    pages = 0
    with w.client() as c:
        while url:
            r = c.get(url)
            assert r.status_code == 200
            seen += [f"{t['type']} {t['id']}" for t in r.json()]
            m = re.fullmatch(r'<(/api/tasks\?[^>]+)>; rel="next"', r.headers.get("link", ""))
            url = m.group(1) if m else None
            pages += 1
        assert pages == 3 and len(seen) == 121 == len(set(seen))
        assert seen == [f"{t['type']} {t['id']}" for t in cli.json("list", "--limit", "1000")]
        # a type filter pages too; the HTML page links the next page
        r = c.get("/api/tasks", params={"type": "b", "state": "scheduled", "limit": 30})
        assert [t["id"] for t in r.json()] == [f"t{i:03d}" for i in range(0, 90, 3)]
        nxt = re.fullmatch(r'<(/api/tasks\?[^>]+)>; rel="next"', r.headers["link"]).group(1)
        assert [t["id"] for t in c.get(nxt).json()] == [f"t{i:03d}" for i in range(90, 120, 3)]
        html = c.get("/queues/default", params={"limit": 40}).text
        assert 'rel="next"' in html and html.count("/task?") == 40


def test_actions_with_csrf_through_the_library(cli: Cli, rs: Rsched) -> None:
    runner = _cron(cli)
    wait_for(lambda: cli.json("crons") != [], timeout=15, what="the cron to register")
    runner.terminate()
    runner.wait(timeout=15)
    _dead(cli, rs)
    rs.add("mail", "c1", delay="1h")
    lock = rs.lock("web.lock", ttl_ms=60_000, watchdog=False)
    assert lock.acquire()
    w = start_web(cli)
    with w.client() as c:
        home = c.get("/")
        token = _csrf(home.text)
        # no CSRF token, a wrong one: 403 and nothing changed
        assert c.post("/api/crons/web.job/pause").status_code == 403
        assert c.post("/api/crons/web.job/pause", headers={"X-CSRF-Token": "x"}).status_code == 403
        assert cli.json("crons")[0]["paused"] is False
        # GET never acts
        assert c.get("/api/crons/web.job/pause").status_code == 405
        h = {"X-CSRF-Token": token}
        # a form post (the page's button) redirects back
        r = c.post("/api/crons/web.job/pause", data={"csrf_token": token, "next": "/crons/web.job"})
        assert r.status_code == 303 and r.headers["location"] == "/crons/web.job"
        assert cli.json("crons")[0]["paused"] is True
        assert "pill paused" in c.get("/crons/web.job").text
        r = c.post("/api/crons/web.job/resume", headers=h)
        assert r.json() == {"name": "web.job", "paused": False, "was_paused": True}
        assert c.post("/api/crons/nope/pause", headers=h).status_code == 404
        # an open redirect is refused: back to /
        r = c.post(
            "/api/crons/web.job/resume", data={"csrf_token": token, "next": "//evil.example"}
        )
        assert r.headers["location"] == "/"
        # queues
        assert c.post("/api/queues/default/pause", headers=h).json() == {
            "queue": "default",
            "paused": True,
            "known": True,
        }
        assert cli.json("queues")[0]["paused"] is True
        assert c.post("/api/queues/default/resume", headers=h).json()["was_paused"] is True
        # one task: retry (dead) and cancel
        body = {"queue": "default", "type": "boom", "id": "d1"}
        assert c.post("/api/tasks/retry", headers=h, json=body).json() == {"retried": 1}
        assert cli.json("show", "boom", "d1")["state"] == "due"
        r = c.post("/api/tasks/cancel", headers=h, json={"type": "mail", "id": "c1"})
        assert r.json() == {
            "type": "mail",
            "id": "c1",
            "queue": "default",
            "cancelled": True,
            "was": "scheduled",
        }
        assert c.post("/api/tasks/cancel", headers=h, json={"type": "mail"}).status_code == 400
        assert c.post("/api/tasks/cancel", headers=h, content=b"[1]").status_code == 400
        # dead letters: retry all, purge
        _dead(cli, rs, "d2")  # (d1, due again, dies with it)
        n = len(cli.json("dead"))
        assert c.post("/api/queues/default/retry-dead", headers=h).json() == {"retried": n}
        _dead(cli, rs, "d3")
        n = len(cli.json("dead"))
        assert c.post("/api/queues/default/purge-dead", headers=h).json() == {"purged": n}
        assert cli.json("dead") == []
        # a lock: the wrong token 409, its token releases it
        tok = str(cli.json("locks")[0]["token"])
        r = c.post("/api/locks/web.lock/unlock", headers=h, json={"token": tok + "9"})
        assert r.status_code == 409 and "web.lock" in r.json()["error"]
        assert c.post("/api/locks/web.lock/unlock", headers=h, json={}).status_code == 400
        r = c.post("/api/locks/web.lock/unlock", headers=h, json={"token": tok})
        assert r.json() == {"name": "web.lock", "released": True, "token": int(tok)}
        assert (
            c.post("/api/locks/web.lock/unlock", headers=h, json={"token": tok}).status_code == 404
        )
        # no live runner of the cron (it was stopped): 404, as `rsched trigger` exits 3
        r = c.post("/api/crons/web.job/trigger", headers=h)
        assert r.status_code == 404 and "runner" in r.json()["error"], r.text
    # every action is in the server's log with who made it
    log = w.log()
    assert "rsched web: cron.pause name=web.job by local from 127.0.0.1: done" in log
    assert "lock.unlock name=web.lock by local from 127.0.0.1: refused" in log


def test_trigger_runs_the_cron_now_through_its_live_runner(cli: Cli, rs: Rsched) -> None:
    # a yearly cron: any run in this test is the trigger's
    runner = cli.spawn("run", "cron", "web.yearly", "--schedule", "0 0 1 1 *", "--", "true")
    try:
        wait_for(lambda: cli.json("crons") != [], timeout=15, what="the cron to register")
        w = start_web(cli)
        with w.client() as c:
            h = {"X-CSRF-Token": _csrf(c.get("/").text)}
            r = c.post("/api/crons/web.yearly/trigger", headers=h)
            assert r.status_code == 200, r.text
            assert r.json()["name"] == "web.yearly"
            runs = wait_for(
                lambda: cli.json("history", "web.yearly"), timeout=15, what="the manual run"
            )
            assert [(x["cause"], x["result"]) for x in runs] == [("manual", "ok")]
            cli("pause", "web.yearly")
            r = c.post("/api/crons/web.yearly/trigger", headers=h)
            assert r.status_code == 409 and "paused" in r.json()["error"], r.text
            # the audit trail: the run taken (with its token), the CLI's pause, the refusal
            audit = c.get("/api/audit").json()
            assert [(a["action"], a["result"], a["who"]["via"]) for a in audit] == [
                ("cron.trigger", "refused", "web"),
                ("cron.pause", "done", "cli"),
                ("cron.trigger", "done", "web"),
            ]
            assert audit[2]["target"] == {"cron": "web.yearly", "token": runs[0]["token"]}
        assert "cron.trigger name=web.yearly by local from 127.0.0.1: done" in w.log()
    finally:
        runner.terminate()
        runner.wait(timeout=15)


def test_read_only_refuses_every_action(cli: Cli, rs: Rsched) -> None:
    rs.add("mail", "r1", delay="1h")
    w = start_web(cli, "--read-only")
    with w.client() as c:
        home = c.get("/").text
        assert "csrf_token" not in home and "read-only" in home  # no buttons at all
        for path, body in (
            ("/api/queues/default/pause", None),
            ("/api/crons/x/pause", None),
            ("/api/crons/x/trigger", None),
            ("/api/tasks/cancel", {"type": "mail", "id": "r1"}),
            ("/api/tasks/retry", {"type": "mail", "id": "r1"}),
            ("/api/queues/default/purge-dead", None),
            ("/api/locks/x/unlock", {"token": "1"}),
        ):
            r = c.post(path, json=body)
            assert r.status_code == 403 and "read-only" in r.json()["error"], path
    assert cli.json("show", "mail", "r1")["state"] == "scheduled"
    assert cli.json("queues")[0]["paused"] is False


def test_token_bearer_login_session_and_csrf(cli: Cli, rs: Rsched) -> None:
    rs.add("mail", "k1", delay="1h")
    w = start_web(cli, token="tok-" + "x" * 20)
    assert w.token is not None
    with w.client() as c:
        assert c.get("/healthz").status_code == 200
        for path in ["/api/queues", "/api/tasks", "/api/crons/x/pause"]:
            r = c.get(path) if "pause" not in path else c.post(path)
            assert r.status_code == 401, path
            _headers_ok(r)
        assert c.get("/").status_code == 303 and c.get("/").headers["location"] == "/login"
        bad = {"Authorization": "Bearer nope"}
        assert c.get("/api/queues", headers=bad).status_code == 401
        assert c.get("/api/queues", headers=w.bearer()).status_code == 200
        # the bearer token is enough for an action (no CSRF needed: no cookie involved)
        r = c.post("/api/queues/default/pause", headers=w.bearer())
        assert r.status_code == 200 and r.json()["paused"] is True
        # the login form
        r = c.post("/login", data={"token": "wrong"})
        assert r.status_code == 401 and 'id="wrong"' in r.text and "set-cookie" not in r.headers
        r = c.post("/login", data={"token": w.token})
        assert r.status_code == 303
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        assert w.token not in cookie
        page = c.get("/")
        assert page.status_code == 200 and w.token not in page.text
        # a session's action needs its page's CSRF token
        assert c.post("/api/queues/default/resume").status_code == 403
        h = {"X-CSRF-Token": _csrf(page.text)}
        assert c.post("/api/queues/default/resume", headers=h).json()["was_paused"] is True
        # logging out ends the session
        assert c.post("/logout").status_code == 303
        assert c.get("/api/queues").status_code == 401
    # the token is nowhere on the command line or in the log
    cmdline = Path(f"/proc/{w.proc.pid}/cmdline").read_bytes().decode(errors="replace")
    assert w.token not in cmdline
    assert w.token not in w.log()


def test_an_open_console_answers_loopback_host_names_only(web: Web) -> None:
    with web.client() as c:
        assert c.get("/api/queues", headers={"Host": "localhost"}).status_code == 200
        r = c.get("/api/queues", headers={"Host": "evil.example:8790"})
        assert r.status_code == 421
        _headers_ok(r)


def test_the_redis_url_is_shown_without_its_password(cli: Cli) -> None:
    srv = RedisServer(password="pw-" + "q" * 12).start()
    try:
        url = f"redis://:{srv.password}@127.0.0.1:{srv.port}/0"
        w = start_web(Cli(srv, cli.namespace), env={"RSCHED_REDIS_URL": url})
        with w.client() as c:
            home = c.get("/").text
        assert f"redis://127.0.0.1:{srv.port}/0" in home and srv.password not in home
        assert srv.password not in w.log()
    finally:
        srv.stop()


def _run(cli: Cli, *args: str, env: dict[str, str] | None = None) -> Any:
    return subprocess.run(
        [*RSCHED, "web", *args],
        env=rsched_env(cli.server, cli.namespace, **(env or {})),
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_refusals_before_serving(cli: Cli, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    for args, env, code, text in (
        (["--host", "0.0.0.0"], {}, 78, "needs a token"),
        (["--host", "0.0.0.0"], {"RSCHED_WEB_TOKEN": ""}, 78, "needs a token"),
        (["--host", "0.0.0.0", "--token-file", str(tmp_path / "nope")], {}, 78, "--token-file"),
        (["--host", "0.0.0.0", "--token-file", str(empty)], {}, 78, "is empty"),
        (["--port", "0"], {}, 2, "--port"),  # click's usage error: its last line
    ):
        res = _run(cli, *args, env=env)
        assert res.returncode == code, (args, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert text in lines[-1] and (code == 2 or len(lines) == 1), res.stderr
    # the extra missing: one line naming it, exit 78
    fake = tmp_path / "noweb"
    (fake / "starlette").mkdir(parents=True)
    (fake / "starlette" / "__init__.py").write_text("raise ImportError('not installed')\n")
    res = _run(cli, env={"PYTHONPATH": str(fake)})
    assert res.returncode == 78 and "pip install 'rsched[web]'" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_payloads_are_escaped_in_the_html(cli: Cli, rs: Rsched) -> None:
    evil = "<script>alert(1)</script>"
    rs.add("x", evil, payload={"html": evil, "esc": "\x1b[31mred"})
    w = start_web(cli)
    with w.client() as c:
        for r in (
            c.get("/queues/default"),
            c.get("/task", params={"queue": "default", "type": "x", "id": evil}),
        ):
            assert evil not in r.text and "&lt;script&gt;alert(1)&lt;/script&gt;" in r.text
            assert "\x1b" not in r.text
        assert c.get("/api/tasks").json()[0]["payload"] == {"html": evil, "esc": "\x1b[31mred"}
    assert json.dumps(evil)  # the JSON API keeps the data as it is


def test_a_running_cron_shows_its_output_so_far(cli: Cli, rs: Rsched) -> None:
    cli.spawn(
        "run", "cron", "web.slow", "--schedule", "* * * * * *", "--",
        "sh", "-c", "echo started-$RSCHED_FENCING_TOKEN; sleep 30",
    )  # fmt: skip
    w = start_web(cli)
    with w.client() as c:

        def live_link() -> str | None:
            m = re.search(
                r'id="live-run" href="(/crons/web.slow/runs/(\d+))"', c.get("/crons/web.slow").text
            )
            return m.group(1) if m else None

        wait_for(live_link, timeout=20, what="the cron page to link its running run")
        url = live_link()
        assert url is not None
        tok = url.rsplit("/", 1)[1]
        wait_for(
            lambda: f"started-{tok}" in c.get(url).text,
            timeout=20,
            what="the run's output so far",
        )
        page = c.get(url).text
        assert "Running: the output so far" in page and 'data-poll="3"' in page


def test_task_pages_show_priority_and_a_running_task_s_progress(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    h = tmp_path / "h.sh"
    h.write_text('#!/bin/sh\necho "0.4 copying <b>" >&"$RSCHED_PROGRESS_FD"\nsleep 30\n')
    h.chmod(0o755)
    cli("add", "--priority", "7", "copy", "c1")
    consumer = cli.spawn("run", "consumer", "--handler", f"copy={h}", "--grace", "1s")
    try:
        wait_for(
            lambda: cli.json("show", "copy", "c1")["progress"], timeout=20, what="its progress"
        )
        w = start_web(cli)
        with w.client() as c:
            page = c.get("/task", params={"queue": "default", "type": "copy", "id": "c1"}).text
            assert "40% copying &lt;b&gt;" in page and "<b>" not in page
            assert "<dt>priority</dt><dd>7</dd>" in page
            assert 'data-poll="15"' in page  # a running task's page refreshes
            assert "40% copying" in c.get("/queues/default").text
    finally:
        consumer.terminate()
        consumer.wait(timeout=30)
