"""The least-privilege ACL user runs everything rsched does and is refused the rest.

Shared harness: tests/faults/harness.py."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import redis

from rsched.tools.doctor import ACL_COMMANDS
from tests.faults.harness import (
    ACL_SETUSER,
    EXEC_HANDLER,
    Procs,
    cron_fires,
    figure,
    jsonl,
    runs,
    script,
    stop,
)
from tests.integration.events.sinks import appender
from tests.integration.events.sinks import lines as sink_lines
from tests.support import Cli, RedisServer, wait_for

# --- 7. ACL user


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
        wait_for(lambda: len(cron_fires(fires)) >= 2, timeout=20, what="cron fires")
        cli("crons", check=0)
        cli("history", "acl", check=0)
        cli("trigger", "acl", "--wait", check=0)  # a run request, claimed by the runner
        cli("logs", "acl", check=0)
        assert stop(runner) == 0
        # events and an alert sink (consumer groups on the events streams)
        sink_out = tmp_path / "events.jsonl"
        cli("exec", "--lock", "acl-fail", "--alert-command", appender(sink_out), "--", "false",
            check=1)  # fmt: skip
        assert [e["event"] for e in sink_lines(sink_out)] == ["run.failed"]
        cli("events", check=0)
        cli("check", check=None)
        # priorities, a rate limit, progress
        cli("add", "--priority", "5", "t.acl", "p1", check=0)
        cli("run", "consumer", "--handler", f"t.acl={h}", "--burst", "--rate-limit", "100/1s",
            env=env, check=0)  # fmt: skip
        assert "p1" in {x.id for x in runs(log)}
        cli("history", "--actions", check=0)
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
