"""Generate the shell completions and the man pages from the click app and the
long-form text in ``rsched/cli/manual/*.md``, so none of them can drift from
the real options and nothing is written twice.

    python -m rsched.cli.gendocs           # write completions/, man/, README.md's guarantees
    python -m rsched.cli.gendocs --check   # exit 1 and list the files that are stale

Outputs (paths relative to the repository root):

    completions/rsched.bash   bash (``source`` it; needs no rsched installed)
    completions/_rsched       zsh (put on $fpath)
    completions/rsched.fish   fish (~/.config/fish/completions/)
    man/rsched.1              commands, options, exit codes, environment, files; its
                              long-form sections from manual/rsched.1.md
    man/rsched.toml.5         the config file (manual/rsched.toml.5.md)
    man/rsched-operations.7   guarantees and operations (manual/rsched-operations.7.md)
    README.md                 only between <!-- BEGIN GUARANTEES --> and <!-- END GUARANTEES -->:
                              the first paragraph of each guarantee of rsched-operations(7)

The same functions serve ``rsched completion`` and ``rsched man`` after a plain
``pip install`` (the ``manual/*.md`` files are package data). Nothing in the
engine imports this module: only those two commands do, when they run.

A command whose module fails to import is skipped with a warning on stderr
(while the tree is being built); the test of these files then compares with
what the generator produces for the same tree.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import click

from rsched import __version__
from rsched.core.errors import ExitCode

ROOT = Path(__file__).resolve().parents[2]
PROG = "rsched"
WIDTH = 80
BEGIN = "<!-- BEGIN GUARANTEES -->"
END = "<!-- END GUARANTEES -->"
MANUAL = Path(__file__).resolve().parent / "manual"
#: page name -> (section, file under man/)
PAGES = {
    "rsched": ("1", "rsched.1"),
    "rsched.toml": ("5", "rsched.toml.5"),
    "rsched-operations": ("7", "rsched-operations.7"),
}
#: Where the units of rsched-operations(7) say rsched is (``rsched man`` puts the real path).
UNIT_PATH = "/opt/rsched/bin/rsched"

# --- the command tree -----------------------------------------------------------


@dataclass
class Node:
    path: tuple[str, ...]  # ("rsched", "run", "cron")
    cmd: click.Command
    ctx: click.Context
    children: list[Node] = field(default_factory=list)

    @property
    def name(self) -> str:
        return " ".join(self.path)

    @property
    def is_group(self) -> bool:
        return isinstance(self.cmd, click.Group)

    @property
    def params(self) -> list[click.Parameter]:
        return [p for p in self.cmd.get_params(self.ctx) if not getattr(p, "hidden", False)]

    @property
    def options(self) -> list[click.Option]:
        return [p for p in self.params if isinstance(p, click.Option)]

    @property
    def arguments(self) -> list[click.Argument]:
        return [p for p in self.params if isinstance(p, click.Argument)]

    @property
    def short_help(self) -> str:
        return self.cmd.get_short_help_str(limit=WIDTH)

    def walk(self) -> Iterator[Node]:
        yield self
        for c in self.children:
            yield from c.walk()


def _context(cmd: click.Command, name: str, parent: click.Context | None) -> click.Context:
    # the command's own context_settings too (the root's -h): as a real run makes them
    settings = {
        k: v
        for k, v in cmd.context_settings.items()
        if k not in ("terminal_width", "max_content_width")
    }
    return click.Context(
        cmd,
        info_name=name,
        parent=parent,
        terminal_width=WIDTH,
        max_content_width=WIDTH,
        **settings,
    )


def build_tree(cli: click.Command | None = None, warn: bool = True) -> tuple[Node, list[str]]:
    """The whole command tree (lazy commands imported). Returns it and the skipped names."""
    if cli is None:
        from rsched.cli.main import cli as root

        cli = root
    skipped: list[str] = []
    root_node = Node((PROG,), cli, _context(cli, PROG, None))

    def expand(node: Node) -> None:
        if not isinstance(node.cmd, click.Group):
            return
        bad: list[str] = []
        for name in node.cmd.list_commands(node.ctx):
            try:
                sub = node.cmd.get_command(node.ctx, name)
            except Exception as exc:  # noqa: BLE001 - a command still being written
                full = " ".join((*node.path, name))
                skipped.append(full)
                bad.append(name)
                if warn:
                    print(
                        f"gendocs: warning: skipping `{full}`: {type(exc).__name__}: {exc}",
                        file=sys.stderr,
                    )
                continue
            if sub is None or getattr(sub, "hidden", False):
                continue
            child = Node((*node.path, name), sub, _context(sub, name, node.ctx))
            node.children.append(child)
            expand(child)
        if bad and isinstance(getattr(node.cmd, "lazy", None), dict):
            # a copy of the lazy group without the broken entries, so that its own
            # --help (which lists every subcommand) renders
            import copy

            group = copy.copy(node.cmd)
            group.lazy = {k: v for k, v in group.lazy.items() if k not in bad}  # type: ignore[attr-defined]
            node.cmd = group
            node.ctx.command = group

    expand(root_node)
    return root_node, skipped


# --- option facts shared by the completion generators --------------------------


def _takes_value(opt: click.Option) -> bool:
    return not opt.is_flag and not opt.count


def _names(opt: click.Option) -> list[str]:
    # Short names first, then long: click builds the help option from a set of
    # names, so its own order changes from one process to the next.
    return sorted(opt.opts, key=lambda n: (n.startswith("--"), opt.opts.index(n))) + [
        *opt.secondary_opts
    ]


def _choices(opt: click.Parameter) -> list[str] | None:
    if isinstance(opt.type, click.Choice):
        return [str(c) for c in opt.type.choices]
    return None


def _is_path(opt: click.Parameter) -> bool:
    return isinstance(opt.type, click.Path | click.File)


def _first_line(text: str | None) -> str:
    if not text:
        return ""
    line = text.strip().split("\n\n")[0].replace("\b", "").strip()
    line = " ".join(line.split())
    if "." in line:
        line = line.split(". ")[0].rstrip(".")
    return line


def _is_help(opt: click.Parameter, node: Node) -> bool:
    """The help option, however this click version names it (``help`` before 8.4,
    a reserved storage name after), so the generated files are the same on each."""
    return opt is node.cmd.get_help_option(node.ctx) or "--help" in getattr(opt, "opts", ())


def _opt_help(opt: click.Option) -> str:
    return _first_line(opt.help)


# --- bash -------------------------------------------------------------------------


def _sh_quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


def bash(tree: Node) -> str:
    nodes = list(tree.walk())
    sub_cases, opt_cases, val_cases, choice_cases, file_cases = [], [], [], [], []
    for n in nodes:
        key = _sh_quote(n.name)
        if n.children:
            sub_cases.append(
                f"    {key}) echo {_sh_quote(' '.join(c.path[-1] for c in n.children))} ;;"
            )
        opts = [o for opt in n.options for o in _names(opt)]
        opt_cases.append(f"    {key}) echo {_sh_quote(' '.join(opts))} ;;")
        vals = [o for opt in n.options if _takes_value(opt) for o in _names(opt)]
        if vals:
            val_cases.append(f"    {key}) echo {_sh_quote(' '.join(vals))} ;;")
        for opt in n.options:
            ch = _choices(opt)
            for o in _names(opt):
                if ch and _takes_value(opt):
                    choice_cases.append(
                        f"    {_sh_quote(n.name + '|' + o)}) echo {_sh_quote(' '.join(ch))} ;;"
                    )
                elif _is_path(opt) and _takes_value(opt):
                    file_cases.append(f"    {_sh_quote(n.name + '|' + o)}) return 0 ;;")
    nl = "\n"
    return f"""# bash completion for rsched -*- shell-script -*-
