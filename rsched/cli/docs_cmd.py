"""`rsched completion SHELL` and `rsched man [PAGE]`: the shell completions and
the man pages after a plain ``pip install``, with no checkout.

Both are generated at run time from the installed click app and the long-form
text in ``rsched/cli/manual/*.md`` (package data) by :mod:`rsched.cli.gendocs`,
the same functions that write ``completions/`` and ``man/`` in the repository,
so what they print is what the checked files hold for this version (a test
compares them). Generating rather than shipping copies keeps one source; the
cost (importing every command, ~0.3 s) is paid only by these two commands:
gendocs is imported here, inside the functions, and nowhere else at run time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import click

from rsched.cli.main import App, output_options, pass_app
from rsched.cli.render import emit_json

SHELLS = ("bash", "zsh", "fish")


def _home(env: str, default: str) -> Path:
    return Path(os.environ.get(env) or Path.home() / default)


def _completion_target(shell: str) -> Path:
    """Where each shell looks for a user's completions without configuration
    (zsh: a directory the user adds to $fpath once)."""
    data = _home("XDG_DATA_HOME", ".local/share")
    if shell == "bash":  # bash-completion >= 2.9 loads these on demand
        return data / "bash-completion" / "completions" / "rsched"
    if shell == "zsh":
        return data / "zsh" / "site-functions" / "_rsched"
    return _home("XDG_CONFIG_HOME", ".config") / "fish" / "completions" / "rsched.fish"


def completion_script(shell: str) -> str:
    from rsched.cli import gendocs

    tree = gendocs.build_tree(warn=False)[0]
    return {"bash": gendocs.bash, "zsh": gendocs.zsh, "fish": gendocs.fish}[shell](tree)


@click.command("completion")
@click.argument("shell", type=click.Choice(SHELLS))
@click.option(
    "--install",
    is_flag=True,
    help="Write the script where SHELL looks for completions (bash: "
    "$XDG_DATA_HOME/bash-completion/completions/rsched; zsh: "
    "$XDG_DATA_HOME/zsh/site-functions/_rsched, a directory to add to $fpath; fish: "
    "$XDG_CONFIG_HOME/fish/completions/rsched.fish) and say where, instead of printing it.",
)
@output_options
@pass_app
def completion(app: App, shell: str, install: bool) -> None:
    """Print the shell completion script for SHELL (bash, zsh or fish).

    \b
    Load it for this shell:   source <(rsched completion bash)
    Install it for the user:  rsched completion bash --install

    --json prints {"shell", "script"}, or with --install {"shell", "path"}.
    """
    text = completion_script(shell)
    if not install:
        if app.json:
            emit_json({"shell": shell, "script": text})
        else:
            click.echo(text, nl=False)
        return
    target = _completion_target(shell)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    if app.json:
        emit_json({"shell": shell, "path": str(target)})
    else:
        click.echo(str(target))
    if shell == "zsh":
        app.info(
            f"rsched: wrote {target}; add `fpath=({target.parent} $fpath)` before compinit in ~/.zshrc"
        )
    else:
        app.info(f"rsched: wrote {target}; new {shell} sessions complete rsched")


def _page_name(text: str) -> str:
    from rsched.cli import gendocs

    for name, (section, filename) in gendocs.PAGES.items():
        if text in (name, filename, f"{name}({section})"):
            return name
    known = ", ".join(gendocs.PAGES)
    raise click.BadParameter(
        f"{text!r} is not a page of rsched's (known: {known})", param_hint="PAGE"
    )


def man_page(name: str) -> str:
    """Page ``name`` as roff, its systemd units naming this rsched's real path."""
    from rsched.cli import gendocs

    text = gendocs.page(name)
    exe = shutil.which(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if exe and Path(exe).name == "rsched":
        real = str(Path(exe).resolve().parent / "rsched").replace("-", "\\-")
        text = text.replace(f"ExecStart={gendocs._roff(gendocs.UNIT_PATH)}", f"ExecStart={real}")
    return text


@click.command("man")
@click.argument("page", required=False, default="rsched", metavar="[PAGE]")
@click.option(
    "--install",
    "install_dir",
    metavar="DIR",
    type=click.Path(file_okay=False),
    help="Write every page under DIR (DIR/man1/rsched.1, DIR/man5/rsched.toml.5, "
    "DIR/man7/rsched-operations.7; ~/.local/share/man is on man's default path) "
    "and list them, instead of showing one.",
)
@output_options
@pass_app
def man_cmd(app: App, page: str, install_dir: str | None) -> None:
    """Show a man page: rsched (the commands), rsched.toml (the config file) or
    rsched-operations (guarantees, systemd units, Redis requirements, ACL user).

    On a terminal the page is shown with man(1); otherwise its roff source is
    printed (rsched man rsched.toml | man -l -). --json prints {"page", "roff"},
    or with --install one {"page", "path"} per page.
    """
    from rsched.cli import gendocs

    if install_dir is not None:
        root = Path(install_dir).expanduser()
        written = []
        for name, (section, filename) in gendocs.PAGES.items():
            target = root / f"man{section}" / filename
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(man_page(name), encoding="utf-8")
            written.append({"page": name, "path": str(target)})
            if not app.json:
                click.echo(str(target))
        if app.json:
            emit_json(written)
        app.info(f"rsched: wrote {len(gendocs.PAGES)} pages under {root}; man rsched")
        return
    name = _page_name(page)
    text = man_page(name)
    if app.json:
        emit_json({"page": name, "roff": text})
        return
    viewer = shutil.which("man")
    if viewer and sys.stdout.isatty():
        with tempfile.NamedTemporaryFile("w", suffix=".man", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            subprocess.run([viewer, "-l", f.name], check=False)
        return
    click.echo(text, nl=False)
