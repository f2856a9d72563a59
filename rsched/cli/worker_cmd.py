"""`rsched run worker MODULE:ATTR`: an application's tasks and crons in one process."""

from __future__ import annotations

import click

from rsched.cli.loop_opts import alert_sinks, check_metrics_port, loop_options, start_loop
from rsched.cli.main import App, pass_app
from rsched.core.errors import ExitCode


@click.command()
@click.argument("app_spec", metavar="MODULE:ATTR")
@click.option(
    "--concurrency",
    metavar="N",
    help="Task handlers running at once [config [queues.Q]; default 1].",
)
@loop_options
@pass_app
def worker(app: App, app_spec: str, concurrency: str | None, metrics_port: int | None) -> None:
    """Run an rsched.App's tasks (a consumer of their queues) and its crons (one
    runner each), imported from MODULE:ATTR with the current directory on the
    import path.

    \b
    Examples:
      rsched run worker shop.tasks:app
      rsched run worker shop.tasks:app --concurrency 8 --metrics-port 9108

    The connection is the app's (App(url=..., namespace=..., config=...)); the
    global --redis-url, --namespace and --config override it. A Python cron's
    run is a child process (python -m rsched.app.child) with every guarantee of
    `run cron`; a task handler with a timeout is stopped at it (a plain
    function runs in a forked child that is killed, a coroutine is cancelled)
    and recorded timeout. SIGTERM/SIGINT: stop claiming, let running handlers
    finish within the grace, stop cron jobs; exit 0 after SIGTERM, 130 after
    SIGINT.
    """
    from rsched.app.worker import consumer_for, cron_specs, load_app
    from rsched.consumer.options import consumer_options
    from rsched.core.config import resolve

    pyapp = load_app(app_spec)
    settings = resolve(
        app._redis_url or pyapp.url,
        app._namespace or pyapp.namespace,
        app._config or pyapp.config,
    )
    app.__dict__["settings"] = settings  # (App.settings is a cached property: the merged one)
    pyapp.configure(settings)
    specs = cron_specs(pyapp, app_spec, settings)
    if pyapp.tasks:  # every option checked before anything connects
        consumer_options(
            settings,
            list(dict.fromkeys(t.queue for t in pyapp.tasks.values())),
            concurrency=concurrency,
        )
    check_metrics_port(metrics_port)
    queues = dict.fromkeys(t.queue for t in pyapp.tasks.values())
    sinks = alert_sinks(app, [f"q:{q}" for q in queues] + [f"c:{sp.name}" for sp in specs])
    events = start_loop(app, metrics_port, sinks)
    rs = app.rs
    log = app.info if not app.quiet else (lambda _m: None)
    consumer = consumer_for(
        pyapp, rs, concurrency, log=app.log, verbose=app.verbose, quiet=app.quiet
    )
    for sp in specs:
        if sp.schedule is not None:
            app.info(f"rsched: cron {sp.name}: schedule {sp.schedule.expr!r} ({sp.schedule.tz})")
    from rsched.app.worker import run_worker

    interrupted = run_worker(pyapp, rs, specs, consumer, log, app.debug)
    events.stop(events.drain_budget_s())  # what the last runs recorded, delivered
    pyapp.close()
    if interrupted:
        raise SystemExit(int(ExitCode.INTERRUPTED))