# Generated by `python -m rsched.cli.gendocs` from the click app; do not edit.
# Use: source completions/rsched.bash   (or copy to /usr/share/bash-completion/completions/rsched)

_rsched_subcommands() {{
  case "$1" in
{nl.join(sub_cases)}
  esac
}}

_rsched_options() {{
  case "$1" in
{nl.join(opt_cases)}
  esac
}}

_rsched_value_options() {{
  case "$1" in
{nl.join(val_cases)}
  esac
}}

_rsched_choices() {{
  case "$1" in
{nl.join(choice_cases)}
  esac
}}

_rsched_is_file_option() {{
  case "$1" in
{nl.join(file_cases)}
  esac
  return 1
}}

_rsched_has_word() {{
  local w
  for w in $2; do [[ "$w" == "$1" ]] && return 0; done
  return 1
}}

_rsched() {{
  local cur prev path word i skip=0
  COMPREPLY=()
  cur="${{COMP_WORDS[COMP_CWORD]}}"
  prev=""
  ((COMP_CWORD > 0)) && prev="${{COMP_WORDS[COMP_CWORD-1]}}"
  path="rsched"
  for ((i = 1; i < COMP_CWORD; i++)); do
    word="${{COMP_WORDS[i]}}"
    if ((skip)); then skip=0; continue; fi
    # after `--` comes a command of the user's (exec, run cron): complete files
    [[ "$word" == "--" ]] && return 0
    if [[ "$word" == -* ]]; then
      [[ "$word" != *=* ]] && _rsched_has_word "$word" "$(_rsched_value_options "$path")" && skip=1
      continue
    fi
    _rsched_has_word "$word" "$(_rsched_subcommands "$path")" && path="$path $word"
  done
  if ((skip)); then
    local choices
    choices="$(_rsched_choices "$path|$prev")"
    if [[ -n "$choices" ]]; then
      COMPREPLY=($(compgen -W "$choices" -- "$cur"))
    elif _rsched_is_file_option "$path|$prev"; then
      COMPREPLY=($(compgen -f -- "$cur"))
    fi
    return 0
  fi
  if [[ "$cur" == -* ]]; then
    COMPREPLY=($(compgen -W "$(_rsched_options "$path")" -- "$cur"))
    return 0
  fi
  local subs
  subs="$(_rsched_subcommands "$path")"
  if [[ -n "$subs" ]]; then
    COMPREPLY=($(compgen -W "$subs" -- "$cur"))
  fi
  return 0
}}

