"""Completions, the man pages and the README's guarantees are generated from the
click app and rsched/cli/manual (`python -m rsched.cli.gendocs`) and must be
current; the pages render, the systemd units verify, the README stays short and
its commands and Python run; `rsched completion` / `rsched man` print the same
files after a plain install; -v/-q work after the command."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rsched.cli import gendocs
from rsched.core.errors import ExitCode
from tests.support import Cli, RedisServer

ROOT = gendocs.ROOT


@pytest.fixture(scope="module")
def tree() -> gendocs.Node:
    return gendocs.build_tree(warn=False)[0]


def test_generated_files_are_current() -> None:
    files, _ = gendocs.render_all(ROOT, warn=False)
    stale = [str(p.relative_to(ROOT)) for p in gendocs.stale(files)]
    assert not stale, f"stale generated files: {stale}; run `python -m rsched.cli.gendocs`"


def test_every_command_and_option_has_help(tree: gendocs.Node) -> None:
    missing = []
    for node in tree.walk():
        if not (node.cmd.help or "").strip():
            missing.append(node.name)
        for opt in node.options:
            if not (opt.help or "").strip():
                missing.append(f"{node.name} {opt.opts[0]}")
    assert not missing, f"no help text: {missing}"


def test_tree_has_the_contract_commands(tree: gendocs.Node) -> None:
    names = {n.name for n in tree.walk()}
    for cmd in (
        "rsched server",
        "rsched server stop",
        "rsched server status",
        "rsched doctor",
        "rsched metrics",
        "rsched run",
    ):
        assert cmd in names


def test_man_page_lists_everything(tree: gendocs.Node) -> None:
    text = gendocs.man(tree)
    for section in (
        "NAME",
        "SYNOPSIS",
        "DESCRIPTION",
        "COMMANDS",
        "LIMITS",
        "CRON EXPRESSIONS",
        "EXIT STATUS",
        "ENVIRONMENT",
        "FILES",
        "EXAMPLES",
    ):
        assert f".SH {section}" in text
    for code in ExitCode:
        assert f"\\fB{int(code)}\\fR" in text
    for var in (
        "RSCHED_REDIS_URL",
        "REDIS_URL",
        "RSCHED_NAMESPACE",
        "RSCHED_CONFIG",
        "RSCHED_REDIS_PASSWORD",
        "RSCHED_TLS_CA",
        "NO_COLOR",
        "RSCHED_QUEUE",
        "RSCHED_FENCING_TOKEN",
        "RSCHED_SHARD_INDEX",
    ):
        assert gendocs._roff(var) in text
    for node in tree.walk():
        if node is not tree:
            assert f".SS {gendocs._roff(node.name)}" in text
        for opt in node.options:
            if opt.name != "help":
                assert gendocs._roff(opt.opts[0]) in text, (node.name, opt.opts)
    assert "rsched\\-operations" in text  # where the units and guarantees are


def _render_cmd(path: Path) -> list[str] | None:
    if shutil.which("man"):
        return ["man", "-l", str(path)]
    if shutil.which("groff"):
        return ["groff", "-man", "-Tutf8", "-ww", str(path)]
    return None


@pytest.mark.parametrize(
    "filename,expect",
    [
        ("rsched.1", ("rsched server", "EXIT STATUS", "CRON EXPRESSIONS")),
        ("rsched.toml.5", ("password_file", "PARTITIONED QUEUES")),
        ("rsched-operations.7", ("GUARANTEES", "SYSTEMD", "StateDirectory=rsched")),
    ],
)
def test_man_renders_without_warnings(filename: str, expect: tuple[str, ...]) -> None:
    path = ROOT / "man" / filename
    cmd = _render_cmd(path)
    if cmd is None:
        pytest.skip("neither man nor groff is installed")
    env = {
        **os.environ,
        "MANWIDTH": "80",
        "MAN_KEEP_FORMATTING": "0",
        "MANPAGER": "cat",
        "PAGER": "cat",
    }
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stderr.strip() == "", res.stderr
    import re

    plain = re.sub(".\b", "", res.stdout)  # man's overstrike bold/underline
    for word in expect:
        assert word in plain, word
    if shutil.which("groff"):  # strict: every warning category
        res = subprocess.run(
            ["groff", "-man", "-Tutf8", "-ww", "-z", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 0 and res.stderr.strip() == "", res.stderr


def _bash_complete(words: list[str]) -> list[str]:
    script = (
        f"source {ROOT / 'completions' / 'rsched.bash'}\n"
        f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
        "_rsched; printf '%s\\n' \"${COMPREPLY[@]}\"\n"
    )
    res = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin"},
    )  # no rsched on PATH: must not need it
    assert res.returncode == 0, res.stderr
    return [w for w in res.stdout.split("\n") if w]


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_completion_sources_and_completes() -> None:
    res = subprocess.run(
        ["bash", "-c", f"source {ROOT / 'completions' / 'rsched.bash'}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0 and res.stderr == "", res.stderr
    assert _bash_complete(["rsched", "doc"]) == ["doctor"]
    assert set(_bash_complete(["rsched", "server", "st"])) == {"start", "status", "stop"}
    assert _bash_complete(["rsched", "--format", ""]) == ["table", "plain", "json"]
    assert "--daemon" in _bash_complete(["rsched", "server", "--dir", "/x", "start", "--"])
    assert "--redis-url" not in _bash_complete(["rsched", "doctor", "--"])


_ZSH_DRIVER = r"""
zmodload zsh/zpty
zpty z zsh -f -i
zpty -w z "PS1='> '; autoload -Uz compinit; compinit -u -D; source $1"
zpty -w -n z "$2"$'\t\t'
zpty -r z out "*$3*" && print -r -- COMPLETED
zpty -d z
"""


@pytest.mark.skipif(shutil.which("zsh") is None, reason="no zsh")
def test_zsh_completion_parses_and_completes() -> None:
    script = ROOT / "completions" / "_rsched"
    res = subprocess.run(["zsh", "-n", str(script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    # a real interactive zsh in a pty (zsh/zpty), completion system loaded; waits for the menu
    for line, expect in (
        ("rsched server st", "Stop the server"),
        ("rsched list --state ", "processing"),
    ):
        res = subprocess.run(
            ["zsh", "-f", "-c", _ZSH_DRIVER, "zsh", str(script), line, expect],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert "COMPLETED" in res.stdout, (line, res.stdout[-500:], res.stderr)


@pytest.mark.skipif(shutil.which("fish") is None, reason="no fish")
def test_fish_completion_completes() -> None:
    script = f"source {ROOT / 'completions' / 'rsched.fish'}; complete -C'rsched server st'"
    res = subprocess.run(
        ["fish", "--no-config", "-c", script], capture_output=True, text=True, timeout=30
    )
    assert res.returncode == 0, res.stderr
    assert {ln.split("\t")[0] for ln in res.stdout.splitlines()} == {"start", "status", "stop"}


def test_check_flag_reports_stale_files(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text(
        f"# x\n\nintro\n\n{gendocs.BEGIN}\nold\n{gendocs.END}\n\ntail\n"
    )
    gd = [sys.executable, "-m", "rsched.cli.gendocs", "--root", str(tmp_path)]
    res = subprocess.run([*gd, "--check"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert res.returncode == 1
    for name in ("completions/rsched.bash", "man/rsched.1", "man/rsched.toml.5", "README.md"):
        assert name in res.stderr, name
    assert "man/rsched-operations.7" in res.stderr
    assert subprocess.run(gd, capture_output=True, text=True, timeout=60, cwd=ROOT).returncode == 0
    res = subprocess.run([*gd, "--check"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    readme = (tmp_path / "README.md").read_text()
    assert readme.startswith("# x\n\nintro\n\n" + gendocs.BEGIN) and readme.endswith(
        gendocs.END + "\n\ntail\n"
    )
    assert "1. **No task is lost.**" in readme and "\nold\n" not in readme


def test_readme_without_markers_is_left_alone() -> None:
    assert gendocs.splice_readme("# no markers\n", "ref") is None


def test_a_command_that_fails_to_import_is_skipped() -> None:
    import click

    from rsched.cli.main import LazyGroup

    @click.group(
        cls=LazyGroup, lazy={"ok": "rsched.cli.ops_cmds:doctor", "broken": "rsched.nonexistent:cmd"}
    )
    def root() -> None:
        """Root."""

    tree, skipped = gendocs.build_tree(root, warn=False)
    assert skipped == ["rsched broken"]
    assert [n.name for n in tree.walk()] == ["rsched", "rsched ok"]
    assert "broken" not in tree.cmd.get_help(tree.ctx)


# --- the README ------------------------------------------------------------------

README = (ROOT / "README.md").read_text(encoding="utf-8")


def _blocks(text: str, lang: str) -> list[str]:
    """The fenced code blocks opened with ```LANG (fences paired in order)."""
    out, body, opened = [], [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if opened is None:
                opened, body = line[3:].strip(), []
            else:
                if opened == lang:
                    out.append("\n".join(body) + "\n")
                opened = None
        elif opened is not None:
            body.append(line)
    return out


def test_readme_is_short_and_its_guarantees_come_from_the_operations_page() -> None:
    assert len(README.splitlines()) <= 300
    assert "### `rsched" not in README  # the command reference lives in rsched(1)
    summary = gendocs.guarantees_summary()
    assert summary in README and summary.count("\n") == 8
    tour = README.index("## Tour")
    assert README.index("rsched server start") > tour  # the tour starts by getting a server
    assert README.index("rsched server start") < README.index("rsched add", tour)


