"""`rsched check`: exit 0 with nothing to say, 1 with one line per problem."""

from __future__ import annotations

import click

from rsched.cli.main import App, output_options, pass_app
from rsched.core.errors import ExitCode


@click.command()
@click.option(
    "--max-lag",
    metavar="DUR",
    help="Also a problem: a queue whose oldest due task waits longer than DUR.",
)
@click.option("--dead", "dead_", is_flag=True, help="Also a problem: a queue holding dead tasks.")
@output_options
@pass_app
def check(app: App, max_lag: str | None, dead_: bool) -> None:
    """Is anything wrong? For probes: Nagios, a Kubernetes liveness probe, a
    crontab `|| mail`.

    Exit 0 and print nothing when all is well; exit 1 with one line per
    problem: cron.failed (a cron's last tick did not run ok), cron.silent (a
    tick passed more than 30 s ago and nothing ran it: the dead-man's switch,
    which needs no runner alive, and records its cron.silent event once per
    silence), cron.no-runner, and with their flags
    queue.lag and queue.dead. Paused crons are not checked. --json: an array
    of {"check", "name", "queue", "message"} (empty when all is well).

    \b
        rsched check --max-lag 5m --dead || mail -s rsched ops@example.com
    """
    from rsched.core.timeutil import parse_duration

    lag = parse_duration(max_lag, "--max-lag") if max_lag is not None else None
    from rsched.cli.render import emit_json
    from rsched.tools.check import notice_silences, run_checks

    problems = run_checks(app.rs, max_lag_ms=lag, dead=dead_)
    if any(p.check == "cron.silent" for p in problems):
        notice_silences(app.rs)  # the dead-man's switch's event, once per silence
    if app.json:
        emit_json([p.to_json() for p in problems])
    else:
        from rsched.core.text import printable

        for p in problems:
            click.echo(printable(p.line()))
    if problems:
        raise click.exceptions.Exit(ExitCode.FAILURE)