complete -o default -F _rsched rsched
"""


# --- zsh --------------------------------------------------------------------------


def _zsh_quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


def _zsh_item(name: str, desc: str) -> str:
    return _zsh_quote(name.replace(":", "\\:") + (":" + desc if desc else ""))


def zsh(tree: Node) -> str:
    nodes = list(tree.walk())
    sub_cases, opt_cases, val_cases, choice_cases, file_cases = [], [], [], [], []
    for n in nodes:
        key = _zsh_quote(n.name)
        if n.children:
            items = " ".join(_zsh_item(c.path[-1], c.short_help) for c in n.children)
            sub_cases.append(f"    {key}) reply=({items}) ;;")
        items = " ".join(_zsh_item(o, _opt_help(opt)) for opt in n.options for o in _names(opt))
        opt_cases.append(f"    {key}) reply=({items}) ;;")
        vals = [o for opt in n.options if _takes_value(opt) for o in _names(opt)]
        if vals:
            val_cases.append(f"    {key}) reply=({' '.join(_zsh_quote(v) for v in vals)}) ;;")
        for opt in n.options:
            ch = _choices(opt)
            for o in _names(opt):
                if ch and _takes_value(opt):
                    words = " ".join(_zsh_quote(c) for c in ch)
                    choice_cases.append(f"    {_zsh_quote(n.name + '|' + o)}) reply=({words}) ;;")
                elif _is_path(opt) and _takes_value(opt):
                    file_cases.append(f"    {_zsh_quote(n.name + '|' + o)}) return 0 ;;")
    nl = "\n"
    return f"""#compdef rsched
# zsh completion for rsched.
# Generated by `python -m rsched.cli.gendocs` from the click app; do not edit.
# Use: put this file (named _rsched) in a directory on $fpath, then compinit.

_rsched_subcommands() {{
  reply=()
  case "$1" in
{nl.join(sub_cases)}
  esac
}}

_rsched_options() {{
  reply=()
  case "$1" in
{nl.join(opt_cases)}
  esac
}}

_rsched_value_options() {{
  reply=()
  case "$1" in
{nl.join(val_cases)}
  esac
}}

_rsched_choices() {{
  reply=()
  case "$1" in
{nl.join(choice_cases)}
  esac
}}

_rsched_is_file_option() {{
  case "$1" in
{nl.join(file_cases)}
  esac
  return 1
}}