def test_readme_test_command_is_the_one_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    cmd = "python -m pip install -e '.[test]' && python -m pytest"
    assert cmd in README
    assert "python -m pip install -q -e '.[test]' && python -m pytest" in ci


def _readme_commands() -> list[list[str]]:
    import shlex

    out = []
    for block in _blocks(README, "sh"):
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip()
            if line.startswith("# crontab: "):
                line = line.split("* * * * * ", 1)[1]
            for part in line.split(";"):
                words = shlex.split(part, comments=True)
                if words and words[0] == "rsched":
                    out.append(words)
    return out


def test_every_readme_command_parses(tree: gendocs.Node) -> None:
    """Each `rsched ...` line of the README names real commands and options."""
    import click

    from rsched.cli.main import cli

    cmds = _readme_commands()
    assert len(cmds) >= 15
    for words in cmds:
        ctx = cli.make_context("rsched", words[1:], resilient_parsing=False)
        args = [
            *ctx.__dict__.get("_protected_args", ctx.__dict__.get("protected_args", [])),
            *ctx.args,
        ]
        cmd: click.Command = cli
        while isinstance(cmd, click.Group) and args:
            name, sub, args = cmd.resolve_command(ctx, args)
            assert sub is not None, words
            ctx = sub.make_context(name or "", args, parent=ctx)
            cmd = sub
            args = (
                [
                    *ctx.__dict__.get("_protected_args", ctx.__dict__.get("protected_args", [])),
                    *ctx.args,
                ]
                if isinstance(sub, click.Group)
                else []
            )


