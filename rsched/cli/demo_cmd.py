"""`rsched demo`."""

from __future__ import annotations

import click

from rsched.cli import render
from rsched.cli.main import App, output_options, pass_app
from rsched.cli.params import AsciiIntRange
from rsched.core.errors import RschedError


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
    type=AsciiIntRange(1, 1_000_000),
    default=300,
    show_default=True,
    help="Delayed tasks to add.",
)
@click.option(
    "--redis-url",
    "demo_url",
    metavar="URL",
    help="Run against this Redis, Sentinel or Redis Cluster (any node, or redis+cluster://) "
    "in a fresh namespace, deleted afterwards, instead of an embedded server. "
    "The global --redis-url does the same.",
)
@click.option(
    "--use-configured-redis",
    is_flag=True,
    help="Run against RSCHED_REDIS_URL / the config file's server (in a fresh namespace, "
    "deleted afterwards) instead of an embedded server.",
)
@click.option(
    "--partitions",
    metavar="N",
    help="Split the demo's task queue into N partitions (on Redis Cluster: spread over "
    "the primaries) [default 1].",
)
@output_options
@pass_app
def demo(
    app: App,
    seconds: float,
    n_tasks: int,
    demo_url: str | None,
    use_configured_redis: bool,
    partitions: str | None,
) -> None:
    """Show the whole system working on an embedded server, in under a minute.

    Three cron runners share one every-second schedule, two consumers drain a
    burst of delayed tasks; then the summary: each tick fired once, each task
    ran once, and the firing lateness.

    \b
    The URL from the environment or the config file is only used with
    --use-configured-redis; one given on the command line always is.
      rsched demo
      rsched demo --redis-url redis://node1:7000 --partitions 3
    """
    from rsched.cli.bench_cmd import settings_for
    from rsched.tools import demo as d

    n_parts = 1
    if partitions is not None:
        from rsched.queue.queues import check_count

        n_parts = check_count(partitions)
    root = click.get_current_context().find_root().params
    settings = None
    if demo_url is not None or root.get("redis_url") is not None or use_configured_redis:
        settings = settings_for(app, demo_url)
    say = app.info if app.fmt != "json" else (lambda _m: None)
    summary = d.run(settings=settings, seconds=seconds, tasks=n_tasks, partitions=n_parts, say=say)
    if app.fmt == "json":
        render.emit_json(summary.to_json())
    else:
        for line in summary.lines():
            click.echo(line)
    if not summary.ok:
        raise RschedError("the demo found a problem (see the summary)")
