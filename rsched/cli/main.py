"""`rsched` entry point: global options, lazy subcommands, the one place that
maps exceptions to messages and exit codes."""

from __future__ import annotations

import importlib
import os
import sys
from functools import cached_property
from typing import TYPE_CHECKING, Any

import click

from rsched import __version__
from rsched.cli.params import AsciiIntRange
from rsched.core.errors import ExitCode, RschedError

if TYPE_CHECKING:  # pragma: no cover
    from rsched.api import Rsched
    from rsched.core.config import Settings

FORMATS = ("table", "plain", "json")

# name -> "module:attribute"; imported only when the command runs (cheap cold start).
COMMANDS: dict[str, str] = {
    "add": "rsched.cli.tasks_cmds:add",
    "cancel": "rsched.cli.tasks_cmds:cancel",
    "list": "rsched.cli.tasks_cmds:list_cmd",
    "show": "rsched.cli.tasks_cmds:show",
    "queues": "rsched.cli.tasks_cmds:queues",
    "requeue-stale": "rsched.cli.tasks_cmds:requeue_stale",
    "dead": "rsched.cli.tasks_cmds:dead",
    "retry": "rsched.cli.tasks_cmds:retry",
    "purge": "rsched.cli.tasks_cmds:purge",
    "run": "rsched.cli.run_cmds:run",
    "exec": "rsched.cli.cron_cmds:exec_cmd",
    "locks": "rsched.cli.cron_cmds:locks",
    "unlock": "rsched.cli.cron_cmds:unlock",
    "crons": "rsched.cli.cron_cmds:crons",
    "next": "rsched.cli.cron_cmds:next_cmd",
    "pause": "rsched.cli.cron_cmds:pause",
    "resume": "rsched.cli.cron_cmds:resume",
    "forget": "rsched.cli.cron_cmds:forget",
    "trigger": "rsched.cli.cron_cmds:trigger",
    "history": "rsched.cli.cron_cmds:history",
    "check": "rsched.cli.check_cmd:check",
    "events": "rsched.cli.events_cmd:events",
    "logs": "rsched.cli.logs_cmd:logs",
    "server": "rsched.cli.ops_cmds:server",
    "doctor": "rsched.cli.ops_cmds:doctor",
    "metrics": "rsched.cli.ops_cmds:metrics",
    "demo": "rsched.cli.demo_cmd:demo",
    "top": "rsched.cli.top_cmd:top",
    "bench": "rsched.cli.bench_cmd:bench",
    "web": "rsched.cli.web_cmd:web",
    "completion": "rsched.cli.docs_cmd:completion",
    "man": "rsched.cli.docs_cmd:man_cmd",
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def __init__(self, *args: Any, lazy: dict[str, str] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy:
            mod, attr = self.lazy[cmd_name].split(":")
            cmd = getattr(importlib.import_module(mod), attr)
            assert isinstance(cmd, click.Command), cmd_name
            return verbosity_options(cmd)
        return super().get_command(ctx, cmd_name)


def _set_verbosity(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if not value:
        return value
    app = ctx.find_object(App)
    if app is not None:
        if param.name == "verbose_after":
            app.verbose += int(value)
        else:
            app.quiet = True
    return value


def verbosity_options(cmd: click.Command) -> click.Command:
    """``-v`` / ``-q`` after the command too (``rsched queues -v``), as ``--json``:
    added once to each subcommand (and theirs) that has no option of that name.

    Not to a command that runs a command of the user's (``exec``, ``run cron``,
    ``run expired``: a variadic ``-- CMD...``): there ``rsched exec --lock x ./job -q``
    without the ``--`` is refused today (no such option), and must not become
    ``./job`` run without its ``-q``; ``rsched -q exec ...`` works."""
    if getattr(cmd, "_rsched_verbosity", False):
        return cmd
    variadic = any(isinstance(p, click.Argument) and p.nargs == -1 for p in cmd.params)
    taken = {o for p in cmd.params for o in getattr(p, "opts", ())}
    if variadic:
        taken |= {"-v", "-q"}
    for names, kind, text in (
        (["-v", "--verbose", "verbose_after"], {"count": True}, "More detail on stderr"),
        (["-q", "--quiet", "quiet_after"], {"is_flag": True}, "Only errors on stderr"),
    ):
        if not taken & set(names[:2]):
            cmd.params.append(
                click.Option(
                    names,
                    expose_value=False,
                    callback=_set_verbosity,
                    help=f"{text} (same as rsched {names[0]}).",
                    **kind,
                )
            )
    cmd._rsched_verbosity = True  # type: ignore[attr-defined]
    if isinstance(cmd, click.Group) and not isinstance(cmd, LazyGroup):
        for sub in cmd.commands.values():
            verbosity_options(sub)
    return cmd


class App:
    """What every command gets as ``ctx.obj``: settings, a connection (opened
    on first use), the output format and verbosity."""

    def __init__(
        self,
        redis_url: str | None,
        namespace: str | None,
        config: str | None,
        fmt: str | None,
        verbose: int,
        quiet: bool,
    ):
        self._redis_url = redis_url
        self._namespace = namespace
        self._config = config
        self.fmt = fmt or "table"
        self.verbose = verbose
        self.quiet = quiet

    @cached_property
    def settings(self) -> Settings:
        from rsched.core.config import resolve

        return resolve(self._redis_url, self._namespace, self._config)

    @cached_property
    def rs(self) -> Rsched:
        from rsched.api import Rsched

        return Rsched.from_settings(self.settings)

    @property
    def json(self) -> bool:
        return self.fmt == "json"

    #: "text" or "json" (one JSON object a line, for log shippers; run loops' --log-format)
    log_format = "text"

    def log(self, message: str, level: str = "info") -> None:
        """One line on stderr, as text or as a JSON object (``--log-format json``)."""
        if self.log_format == "json":
            import json
            import time

            from rsched.core.timeutil import iso

            text = message[len("rsched: ") :] if message.startswith("rsched: ") else message
            message = json.dumps(
                {"time": iso(int(time.time() * 1000)), "level": level, "message": text},
                ensure_ascii=False,
            )
        click.echo(message, err=True)

    def info(self, message: str) -> None:
        """A diagnostic for people (stderr), silenced by -q."""
        if not self.quiet:
            self.log(message)

    def debug(self, message: str) -> None:
        if self.verbose and not self.quiet:
            self.log(message, "debug")


def _set_format(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if value is None or value is False:
        return value
    app = ctx.find_object(App)
    if app is not None:
        app.fmt = "json" if param.name == "json_flag" else value
    return value


def output_options(f: Any) -> Any:
    """``--format`` / ``--json`` after the command (``rsched list --json``)."""
    f = click.option(
        "--json",
        "json_flag",
        is_flag=True,
        default=False,
        expose_value=False,
        callback=_set_format,
        help="Print JSON (same as --format json).",
    )(f)
    f = click.option(
        "--format",
        "fmt",
        type=click.Choice(FORMATS),
        default=None,
        expose_value=False,
        callback=_set_format,
        help="Output format.",
    )(f)
    return f


def wait_replicas_options(f: Any) -> Any:
    """``--wait-replicas N`` / ``--wait-replicas-timeout DUR`` (defaults: ``[redis]
    wait_replicas`` / ``wait_replicas_timeout``); see :mod:`rsched.core.replication`."""
    f = click.option(
        "--wait-replicas-timeout",
        "wait_replicas_timeout",
        metavar="DUR",
        help="How long --wait-replicas waits [default: redis.wait_replicas_timeout, else 1s].",
    )(f)
    f = click.option(
        "--wait-replicas",
        "wait_replicas",
        type=AsciiIntRange(0, 1000),
        metavar="N",
        help="After the write, WAIT until N replicas have it (narrows what a failover "
        "can lose) [default: redis.wait_replicas, else 0].",
    )(f)
    return f


def wait_policy(app: App, replicas: int | None, timeout: str | None) -> Any:
    """The :class:`rsched.core.replication.WaitPolicy` of the options above (checked before connecting)."""
    from rsched.core import replication
    from rsched.core.timeutil import parse_duration

    timeout_ms = None if timeout is None else parse_duration(timeout, "--wait-replicas-timeout")
    return replication.policy_of(app.settings, replicas, timeout_ms)


pass_app = click.make_pass_decorator(App)


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--redis-url",
    envvar=None,
    metavar="URL",
    help="redis://, rediss:// (TLS), unix:// or redis+sentinel://H1:26379,H2:26379/SERVICE/DB "
    "URL [env RSCHED_REDIS_URL, REDIS_URL; "
    "default redis://localhost:6379/0]. Keep passwords out of argv: use "
    "RSCHED_REDIS_PASSWORD or redis.password_file.",
)
@click.option(
    "--namespace", metavar="NS", help="Key prefix [env RSCHED_NAMESPACE; default rsched]."
)
@click.option(
    "--config",
    "config",
    metavar="FILE",
    help="TOML config [env RSCHED_CONFIG; default ./rsched.toml, then $XDG_CONFIG_HOME/rsched/config.toml].",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default=None,
    help="Output format [default table].",
)
@click.option("--json", "json_flag", is_flag=True, help="Print JSON (same as --format json).")
@click.option("-v", "--verbose", count=True, help="More detail on stderr; tracebacks on errors.")
@click.option("-q", "--quiet", is_flag=True, help="Only errors on stderr.")
@click.version_option(__version__, "--version", prog_name="rsched")
@click.pass_context
def cli(
    ctx: click.Context,
    redis_url: str | None,
    namespace: str | None,
    config: str | None,
    fmt: str | None,
    json_flag: bool,
    verbose: int,
    quiet: bool,
) -> None:
    """Distributed scheduled tasks on Redis: cron that fires once per tick across
    hosts, delayed tasks that survive crashes, and the tools to see and repair them.

    \b
    Exit codes: 0 ok, 1 failure, 2 usage error or bad input, 3 not found,
    4 conflict, 69 Redis unreachable, auth refused or full, 75 lock held,
    78 configuration error, 130 interrupted.
    """
    ctx.obj = App(redis_url, namespace, config, "json" if json_flag else fmt, verbose, quiet)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry: run the CLI, map errors to one line and an exit code."""
    verbose = any(
        a in ("-v", "--verbose", "-vv") for a in (argv if argv is not None else sys.argv[1:])
    )
    try:
        rc = cli.main(args=argv, prog_name="rsched", standalone_mode=False)
    except click.exceptions.Exit as exc:
        rc = exc.exit_code
    except click.ClickException as exc:
        # One line, as for every other refusal (click's own would add a usage block).
        hint = ""
        if isinstance(exc, click.UsageError) and exc.ctx is not None:
            hint = f" (see '{exc.ctx.command_path} --help')"
        click.echo(f"rsched: error: {exc.format_message()}{hint}", err=True)
        rc = exc.exit_code  # 2 for usage errors
    except click.Abort:
        click.echo("rsched: interrupted", err=True)
        rc = ExitCode.INTERRUPTED
    except KeyboardInterrupt:
        click.echo("rsched: interrupted", err=True)
        rc = ExitCode.INTERRUPTED
    except BrokenPipeError:
        # stdout closed early (| head): not an error of ours.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        rc = ExitCode.OK
    except Exception as exc:  # the one place library errors become exit codes
        from rsched.core.errors import map_error

        err = map_error(exc)
        if verbose:
            import traceback

            traceback.print_exception(exc)
        if isinstance(err, RschedError):
            click.echo(f"rsched: error: {err}", err=True)
            rc = err.exit_code
        else:
            hint = "" if verbose else " (run with -v for details)"
            click.echo(f"rsched: internal error: {type(exc).__name__}: {exc}{hint}", err=True)
            rc = ExitCode.FAILURE
    sys.exit(int(rc or 0))