def test_readme_python_runs(tmp_path: Path, server: RedisServer, namespace: str) -> None:
    """The README's Python section, against a real server, its handler run by a consumer."""
    from rsched.api import Rsched

    blocks = _blocks(README, "python")
    assert len(blocks) == 4  # the library, a handler; an App, the asyncio client
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "shop" / "tasks.py").write_text(blocks[1])
    url = f"redis://127.0.0.1:{server.port}/0"
    code = blocks[0].replace(
        'Rsched.from_url("redis://127.0.0.1:6379/0")', f"Rsched.from_url({url!r}, {namespace!r})"
    )
    assert code != blocks[0]
    exec(compile(code, "README.md", "exec"), {})
    sys.path.insert(0, str(tmp_path))
    try:
        from shop.tasks import close  # type: ignore[import-not-found]

        with Rsched.from_url(url, namespace) as rs:
            assert {t.id for t in rs.list()} == {"1001", "weekly"}
            rs.add("order.close", "1001", payload={"order": 1001}, if_exists="replace")  # due now
            stats = rs.consumer(handlers={"order.close": close}, burst=True).run()
            assert stats.ok == 1
        # Python applications: the App declares (nothing connects), the aio client adds.
        app_ns: dict[str, Any] = {}
        exec(compile(blocks[2], "README.md", "exec"), app_ns)
        assert sorted(app_ns["app"].tasks) == ["order.close"]
        assert sorted(app_ns["app"].crons) == ["report.daily"]
        aio = blocks[3].replace(
            'Rsched.from_url("redis://127.0.0.1:6379/0")',
            f"Rsched.from_url({url!r}, namespace={namespace!r})",
        )
        assert aio != blocks[3]
        body = "".join(f"    {line}\n" for line in aio.splitlines())
        exec(
            compile(f"async def main():\n{body}    await rs.close()\n", "README.md", "exec"), app_ns
        )
        asyncio.run(app_ns["main"]())
        with Rsched.from_url(url, namespace) as rs:
            assert rs.show("order.close", "1001").state == "scheduled"
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("shop.tasks", None)
        sys.modules.pop("shop", None)


# --- -v / -q after the command ---------------------------------------------------


