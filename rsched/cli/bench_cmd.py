"""`rsched bench`: measure what rsched gets out of this Redis."""

from __future__ import annotations

import click

from rsched.cli import render
from rsched.cli.main import App, output_options, pass_app
from rsched.cli.params import AsciiIntRange
from rsched.core.config import Settings
from rsched.core.errors import BadInput


def settings_for(app: App, redis_url: str | None) -> Settings:
    """The settings, with a command's own ``--redis-url`` (when given) in place
    of the global one: resolved as the global option would be (env, config file)."""
    if redis_url is None:
        return app.settings
    from rsched.core.config import resolve

    root = click.get_current_context().find_root().params
    return resolve(redis_url, root.get("namespace"), root.get("config"))


@click.command()
@click.option(
    "--embedded",
    is_flag=True,
    help="Start a throwaway server (as `rsched server` would) instead of using --redis-url.",
)
@click.option(
    "--quick",
    is_flag=True,
    help="Smaller runs (about a minute): 100,000 tasks for the scale check, one repetition.",
)
@click.option(
    "--repeat",
    type=AsciiIntRange(1, 20),
    metavar="N",
    help="Repetitions; throughput and lateness figures are their medians [default 3; --quick 1].",
)
@click.option(
    "--only",
    metavar="LIST",
    help="Comma-separated sections: enqueue, drain, lateness, cold, idle, scale, locks, app "
    "[default: all].",
)
@click.option(
    "--partitions",
    metavar="N",
    help="Split the enqueue, drain, lateness, cold and idle queues into N partitions "
    "(on Redis Cluster they spread over the primaries; scale measures one queue) [default 1].",
)
@click.option(
    "--idle-for",
    "idle_for",
    metavar="DUR",
    help="How long the idle section watches an idle consumer and an idle cron runner "
    "(each; an idle loop calls Redis about every 10 s, so a shorter window can read 0) "
    "[default 20s; --quick 12s].",
)
@click.option(
    "--redis-url",
    "bench_url",
    metavar="URL",
    help="The Redis (or any node of a Redis Cluster) to measure; same as the global --redis-url.",
)
@click.option(
    "--namespace",
    "bench_ns",
    metavar="NS",
    help="Run in this namespace; it must be empty and is deleted afterwards "
    "[default: a fresh rsched-bench-XXXXXX].",
)
@output_options
@pass_app
def bench(
    app: App,
    embedded: bool,
    quick: bool,
    repeat: int | None,
    only: str | None,
    partitions: str | None,
    idle_for: str | None,
    bench_url: str | None,
    bench_ns: str | None,
) -> None:
    """How fast is this Redis for rsched? Enqueue, drain, firing lateness,
    cold start, idle cost, and claim latency and memory as the queue grows.

    \b
    Runs against the configured Redis in a throwaway namespace (refused when
    it is not empty; deleted afterwards), or with --embedded against a server
    it starts and stops itself. It starts real `rsched` processes; the full
    run adds 1,000,000 tasks (about 250 MB) for the scale check. Figures are
    medians of --repeat runs; the table shows the target each one is held to.

    On Redis Cluster the server-side figures are read from every primary
    (idle commands and requests summed; per node in --json) and memory per
    task from the primary holding the queue's slot. A figure that cannot be
    measured shows n/a, with the reason (in --json: null, and the reason in
    the section's "unmeasured").

    \b
      rsched bench --embedded
      rsched --redis-url redis://cache:6379/0 bench --quick --json
      rsched bench --redis-url redis+cluster://node1:6379 --quick --partitions 6
    """
    from rsched.core import validate
    from rsched.tools import bench as B

    params = B.Params.quick() if quick else B.Params()
    if repeat is not None:
        params.repeat = repeat
    sections = None
    if only:
        sections = [s.strip() for s in only.split(",") if s.strip()]
        for s in sections:
            if s not in B.SECTIONS:
                raise BadInput("--only", f"{s!r} is not one of {', '.join(B.SECTIONS)}")
    if idle_for is not None:
        from rsched.core.timeutil import parse_duration

        params.idle_s = parse_duration(idle_for, "--idle-for") / 1000.0
    if bench_ns is not None:
        validate.name(bench_ns, "--namespace")
    if partitions is not None:
        from rsched.queue.queues import check_count

        params.partitions = check_count(partitions)
    report = B.run(
        settings_for(app, bench_url),
        embedded=embedded,
        namespace=bench_ns,
        params=params,
        sections=sections,
        say=app.info,
    )
    if app.fmt == "json":
        render.emit_json(report.to_json())
        return
    srv = report.server
    m = report.machine
    where = " (embedded)" if srv["embedded"] else ""
    if srv.get("cluster"):
        where = f" (Redis Cluster, {srv['primaries']} primaries: server figures summed over them)"
    parts = f"; queues in {srv['partitions']} partitions" if srv.get("partitions", 1) > 1 else ""
    app.info(
        f"{srv['flavour']} {srv['version']} at {srv['url']}{where}{parts}; {m['cpus']} CPUs, "
        f"{m['memory_gb']} GB, Python {m['python']}; {report.seconds:.0f}s"
    )
    for path, why in B.unmeasured(report).items():
        app.info(f"{path}: not measured: {why}")
    rows = B.table_rows(report)
    cols: list[render.Column] = [
        ("FIGURE", lambda r: r[0]),
        ("VALUE", lambda r: r[1]),
        ("UNIT", lambda r: r[2]),
        ("TARGET", lambda r: r[3] or None),
        ("MET", lambda r: r[4] or None),
    ]
    render.table(rows, cols, app.fmt, to_json=lambda r: r, empty="nothing measured")