_rsched() {{
  local path="rsched" word prev i skip=0
  local -a reply subs names
  for (( i = 2; i < CURRENT; i++ )); do
    word="${{words[i]}}"
    if (( skip )); then skip=0; continue; fi
    if [[ "$word" == "--" ]]; then _files; return; fi
    if [[ "$word" == -* ]]; then
      if [[ "$word" != *=* ]]; then
        _rsched_value_options "$path"
        (( ${{reply[(Ie)$word]}} )) && skip=1
      fi
      continue
    fi
    _rsched_subcommands "$path"
    subs=("${{reply[@]%%:*}}")
    (( ${{subs[(Ie)$word]}} )) && path="$path $word"
  done
  prev="${{words[CURRENT-1]}}"
  if (( skip )); then
    _rsched_choices "$path|$prev"
    if (( ${{#reply}} )); then
      compadd -a reply
    elif _rsched_is_file_option "$path|$prev"; then
      _files
    else
      _message 'value'
    fi
    return
  fi
  if [[ "${{words[CURRENT]}}" == -* ]]; then
    _rsched_options "$path"
    _describe -t options 'option' reply
    return
  fi
  _rsched_subcommands "$path"
  if (( ${{#reply}} )); then
    _describe -t commands 'rsched command' reply
  else
    _files
  fi
}}

if [[ "$funcstack[1]" == "_rsched" ]]; then
  _rsched "$@"
else
  compdef _rsched rsched
fi
"""


# --- fish -------------------------------------------------------------------------


def _fish_quote(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def fish(tree: Node) -> str:
    nodes = list(tree.walk())
    sub_cases, val_cases, lines = [], [], []
    for n in nodes:
        if n.children:
            words = " ".join(_fish_quote(c.path[-1]) for c in n.children)
            sub_cases.append(
                f"        case {_fish_quote(n.name)}\n            printf '%s\\n' {words}"
            )
        vals = [o for opt in n.options if _takes_value(opt) for o in _names(opt)]
        if vals:
            words = " ".join(_fish_quote(v) for v in vals)
            val_cases.append(
                f"        case {_fish_quote(n.name)}\n            printf '%s\\n' {words}"
            )
        cond = f"-n {_fish_quote('__rsched_is ' + _fish_quote(n.name))}"
        for c in n.children:
            lines.append(
                f"complete -c rsched {cond} -f -a {_fish_quote(c.path[-1])} -d {_fish_quote(c.short_help)}"
            )
        for opt in n.options:
            parts = ["complete -c rsched", cond]
            for o in _names(opt):
                if o.startswith("--"):
                    parts.append(f"-l {_fish_quote(o[2:])}")
                elif len(o) == 2:
                    parts.append(f"-s {_fish_quote(o[1:])}")
                else:
                    parts.append(f"-o {_fish_quote(o[1:])}")
            if _takes_value(opt):
                ch = _choices(opt)
                if ch:
                    parts.append(f"-x -a {_fish_quote(' '.join(ch))}")
                elif _is_path(opt):
                    parts.append("-r -F")
                else:
                    parts.append("-x")
            help_ = _opt_help(opt)
            if help_:
                parts.append(f"-d {_fish_quote(help_)}")
            lines.append(" ".join(parts))
    nl = "\n"
    return f"""# fish completion for rsched.
# Generated by `python -m rsched.cli.gendocs` from the click app; do not edit.
# Use: copy to ~/.config/fish/completions/rsched.fish

function __rsched_subcommands
    switch $argv[1]
{nl.join(sub_cases)}
    end
end

function __rsched_value_options
    switch $argv[1]
{nl.join(val_cases)}
    end
end

function __rsched_path
    set -l tokens (commandline -opc)
    set -l path rsched
    set -l skip 0
    for t in $tokens[2..-1]
        if test $skip = 1
            set skip 0
            continue
        end
        if test "$t" = "--"
            echo "$path --"
            return
        end
        if string match -q -- '-*' $t
            if not string match -q -- '*=*' $t; and contains -- $t (__rsched_value_options $path)
                set skip 1
            end
            continue
        end
        if contains -- $t (__rsched_subcommands $path)
            set path "$path $t"
        end
    end
    echo $path
end

function __rsched_is
    test (__rsched_path) = "$argv[1]"
end

complete -c rsched -e
{nl.join(lines)}
"""


# --- man page ---------------------------------------------------------------------

_NON_ASCII = {
    "\u2026": "...",
    "\u2013": "-",
    "\u2014": "--",
    "\u2018": "'",
    "\u2019": "'",
    "\u201c": '"',
    "\u201d": '"',
    "\u00b1": "+/-",
    "\u2192": "->",
    "\u00d7": "x",
}


def _roff(text: str) -> str:
    """Escape text for a roff line (backslashes, hyphens, leading dots, non-ASCII)."""
    out = text.replace("\\", "\\e").replace("-", "\\-")
    for k, v in _NON_ASCII.items():
        out = out.replace(k, v.replace("-", "\\-"))
    out = "".join(c if ord(c) < 128 else f"\\[u{ord(c):04X}]" for c in out)
    return out


def _roff_lines(text: str) -> list[str]:
    return [("\\&" + ln if ln.startswith((".", "'")) else ln) for ln in text.split("\n")]


def _paragraphs(help_text: str) -> list[tuple[bool, str]]:
    """Split click help into (verbatim?, text) paragraphs, honouring click's ``\\b``."""
    text = help_text.split("\f")[0]
    out = []
    for para in re.split(r"\n\s*\n", click.unstyle(text).strip("\n")):
        lines = para.split("\n")
        stripped = [ln.strip() for ln in lines]
        if stripped and stripped[0] == "\b":
            body = lines[1:]
            indent = min((len(ln) - len(ln.lstrip()) for ln in body if ln.strip()), default=0)
            out.append((True, "\n".join(ln[indent:] for ln in body)))
        else:
            out.append((False, " ".join(s for s in stripped if s)))
    return [p for p in out if p[1].strip()]


def _help_to_roff(help_text: str | None) -> list[str]:
    out: list[str] = []
    if not help_text:
        return out
    import inspect

    for i, (verbatim, text) in enumerate(_paragraphs(inspect.cleandoc(help_text))):
        if i:
            out.append(".PP")
        if verbatim:
            out += [".nf", *_roff_lines(_roff(text)), ".fi"]
        else:
            out += _roff_lines(_roff(text))
    return out


def _opt_synopsis(opt: click.Option) -> str:
    names = ", ".join(f"\\fB{_roff(n)}\\fR" for n in _names(opt))
    if _takes_value(opt):
        ch = _choices(opt)
        metavar = "|".join(ch) if ch else (opt.metavar or opt.type.name.upper())
        names += f" \\fI{_roff(metavar)}\\fR"
    return names


def _opt_help_full(opt: click.Option) -> str:
    text = " ".join((opt.help or "").split())
    extra = []
    if opt.multiple:
        extra.append("repeatable")
    if opt.show_default and opt.default not in (None, False, ()) and not callable(opt.default):
        extra.append(f"default: {opt.default}")
    if opt.envvar and isinstance(opt.envvar, str):
        extra.append(f"env {opt.envvar}")
    if extra:
        text += f" [{'; '.join(extra)}]"
    return text


def _metavar(param: click.Parameter, ctx: click.Context) -> str:
    try:
        return param.make_metavar(ctx)  # type: ignore[call-arg]  # click >= 8.2
    except TypeError:
        return param.make_metavar()  # type: ignore[call-arg]


def _usage(node: Node) -> str:
    pieces = node.cmd.collect_usage_pieces(node.ctx)
    return " ".join([node.name, *pieces])


#: The one description of each exit code: rsched(1)'s EXIT STATUS (the README
#: points there; the root --help keeps its one-line summary).
_EXIT_TEXT: dict[int, str] = {
    ExitCode.OK: "Success.",
    ExitCode.FAILURE: "Failure: doctor found a FAIL, a run failed, --wait-replicas fell short. "
    "exec passes its command's own exit status through (127: the command could not be started).",
    ExitCode.USAGE: "Usage error or bad input (a name, duration, time or cron expression that "
    "is refused); nothing was written.",
    ExitCode.NOT_FOUND: "Not found: cancel, show, unlock or retry of something absent; "
    "server status when no server runs.",
    ExitCode.CONFLICT: "Conflict: add --if-exists error on an existing task, unlock with a wrong "
    "token, retry of a task that is not dead, a server already running.",
    ExitCode.UNAVAILABLE: "Redis unreachable or authentication refused, or out of memory "
    "(maxmemory reached with noeviction: the write was refused; the message says what was "
    "not written, and add --from how many tasks were).",
    ExitCode.LOCKED: "Lock held (exec --if-locked fail, or wait past --wait-timeout).",
    ExitCode.CONFIG: "Configuration error: a bad config file, a malformed Redis URL (the message "
    "names the part: scheme, host, port, database, or a password character that must be "
    "percent-encoded; it never repeats the user or password), a database the server lacks, "
    "a key in the namespace holding "
    "another type of data, the server's notify-keyspace-events off (run expired), a missing "
    "optional dependency or permission.",
    ExitCode.INTERRUPTED: "Interrupted (SIGINT, Ctrl-C): also the run loops and exec after "
    "their clean stop (SIGTERM stops a run loop with 0).",
}

_ENVIRONMENT = [
    ("RSCHED_REDIS_URL", "Redis URL (redis://, rediss:// for TLS, unix://); same as --redis-url."),
    ("REDIS_URL", "Used when RSCHED_REDIS_URL is not set."),
    ("RSCHED_NAMESPACE", "Key prefix; same as --namespace (default rsched)."),
    ("RSCHED_CONFIG", "Config file; same as --config."),
    ("RSCHED_REDIS_PASSWORD", "Redis password (keeps it out of argv and the config file)."),
    (
        "RSCHED_SENTINEL_PASSWORD",
        "Password of the Sentinel processes themselves (redis+sentinel:// URLs), when they have one.",
    ),
    (
        "RSCHED_REDIS_CLUSTER",
        "true, false or auto (default): use the Redis Cluster client; auto asks the server (HELLO).",
    ),
    (
        "RSCHED_TLS_CA, RSCHED_TLS_CERT, RSCHED_TLS_KEY",
        "CA bundle, client certificate and key for rediss:// URLs.",
    ),
    (
        "RSCHED_WEB_TOKEN",
        "The token of rsched web's pages and API (when no --token-file); empty: none.",
    ),
    ("NO_COLOR", "When set, no colour in any output."),
    (
        "RSCHED_GUARDIAN",
        "off: start no guardian process (Linux), so a kill -9'd runner's children run on; "
        "for supervisors that kill the whole service themselves.",
    ),
    (
        "XDG_CONFIG_HOME",
        "The config file is looked up in $XDG_CONFIG_HOME/rsched/config.toml (default ~/.config).",
    ),
    (
        "XDG_STATE_HOME",
        "rsched server keeps its data in $XDG_STATE_HOME/rsched (default ~/.local/state).",
    ),
    (
        "NOTIFY_SOCKET, WATCHDOG_USEC",
        "Set by systemd for Type=notify services: run loops send READY=1, "
        "WATCHDOG=1 and STOPPING=1.",
    ),
]

_HANDLER_ENV = [
    ("RSCHED_QUEUE", "The task's queue."),
    ("RSCHED_TASK_TYPE", "The task's type."),
    ("RSCHED_TASK_ID", "The task's ID (also the handler's last argument)."),
    ("RSCHED_ATTEMPT", "1 on the first run."),
    ("RSCHED_DUE_AT", "When the task was due (ISO 8601 UTC with milliseconds)."),
    ("RSCHED_CLAIM_TOKEN", "The claim token of this attempt (for idempotency)."),
    (
        "RSCHED_PROGRESS_FD",
        "A file descriptor: lines `FRACTION MESSAGE` written to it (0 <= FRACTION <= 1) "
        "report progress, shown by show and list and kept in history.",
    ),
]

_JOB_ENV = [
    ("RSCHED_NAME", "The cron or lock name."),
    ("RSCHED_FIRE_AT", "The tick being run (ISO 8601 UTC with milliseconds)."),
    (
        "RSCHED_FENCING_TOKEN",
        "Strictly increasing per acquisition; pass it to storage that checks it.",
    ),
    (
        "RSCHED_SHARD_INDEX, RSCHED_SHARD_TOTAL",
        "With --shards: which shard this run owns, of how many.",
    ),
    (
        "RSCHED_GUARD",
        "Internal, in handlers and jobs too (Linux): marks the processes the runner's "
        "guardian kills if the runner is killed; pass it on to child processes.",
    ),
]

_EXPIRED_ENV = [
    ("RSCHED_KEY", "The expired key's name (also the last argument)."),
    ("RSCHED_PATTERN", "The --pattern that matched it."),
    ("RSCHED_DB", "The database the key was in."),
    ("RSCHED_FIRED_BY", "event (its expiry notification) or sweep (the backup sweep found it)."),
    ("RSCHED_FIRED_AT", "When this firing was claimed (ISO 8601 UTC with milliseconds)."),
    ("RSCHED_EXPIRE_AT", "For armed keys: when the key was due to expire."),
]

_FILES = [
    (
        "./rsched.toml, $XDG_CONFIG_HOME/rsched/config.toml",
        "The config file (TOML): [redis], [queues.NAME], [handlers], [cron.NAME].",
    ),
    (
        "$XDG_STATE_HOME/rsched/",
        "rsched server: redis.conf (mode 0600), redis.pid, redis.sock, server.log, the AOF and RDB files.",
    ),
    (
        "completions/rsched.bash, completions/_rsched, completions/rsched.fish",
        "Shell completions in a checkout; after pip install, rsched completion SHELL prints "
        "them (--install writes them where the shell looks).",
    ),
    (
        "man/rsched.1, man/rsched.toml.5, man/rsched-operations.7",
        "These pages in a checkout; rsched man [PAGE] prints them (--install DIR writes them).",
    ),
]

_EXAMPLES = [
    (
        "Start the embedded server in the background and check it:",
        "rsched server start --daemon\nrsched doctor",
    ),
    (
        "Schedule a task in 30 minutes, and one at a fixed time:",
        "rsched add --in 30m order.close 1001\nrsched add --at 2027-12-01T02:00+08:00 report.daily 2027-12-01",
    ),
    (
        "Consume a queue with a handler (the task ID is the last argument; the payload is on stdin):",
        "rsched run consumer --queue default --handler order.close=./close-order",
    ),
    (
        "Run a job at most once per tick across hosts from a host crontab:",
        "*/5 * * * * rsched exec --lock sync --once-per '*/5 * * * *' -- /usr/local/bin/sync",
    ),
    ("Scripts read JSON:", "rsched queues --json | jq '.[] | select(.lag_ms > 60000)'"),
    (
        "Metrics for node_exporter's textfile collector, every minute:",
        "* * * * * rsched metrics -o /var/lib/node_exporter/textfile/rsched.prom",
    ),
    (
        "Units for systemd (a consumer, a cron runner, a timer, the embedded server):",
        "rsched man rsched-operations    # see SYSTEMD",
    ),
]


def _tagged(items: list[tuple[str, str]], font: str = "B") -> list[str]:
    """A man-page list: each name in bold (or italic) over its text."""
    out: list[str] = []
    for name, text in items:
        out += [".TP", f"\\f{font}{_roff(name)}\\fR", _roff(text)]
    return out


def man(tree: Node) -> str:
    out: list[str] = [
        '.\\" Generated by `python -m rsched.cli.gendocs` from the click app; do not edit.',
        f'.TH RSCHED 1 "" "rsched {_roff(__version__)}" "User Commands"',
        ".SH NAME",
        "rsched \\- distributed scheduled tasks on Redis",
        ".SH SYNOPSIS",
        ".B rsched",
        "[\\fIGLOBAL OPTIONS\\fR] \\fICOMMAND\\fR [\\fIOPTIONS\\fR] [\\fIARGS\\fR]...",
        ".SH DESCRIPTION",
        *_help_to_roff(tree.cmd.help),
        ".SH GLOBAL OPTIONS",
    ]
    for opt in tree.options:
        out += [".TP", _opt_synopsis(opt), *_roff_lines(_roff(_opt_help_full(opt)))]
    out.append(".SH COMMANDS")
    for node in tree.walk():
        if node is tree:
            continue
        out += [
            ".SS " + _roff(node.name),
            ".B " + _roff(_usage(node)),
            ".PP",
            *_help_to_roff(node.cmd.help),
        ]
        if node.children:
            out += [
                ".PP",
                "Subcommands: " + ", ".join(_roff(c.path[-1]) for c in node.children) + ".",
            ]
        if node.arguments:
            out += [
                ".PP",
                "Arguments: " + " ".join(_roff(_metavar(a, node.ctx)) for a in node.arguments),
            ]
        for opt in node.options:
            if _is_help(opt, node):
                continue  # every command has -h/--help; said once under GLOBAL OPTIONS
            out += [".TP", _opt_synopsis(opt), *_roff_lines(_roff(_opt_help_full(opt)))]
    out += markdown_sections(_manual("rsched"))
    out += [".SH EXIT STATUS", ".TP 6"]
    for i, code in enumerate(ExitCode):
        if i:
            out.append(".TP")
        out += [
            f"\\fB{int(code)}\\fR",
            _roff(_EXIT_TEXT.get(code, code.name.lower().replace("_", " "))),
        ]
    out.append(".SH ENVIRONMENT")
    out += _tagged(_ENVIRONMENT)
    out += [
        ".SS Task handlers (rsched run consumer)",
        "A handler is run by argv (split like a shell would, never by a shell); the task ID is "
        "appended as its last argument and the payload arrives on standard input as JSON. "
        "An ID that begins with - is never read as an option: by default (--id-arg auto) it "
        "comes after the end-of-options marker, as -- -ID (getopt, argparse, click and the "
        "coreutils honour it); any other ID is passed as is (./close-order 1001). --id-arg none "
        "passes no ID argument (read RSCHED_TASK_ID); --id-arg plain passes it as is, even "
        "--help (only for a program that takes no options). In the config file: "
        'handlers.TYPE = {command = ..., id_arg = "none"}.',
        *_tagged(_HANDLER_ENV),
        ".SS Cron and exec jobs",
        *_tagged(_JOB_ENV),
        ".SS Keyspace triggers (rsched run expired)",
        "The expired key's name is the handler's last argument; for a key armed with "
        "rsched.expired.arm() the value given to it arrives on standard input.",
        *_tagged(_EXPIRED_ENV),
        ".SH FILES",
        *_tagged(_FILES, font="I"),
    ]
    out.append(".SH EXAMPLES")
    for i, (text, snippet) in enumerate(_EXAMPLES):
        if i:
            out.append(".PP")
        out += _roff_lines(_roff(text))
        out += [".PP", ".RS 4", ".nf", *_roff_lines(_roff(snippet)), ".fi", ".RE"]
    out += [
        ".SH SEE ALSO",
        "\\fBrsched.toml\\fR(5), \\fBrsched\\-operations\\fR(7) (guarantees, systemd units, "
        "Redis requirements, ACL user),",
        "\\fBredis\\-server\\fR(1), \\fBsystemd.service\\fR(5), \\fBcrontab\\fR(5)",
    ]
    return "\n".join(out) + "\n"


# --- long-form pages (Markdown -> roff) ------------------------------------------


def _manual(page: str) -> str:
    section = PAGES[page][0]
    return (MANUAL / f"{page}.{section}.md").read_text(encoding="utf-8")


_INLINE = re.compile(
    r"`([^`]*)`|\*\*(.+?)\*\*|(?<![\w*])\*([^*\s][^*]*?)\*(?![\w*])|\[([^\]]+)\]\([^)]*\)"
)


def _inline(text: str) -> str:
    """Markdown inline markup -> roff: `code` and **bold** bold, *em* italic, links as text."""
    out, pos = [], 0
    for m in _INLINE.finditer(text):
        out.append(_roff(text[pos : m.start()]))
        code, bold, em, link = m.groups()
        if code is not None:
            text_ = _roff(code)
            if len(code) > 24:  # a long name (test_x.py::test_y): let the line break in it
                text_ = re.sub(r"(::|_|/|,)", r"\1\\:", text_)
            out.append(f"\\fB{text_}\\fR")
        elif bold is not None:
            out.append(f"\\fB{_inline(bold)}\\fR")
        elif em is not None:
            out.append(f"\\fI{_inline(em)}\\fR")
        else:
            out.append(_inline(link))
        pos = m.end()
    out.append(_roff(text[pos:]))
    return "".join(out)


def _cells(row: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))]


def markdown_sections(md: str) -> list[str]:
    """The roff of a manual page's Markdown (its ``# title`` line and comments dropped):
    ``##`` sections, ``###`` subsections, paragraphs, ``-``/``1.`` lists, fenced code,
    and tables (one tagged paragraph a row: the first cell over ``header: cell`` lines)."""
    md = re.sub(r"<!--.*?-->\n?", "", md, flags=re.S)
    lines = md.split("\n")
    out: list[str] = []
    i, para = 0, list[str]()

    def flush() -> None:
        if para:
            out.extend(_roff_lines(_inline(" ".join(para))))
            para.clear()

    def gap() -> None:
        if out and not out[-1].startswith((".SH", ".SS", ".TP", ".IP")):
            out.append(".PP")

    while i < len(lines):
        line = lines[i]
        if line.startswith("# "):
            i += 1
            continue
        if not line.strip():
            flush()
            i += 1
            continue
        if line.startswith("```"):
            flush()
            gap()
            body = []
            i += 1
            while not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            out += [".RS 4", ".nf", *_roff_lines(_roff("\n".join(body))), ".fi", ".RE"]
            i += 1
            continue
        if line.startswith("## "):
            flush()
            out.append(f".SH {_roff(line[3:].strip())}")
            i += 1
            continue
        if line.startswith("### "):
            flush()
            out.append(f".SS {_roff(line[4:].strip())}")
            i += 1
            continue
        if line.startswith("|"):
            flush()
            gap()
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            head, body_rows = rows[0], [r for r in rows[2:]]
            for r in body_rows:
                out += [".TP", f"\\fB{_inline(r[0])}\\fR" if r[0] else "\\&"]
                for j, cell in enumerate(r[1:], 1):
                    if j > 1:
                        out.append(".br")
                    label = head[j] if j < len(head) and head[j] else ""
                    out += _roff_lines((f"{_inline(label)}: " if label else "") + _inline(cell))
            continue
        m = re.match(r"(\s*)(- |\d+\. )(.*)", line)
        if m and not m.group(1):
            flush()
            mark = "\\(bu" if m.group(2) == "- " else m.group(2).strip()
            item = [m.group(3)]
            i += 1
            while i < len(lines) and lines[i].startswith("  ") and lines[i].strip():
                item.append(lines[i].strip())
                i += 1
            out += [f".IP {mark} 4", *_roff_lines(_inline(" ".join(item)))]
            continue
        if not para:
            gap()
        para.append(line.strip())
        i += 1
    flush()
    return out


def page(name: str, tree: Node | None = None) -> str:
    """The roff of man page ``name`` (a key of :data:`PAGES`)."""
    if name == "rsched":
        return man(tree if tree is not None else build_tree(warn=False)[0])
    section = PAGES[name][0]
    md = _manual(name)
    title = md.split("\n", 1)[0]
    m = re.match(r"# (\S+) \d+ - (.*)", title)
    assert m, f"manual/{name}.{section}.md must start with '# {name} {section} - what it is'"
    header = [
        '.\\" Generated by `python -m rsched.cli.gendocs` from rsched/cli/manual; do not edit.',
        f'.TH {_roff(name.upper())} {section} "" "rsched {_roff(__version__)}" "rsched manual"',
        ".SH NAME",
        f"{_roff(name)} \\- {_roff(m.group(2))}",
        ".ad l",  # ragged right: tables of long test names cannot be justified
    ]
    return "\n".join(header + markdown_sections(md)) + "\n"


def guarantees_summary() -> str:
    """README: the first paragraph of each guarantee of rsched-operations(7), numbered."""
    md = _manual("rsched-operations")
    body = md.split("\n## GUARANTEES\n", 1)[1].split("\n## ", 1)[0]
    out = []
    for m in re.finditer(r"^### (\d+)\. ([^\n]+)\n\n(.+?)(?:\n\n|\Z)", body, re.M | re.S):
        num, head, text = m.groups()
        text = " ".join(text.split())
        out.append(f"{num}. **{head}.** {text}")
    return "\n".join(out) + "\n"


def splice_readme(text: str, ref: str, begin: str = BEGIN, end_marker: str = END) -> str | None:
    """README text with ``ref`` between the markers, or None without markers."""
    start, end = text.find(begin), text.find(end_marker)
    if start < 0 or end < start:
        return None
    return text[: start + len(begin)] + "\n" + ref.strip("\n") + "\n" + text[end:]


# --- all outputs ----------------------------------------------------------------


def render_all(root: Path = ROOT, warn: bool = True) -> tuple[dict[Path, str], list[str]]:
    """Every generated file (path -> content) and the commands that were skipped."""
    tree, skipped = build_tree(warn=warn)
    files = {
        root / "completions" / "rsched.bash": bash(tree),
        root / "completions" / "_rsched": zsh(tree),
        root / "completions" / "rsched.fish": fish(tree),
    }
    for name, (_, filename) in PAGES.items():
        files[root / "man" / filename] = page(name, tree)
    readme = root / "README.md"
    if readme.is_file():
        new = splice_readme(readme.read_text(encoding="utf-8"), guarantees_summary())
        if new is not None:
            files[readme] = new
    return files, skipped


def stale(files: dict[Path, str]) -> list[Path]:
    out = []
    for path, text in files.items():
        try:
            current = path.read_text(encoding="utf-8")
        except OSError:
            current = None
        if current != text:
            out.append(path)
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m rsched.cli.gendocs", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument(
        "--check", action="store_true", help="exit 1 listing stale files; write nothing"
    )
    ap.add_argument("--root", default=str(ROOT), help="repository root (default: this checkout)")
    args = ap.parse_args(argv)
    root = Path(args.root)
    files, skipped = render_all(root)
    old = stale(files)
    if args.check:
        for p in old:
            print(
                f"stale: {p.relative_to(root)} (run python -m rsched.cli.gendocs)", file=sys.stderr
            )
        return 1 if old else 0
    for p in old:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(files[p], encoding="utf-8")
        print(f"wrote {p.relative_to(root)}", file=sys.stderr)
    if skipped:
        print(f"gendocs: {len(skipped)} command(s) skipped: {', '.join(skipped)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
