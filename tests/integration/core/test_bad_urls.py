"""A malformed Redis URL is a configuration error (exit 78) from every command:
one line naming the part that is wrong and the accepted form, never a crash,
never a part of the user or password, nothing connected to or written."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support import RSCHED, Cli, RedisServer

SECRET = "pa5s"  # every URL below that has a password uses this one

# (URL, what the message must name)
BAD = [
    ("redis://localhost:notaport/0", "the port 'notaport'"),
    ("redis://localhost:99999/0", "the port '99999'"),
    ("redis://localhost:0/0", "the port '0'"),
    ("redis://localhost:\u0663/0", "the port"),  # a non-ASCII digit
    ("redis://[::1/0", "IPv6"),
    ("redis://[::zz]:6379/0", "IPv6"),
    ("redis://localhost/abc", "the database 'abc'"),
    ("redis://localhost/\u0663", "the database"),
    ("unix://", "socket's path"),
    (f"redis://u:{SECRET}/x@localhost:6379/0", "unencoded '/', '?' or '#'"),
    (f"redis://:{SECRET}#x@localhost/0", "unencoded '/', '?' or '#'"),
    (f"redis://:{SECRET}?x@localhost:1/0", "unencoded '/', '?' or '#'"),
    (f"rediss://u:{SECRET}/x@localhost/0", "unencoded '/', '?' or '#'"),
    (f"redis+sentinel://:{SECRET}/x@h:1/svc", "unencoded '/', '?' or '#'"),
    ("redis+sentinel://[::1:26379/m", "IPv6"),
    (f"foo://u:{SECRET}/x@h", "the scheme 'foo'"),
    ("redis+cluster://localhost:7000/3", "database 0 only"),
]

# Every command that reaches Redis (with the arguments it needs to get that far).
COMMANDS = [
    ["add", "t.x", "1"],
    ["add", "--from", "-"],
    ["cancel", "t.x", "1"],
    ["list"],
    ["show", "t.x", "1"],
    ["queues"],
    ["locks"],
    ["unlock", "l1", "--force"],
    ["requeue-stale"],
    ["dead"],
    ["retry", "--all"],
    ["purge", "--dead"],
    ["exec", "--lock", "l1", "--", "true"],
    ["run", "consumer", "--handler", "t.x=true", "--burst"],
    ["run", "cron", "c1", "--schedule", "* * * * *", "--", "true"],
    ["run", "expired", "--pattern", "k:*", "--handler", "true"],
    ["crons"],
    ["pause", "c1"],
    ["resume", "c1"],
    ["history"],
    ["metrics"],
    ["doctor"],
    ["top", "--once"],
]


def run(url: str, args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RSCHED_", "REDIS_URL"))}
    env.update(RSCHED_REDIS_URL=url, NO_COLOR="1", XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    return subprocess.run(
        [*RSCHED, *args],
        input='{"type": "t.x", "id": "1"}\n',
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=str(tmp_path),
    )


def check(res: subprocess.CompletedProcess[str], what: str, args: list[str]) -> None:
    out = res.stdout + res.stderr
    assert res.returncode == 78, (args, res.returncode, out)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, (args, res.stderr)
    assert lines[0].startswith("rsched: error: ") and what in lines[0], (args, lines)
    assert "internal error" not in out and "run with -v" not in out, (args, out)
    assert SECRET not in out, (args, out)
    assert "Traceback" not in out


@pytest.mark.parametrize("url,what", BAD, ids=[u for u, _ in BAD])
def test_each_bad_url_exits_78_naming_the_part(url: str, what: str, tmp_path: Path) -> None:
    for args in (["add", "t.x", "1"], ["list"], ["exec", "--lock", "l1", "--", "true"]):
        check(run(url, args, tmp_path), what, args)


@pytest.mark.parametrize("args", COMMANDS, ids=[" ".join(a[:2]) for a in COMMANDS])
def test_every_command_refuses_a_bad_url_the_same_way(args: list[str], tmp_path: Path) -> None:
    for url, what in (BAD[0], BAD[4], BAD[9]):
        check(run(url, args, tmp_path), what, args)


def test_a_database_the_server_lacks_is_a_configuration_error(
    server: RedisServer, cli: Cli, tmp_path: Path
) -> None:
    """``/99`` parses, but the server has 16 databases: the answer to SELECT (redis-py)
    or HELLO (the lean client of `add`) is exit 78 too, with the same line."""
    url = f"redis://127.0.0.1:{server.port}/99"
    for args in (["add", "t.x", "1"], ["add", "--from", "-"], ["list"], ["pause", "c1"]):
        check(run(url, args, tmp_path), "the database number is out of range", args)
    # and -v adds the traceback, not the hint to run with -v
    res = run(url, ["-v", "list"], tmp_path)
    assert res.returncode == 78 and "run with -v" not in res.stderr


def test_good_forms_still_connect(server: RedisServer, cli: Cli) -> None:
    """An IPv6 literal, a percent-encoded password character and a database
    number all pass the check (the server is reached, or refuses the login)."""
    res = cli("list", env={"RSCHED_REDIS_URL": f"redis://127.0.0.1:{server.port}/3"})
    assert res.returncode == 0, res.stderr
    res = cli("list", env={"RSCHED_REDIS_URL": f"redis://:{SECRET}%2Fx@127.0.0.1:{server.port}/0"})
    assert res.returncode in (0, 69), res.stderr  # no password set: accepted or refused
    assert SECRET not in res.stderr


@pytest.mark.parametrize("url,what", BAD[:13], ids=[u for u, _ in BAD[:13]])
def test_the_library_refuses_it_the_same_way(url: str, what: str) -> None:
    """``Rsched.from_url`` (no CLI in between) raises ConfigError, secret-free."""
    from rsched.api import Rsched
    from rsched.core.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        Rsched.from_url(url)
    assert what in str(info.value) and SECRET not in str(info.value)
