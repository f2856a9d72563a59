"""rsched's secrets stay with rsched: what a handler or job inherits."""

from __future__ import annotations

from pathlib import Path

from rsched.config import strip_password
from tests.support import Cli, RedisServer


def test_strip_password() -> None:
    assert strip_password("redis://:pw@h:1/0") == "redis://h:1/0"
    assert strip_password("redis://u:pw@h/2") == "redis://u@h/2"
    assert strip_password("rediss://u@h") == "rediss://u@h"
    assert strip_password("unix:///tmp/x.sock?password=zz&db=2") == "unix:///tmp/x.sock?db=2"
    assert strip_password("unix:///tmp/x.sock") == "unix:///tmp/x.sock"
    assert strip_password("redis+sentinel://:p@a:1,b:2/svc") == "redis+sentinel://a:1,b:2/svc"


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
