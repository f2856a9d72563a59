"""Completions, the man page and the README reference are generated from the
click app (`python -m rsched.cli.gendocs`) and must be current."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rsched.cli import gendocs
from rsched.core.errors import ExitCode

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
        "GUARANTEES",
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
    assert "Type=notify" in text and "OnCalendar" in text


def _render_cmd() -> list[str] | None:
    if shutil.which("man"):
        return ["man", "-l", str(ROOT / "man" / "rsched.1")]
    if shutil.which("groff"):
        return ["groff", "-man", "-Tutf8", "-ww", str(ROOT / "man" / "rsched.1")]
    return None


def test_man_renders_without_warnings() -> None:
    cmd = _render_cmd()
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
    assert "rsched server" in plain and "EXIT STATUS" in plain
    if shutil.which("groff"):  # strict: every warning category
        res = subprocess.run(
            ["groff", "-man", "-Tutf8", "-ww", "-z", str(ROOT / "man" / "rsched.1")],
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
    assert (
        "completions/rsched.bash" in res.stderr
        and "man/rsched.1" in res.stderr
        and "README.md" in res.stderr
    )
    assert subprocess.run(gd, capture_output=True, text=True, timeout=60, cwd=ROOT).returncode == 0
    res = subprocess.run([*gd, "--check"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    readme = (tmp_path / "README.md").read_text()
    assert readme.startswith("# x\n\nintro\n\n" + gendocs.BEGIN) and readme.endswith(
        gendocs.END + "\n\ntail\n"
    )
    assert (
        "### `rsched doctor`" in readme
        and "old" not in readme.split(gendocs.BEGIN)[1].split("\n")[1]
    )


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
