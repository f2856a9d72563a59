"""Bad input is refused where it is given, before anything connects (SPEC §1.6):
exit 2, one line naming the option, with Redis down as with Redis up, and
nothing written. Numbers are ASCII digits only (``int('١')`` is 1 in Python;
``'٣s'`` and ``'５m'`` were accepted as durations), a zone is checked even when
nothing uses it, and an empty ``--once-per`` is not "no --once-per"."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support import RSCHED, Cli, RedisServer, free_port

# (argv, the option the message must name)
CASES = [
    (["add", "--in", "\u0663s", "t.x", "1"], "--in"),  # ARABIC-INDIC DIGIT THREE
    (["add", "--in", "\uff15m", "t.x", "1"], "--in"),  # FULLWIDTH DIGIT FIVE
    (["add", "--tz", "Mars/Olympus", "t.x", "1"], "--tz"),  # no --at uses it
    (["add", "--max-attempts", "\u0663", "t.x", "1"], "--max-attempts"),
    (["exec", "--lock", "x", "--once-per", "", "--", "true"], "--once-per"),
    (["exec", "--lock", "x", "--once-per", "  ", "--", "true"], "--once-per"),
    (["exec", "--lock", "bad name", "--", "true"], "--lock"),
    (["exec", "--lock", "x", "--tz", "Mars/Olympus", "--", "true"], "--tz"),
    (["exec", "--lock", "x", "--ttl", "\u0663s", "--", "true"], "--ttl"),
    (["exec", "--lock", "x", "--once-per", "61 * * * *", "--", "true"], "--once-per"),
    (["exec", "--lock", "x", "--once-per", "every", "--", "true"], "--once-per"),
    (["exec", "--lock", "x", "--once-per", "1h", "--tz", "Asia/Tokyo", "--", "true"], "--tz"),
    (
        ["exec", "--lock", "x", "--once-per", "0 0 12 ? * 2-6", "--dialect", "cron", "--", "true"],
        "--once-per",
    ),  # fmt: skip
    (["unlock", "x", "--token", "\u0661"], "--token"),
    (["unlock", "x", "--token", "abc"], "--token"),
    (["unlock", "bad name", "--force"], "NAME"),
    (["pause", "bad name"], "NAME"),
    (["resume", "bad name"], "NAME"),
    (["pause", "--queue", "bad q"], "--queue"),
    (["resume", "--queue", "bad q"], "--queue"),
    (["history", "bad name"], "NAME"),
    (["history", "--queue", "bad q"], "--queue"),
    (["history", "--limit", "\u0661"], "--limit"),
    (["dead", "--queue", "bad q"], "--queue"),
    (["list", "--limit", "\u0661"], "--limit"),
    (["run", "consumer", "--handler", "t=true", "--concurrency", "\u0663"], "--concurrency"),
    (
        ["run", "cron", "n", "--schedule", "* * * * *", "--shards", "\u0663", "--", "true"],
        "--shards",
    ),  # fmt: skip
    (["run", "cron", "n", "--schedule", "* * * * *", "--tz", "Mars/X", "--", "true"], "--tz"),
    (["purge", "--dead", "--older-than", "\u0663d"], "--older-than"),
]


def _run(args: list[str], url: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RSCHED_", "REDIS_URL"))}
    env.update(RSCHED_REDIS_URL=url, NO_COLOR="1", XDG_CONFIG_HOME=str(cwd / "xdg"))
    return subprocess.run(
        [*RSCHED, *args], capture_output=True, text=True, timeout=60, env=env, cwd=str(cwd)
    )


@pytest.mark.parametrize("args,field", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_refused_before_connecting(args: list[str], field: str, tmp_path: Path) -> None:
    """Redis is down (nothing listens on the port): a check made after connecting
    would exit 69; the right answer is 2 naming the option."""
    res = _run(args, f"redis://127.0.0.1:{free_port()}/0", tmp_path)
    assert res.returncode == 2, (args, res.returncode, res.stderr)
    assert field in res.stderr, (args, res.stderr)
    assert "Redis" not in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_nothing_is_written(server: RedisServer, cli: Cli) -> None:
    with server.client() as c:
        before = sorted(c.scan_iter(f"{cli.namespace}:*"))
        for args, _ in CASES:
            assert cli(*args, check=None).returncode == 2, args
        assert sorted(c.scan_iter(f"{cli.namespace}:*")) == before


def test_ascii_forms_still_work(cli: Cli) -> None:
    assert cli.json("add", "--in", "3s", "t.x", "1")["state"] == "scheduled"
    assert cli("history", "--limit", "5").returncode == 0
    assert cli("exec", "--lock", "x", "--tz", "Asia/Kathmandu", "--", "true").returncode == 0
    res = cli("unlock", "x", "--token", "12", check=None)
    assert res.returncode == 3  # the token is well formed; no such lock