def test_verbose_and_quiet_work_after_the_command(cli: Cli) -> None:
    said = cli("list", check=0).stderr
    assert said.strip(), "an empty listing says so on stderr"
    for args in (("-q", "list"), ("list", "-q"), ("list", "--quiet", "--json")):
        res = cli(*args, check=0)
        assert res.stderr == "", (args, res.stderr)
    res = cli("locks", "-q", check=0)
    assert res.stderr == ""
    # -v after the command: a traceback with the error, as before it
    bad = {"RSCHED_REDIS_URL": "redis://127.0.0.1:1/0"}
    for args in (("-v", "queues"), ("queues", "-v")):
        res = cli(*args, check=69, env=bad)
        assert "Traceback" in res.stderr, (args, res.stderr)
    assert "Traceback" not in cli("queues", check=69, env=bad).stderr
    assert "-q, --quiet" in cli("run", "consumer", "--help", check=0).stdout
    assert "-v, --verbose" in cli("server", "start", "--help", check=0).stdout
    # not after a command that runs the user's: ./job -q without -- stays refused
    res = cli("exec", "--lock", "x", "./job", "-q", check=2)
    assert "No such option" in res.stderr
    assert "--quiet" not in cli("run", "cron", "--help", check=0).stdout


# --- completions and pages after a plain install ---------------------------------


def _rsched(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rsched", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    "shell,filename", [("bash", "rsched.bash"), ("zsh", "_rsched"), ("fish", "rsched.fish")]
)
def test_completion_prints_the_generated_file(shell: str, filename: str) -> None:
    res = _rsched("completion", shell)
    assert res.returncode == 0, res.stderr
    assert res.stdout == (ROOT / "completions" / filename).read_text()


def test_completion_install_writes_where_the_shell_looks(tmp_path: Path) -> None:
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    for shell, where in (
        ("bash", tmp_path / "data" / "bash-completion" / "completions" / "rsched"),
        ("zsh", tmp_path / "data" / "zsh" / "site-functions" / "_rsched"),
        ("fish", tmp_path / "cfg" / "fish" / "completions" / "rsched.fish"),
    ):
        res = _rsched("completion", shell, "--install", env=env)
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == str(where) and str(where) in res.stderr
        assert where.read_text() == _rsched("completion", shell).stdout


def test_man_prints_and_installs_every_page(tmp_path: Path) -> None:
    for name, (_section, filename) in gendocs.PAGES.items():
        res = _rsched("man", name)
        assert res.returncode == 0, res.stderr
        if name != "rsched-operations":  # that one names this rsched's path in its units
            assert res.stdout == (ROOT / "man" / filename).read_text(), name
        assert _rsched("man", filename).stdout == res.stdout
    assert _rsched("man").stdout == (ROOT / "man" / "rsched.1").read_text()
    res = _rsched("man", "nope")
    assert res.returncode == 2 and "rsched-operations" in res.stderr
    res = _rsched("man", "--install", str(tmp_path))
    assert res.returncode == 0, res.stderr
    for section, filename in gendocs.PAGES.values():
        assert (tmp_path / f"man{section}" / filename).is_file()
    import json

    res = _rsched("man", "--install", str(tmp_path / "j"), "--json")
    assert [r["page"] for r in json.loads(res.stdout)] == list(gendocs.PAGES)
    out = json.loads(_rsched("man", "rsched.toml", "--json").stdout)
    assert out == {"page": "rsched.toml", "roff": (ROOT / "man" / "rsched.toml.5").read_text()}
    out = json.loads(_rsched("completion", "fish", "--json").stdout)
    assert out["shell"] == "fish" and out["script"].startswith("# fish completion")


