"""rsched's secrets stay with rsched: what a handler or job inherits."""

from __future__ import annotations

from pathlib import Path

from rsched.core.config import redact_url, strip_password
from tests.support import Cli, RedisServer


def test_strip_password() -> None:
    assert strip_password("redis://:pw@h:1/0") == "redis://h:1/0"
    assert strip_password("redis://u:pw@h/2") == "redis://u@h/2"
    assert strip_password("rediss://u@h") == "rediss://u@h"
    assert strip_password("unix:///tmp/x.sock?password=zz&db=2") == "unix:///tmp/x.sock?db=2"
    assert strip_password("unix:///tmp/x.sock") == "unix:///tmp/x.sock"
    assert strip_password("redis+sentinel://:p@a:1,b:2/svc") == "redis+sentinel://a:1,b:2/svc"


def test_redact_url_hides_every_form_of_the_password() -> None:
    assert redact_url("redis://u:pw@h/2") == "redis://u:***@h/2"
    # redis-py also takes the password in the query string: it was printed as is
    assert (
        redact_url("unix:///tmp/x.sock?password=zz&db=2") == "unix:///tmp/x.sock?password=***&db=2"
    )
    assert redact_url("redis://h:1/0") == "redis://h:1/0"


def test_the_query_password_never_reaches_an_error(tmp_path: Path) -> None:
    s = RedisServer(unix=True, password="qs-secret").start()
    try:
        cli = Cli(s, "pwq", cwd=str(tmp_path))
        r = cli("--redis-url", f"unix://{s.unix}?password=wrong-qs-secret", "list",
                env={"RSCHED_REDIS_PASSWORD": ""}, check=69)  # fmt: skip
        assert "wrong-qs-secret" not in r.stderr + r.stdout and "password=***" in r.stderr
    finally:
        s.stop()


def test_handlers_get_no_redis_password(tmp_path: Path) -> None:
    """rsched's secrets stay with rsched: RSCHED_REDIS_PASSWORD and
    RSCHED_SENTINEL_PASSWORD are not in a handler's environment, and the password
    inside RSCHED_REDIS_URL is taken out (the address stays)."""
    s = RedisServer(password="hunter2-secret").start()
    try:
        cli = Cli(s, "pwenv", cwd=str(tmp_path))
        dump = tmp_path / "env.txt"
        h = tmp_path / "h.sh"
        h.write_text(f"#!/bin/sh\nenv > {dump}\n")
        h.chmod(0o755)
        url = f"redis://:hunter2-secret@127.0.0.1:{s.port}/0"
        env = {"RSCHED_REDIS_URL": url, "RSCHED_SENTINEL_PASSWORD": "hunter3-secret"}
        cli("add", "p.t", "1", env=env, check=0)
        cli("run", "consumer", "--burst", "--handler", f"p.t={h}", env=env, check=0)
        seen = dump.read_text()
        assert "hunter2-secret" not in seen and "hunter3-secret" not in seen, seen
        assert f"RSCHED_REDIS_URL=redis://127.0.0.1:{s.port}/0" in seen
    finally:
        s.stop()
