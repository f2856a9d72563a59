"""`rsched demo`."""

from __future__ import annotations

import click

from rsched.cli import render
from rsched.cli.main import App, output_options, pass_app
from rsched.errors import RschedError


@click.command()
@click.option(
    "--seconds",
    type=click.FloatRange(5, 600),
    default=10.0,
    show_default=True,
    help="How long the cron runners run.",
)
@click.option(
    "--tasks",
    "n_tasks",
    type=click.IntRange(1, 1_000_000),
    default=300,
    show_default=True,
    help="Delayed tasks to add.",
)
@click.option(
    "--use-configured-redis",
    is_flag=True,
    help="Run against --redis-url / RSCHED_REDIS_URL (in a fresh namespace) instead of an embedded server.",
)
@output_options
@pass_app
def demo(app: App, seconds: float, n_tasks: int, use_configured_redis: bool) -> None:
    """Show the whole system working on an embedded server, in under a minute.

    Three cron runners share one every-second schedule, two consumers drain a
    burst of delayed tasks; then the summary: each tick fired once, each task
    ran once, and the firing lateness.
    """
    from rsched import demo as d

    url = app.settings.redis_url if use_configured_redis else None
    say = app.info if app.fmt != "json" else (lambda _m: None)
    summary = d.run(redis_url=url, seconds=seconds, tasks=n_tasks, say=say)
    if app.fmt == "json":
        render.emit_json(summary.to_json())
    else:
        for line in summary.lines():
            click.echo(line)
    if not summary.ok:
        raise RschedError("the demo found a problem (see the summary)")