def test_the_docs_generator_is_not_imported_at_run_time() -> None:
    code = (
        "import sys, rsched.api, rsched.cli.main, rsched.cli.docs_cmd, rsched.consumer.loop;"
        "assert 'rsched.cli.gendocs' not in sys.modules, 'gendocs imported'"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr


# --- systemd units ---------------------------------------------------------------


def _units() -> dict[str, str]:
    """The units of rsched-operations(7): each code block whose first line names one."""
    md = (gendocs.MANUAL / "rsched-operations.7.md").read_text()
    out = {}
    for block in _blocks(md, ""):
        first, _, body = block.partition("\n")
        if first.startswith("# /etc/systemd/system/"):
            out[first.rsplit("/", 1)[1]] = body
    return out


def test_units_are_correct_for_a_pip_install() -> None:
    units = _units()
    assert set(units) >= {
        "rsched-consumer.service",
        "rsched-report.service",
        "cleanup.service",
        "cleanup.timer",
        "rsched-server.service",
    }
    for name, text in units.items():
        if name.endswith(".service"):
            assert f"ExecStart={gendocs.UNIT_PATH} " in text and "/usr/bin/rsched" not in text
            assert "EnvironmentFile=" in text or "server" in name, name
            assert "password" not in text.lower(), name  # secrets come from files
        if "Type=notify" in text:
            assert "TimeoutStopSec=" in text and "KillSignal=SIGTERM" in text, name
    assert "StateDirectory=rsched" in units["rsched-server.service"]
    assert "--dir /var/lib/rsched" in units["rsched-server.service"]
    consumer = units["rsched-consumer.service"]
    import re

    grace = int(re.search(r"--grace (\d+)s", consumer).group(1))  # type: ignore[union-attr]
    stop = int(re.search(r"TimeoutStopSec=(\d+)", consumer).group(1))  # type: ignore[union-attr]
    assert stop > grace


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_units_verify_with_systemd_analyze(tmp_path: Path) -> None:
    exe = str(Path(sys.executable).parent / "rsched")  # this environment's (a venv's) rsched
    if not Path(exe).is_file():
        pytest.skip("no rsched executable to point ExecStart at")
    names = []
    for name, text in _units().items():
        text = text.replace(gendocs.UNIT_PATH, exe).replace("/opt/report/run", "/bin/true")
        text = text.replace("/opt/cleanup", "/bin/true")
        (tmp_path / name).write_text(text)
        names.append(str(tmp_path / name))
    res = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *names],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert res.returncode == 0 and not res.stderr.strip(), res.stderr
    # rsched man rsched-operations names the real rsched in its units
    page = subprocess.run(
        [exe, "man", "rsched-operations"], capture_output=True, text=True, timeout=60
    ).stdout
    assert "ExecStart=" + str(Path(exe).resolve().parent / "rsched").replace("-", "\\-") in page


def test_the_config_page_documents_every_key_the_loader_accepts() -> None:
    """rsched.toml(5) names each key the loader knows (its sets are the source), no other."""
    import re

    from rsched.core import config
    from rsched.cron import spec as cron_spec

    md = (gendocs.MANUAL / "rsched.toml.5.md").read_text()

    def documented(section: str) -> set[str]:
        body = md.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
        return {
            k for line in re.findall(r"^- (.+?):", body, re.M) for k in re.findall(r"`(\w+)`", line)
        }

    assert documented("[redis]") == config.REDIS_KEYS
    assert documented("[queues.NAME]") == config.QUEUE_KEYS
    assert documented("[cron.NAME]") == cron_spec.CONFIG_KEYS
    for table in config.TOP_KEYS:
        assert f"## [{table}" in md or f"## [[{table}]]" in md, table


#: What each README command exits with on a fresh namespace, in the README's order
#: (retry: the task is not dead; unlock: exec released the lock already; check:
#: the tour's crons have no runner left).
_TOUR_EXIT = {"doctor": (0, 1), "retry": (4,), "unlock": (3,), "check": (0, 1)}


def test_readme_tour_runs(cli: Cli, tmp_path: Path) -> None:
    """Every command of the README's tour, as written, against a real server; the
    loops with --burst (consumer) or until their first tick ran (cron)."""
    import json

    from tests.support import wait_for

    for name in ("close-order", "job", "backup.sh"):
        script = tmp_path / name
        script.write_text("#!/bin/sh\nexit 0\n")
        script.chmod(0o755)
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "shop" / "tasks.py").write_text(_blocks(README, "python")[1])
    (tmp_path / "shop" / "app.py").write_text(_blocks(README, "python")[2])
    ran = []
    for words in _readme_commands():
        args = words[1:]
        if args[:2] == ["server", "start"]:
            continue  # the test's own server stands in for it
        if args[:2] == ["run", "worker"]:
            p = cli.spawn(*args, env={"PYTHONPATH": str(tmp_path)})
            wait_for(
                lambda: any(c["runners"] for c in cli.json("crons") if c["name"] == "report.daily"),
                timeout=20,
                what="the worker's cron runner registered",
            )
            p.terminate()
            assert p.wait(timeout=30) == 0
        elif args[:2] == ["run", "cron"] and "--once" in args:
            cli(*args, timeout=60)  # one run, then it exits by itself with the job's status
        elif args[:2] == ["run", "cron"]:
            p = cli.spawn(*args)
            wait_for(
                lambda cron=args[2]: json.loads(cli("history", cron, "--json", check=0).stdout),
                timeout=20,
                what="the cron's first tick",
            )
            p.terminate()
            assert p.wait(timeout=30) == 0
        else:
            if args[:2] == ["run", "consumer"]:
                args = [*args, "--burst"]
            res = cli(*args, env={"PYTHONPATH": str(tmp_path)})
            assert res.returncode in _TOUR_EXIT.get(args[0], (0,)), (words, res.stderr)
        ran.append(args[0])
    assert len(ran) >= 17
