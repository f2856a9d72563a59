"""`rsched run worker MODULE:ATTR`: an application's tasks and crons in one process."""

from __future__ import annotations

import click

from rsched.cli.loop_opts import alert_sinks, check_metrics_port, loop_options, start_loop
from rsched.cli.main import App, pass_app, wait_policy, wait_replicas_options
from rsched.core.errors import BadInput, ExitCode


@click.command()
@click.argument("app_spec", metavar="MODULE:ATTR")
@click.option(
    "--queue",
    "queues",
    multiple=True,
    metavar="Q",
    help="Run only the tasks of this queue (repeatable; one the app's tasks name) "
    "[default: every queue of the app].",
)
@click.option("--no-crons", "no_crons", is_flag=True, help="Run the app's tasks only, no crons.")
@click.option(
    "--concurrency",
    metavar="N",
    help="Task handlers running at once [config [queues.Q]; default 1].",
)
@click.option(
    "--grace",
    metavar="DUR",
    help="On SIGTERM/SIGINT, time running task handlers get to finish before they are killed "
    "and their tasks released; also the SIGTERM-to-SIGKILL grace of a cancelled task "
    "[config; default 30s].",
)
@click.option(
    "--partitions",
    metavar="N",
    help="The queues are split into N partitions (must match what Redis has stored for them; "
    "see `add --partitions`) [config; default: as stored, else 1].",
)
@wait_replicas_options
@loop_options
@pass_app
def worker(
    app: App,
    app_spec: str,
    queues: tuple[str, ...],
    no_crons: bool,
    concurrency: str | None,
    grace: str | None,
    partitions: str | None,
    wait_replicas: int | None,
    wait_replicas_timeout: str | None,
    metrics_port: int | None,
) -> None:
    """Run an rsched.App's tasks (a consumer of their queues) and its crons (one
    runner each), imported from MODULE:ATTR with the current directory on the
    import path.

    \b
    Examples:
      rsched run worker shop.tasks:app
      rsched run worker shop.tasks:app --concurrency 8 --metrics-port 9108
      rsched run worker shop.tasks:app --queue mail --no-crons --grace 10s

    The connection is the app's (App(url=..., namespace=..., config=...)); the
    global --redis-url, --namespace and --config override it. A Python cron's
    run is a child process (python -m rsched.app.child) with every guarantee of
    `run cron`; a task handler with a timeout is stopped at it (a plain
    function runs in a forked child that is killed, a coroutine is cancelled)
    and recorded timeout; it is stopped too when its lease is lost, when the
    task is cancelled (SIGTERM, which raises SystemExit in it, then SIGKILL
    after the grace) and at the end of the shutdown grace. --wait-replicas
    applies to the crons' writes, as for `run cron`. SIGTERM/SIGINT: stop
    claiming, let running handlers finish within the grace, stop cron jobs;
    exit 0 after SIGTERM, 130 after SIGINT.
    """
    from rsched.app.worker import app_queues, consumer_for, cron_specs, load_app
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
    specs = [] if no_crons else cron_specs(pyapp, app_spec, settings)
    names = app_queues(pyapp, queues) if pyapp.tasks else []
    if queues and not pyapp.tasks:
        raise BadInput("--queue", f"{app_spec!r} declares no @app.task")
    loop_opts = {"grace_ms": grace, "partitions": partitions}
    if names:  # every option checked before anything connects
        consumer_options(settings, names, concurrency=concurrency, **loop_opts)
    if not names and not specs:
        raise BadInput("--no-crons", f"{app_spec!r} has nothing else to run (no @app.task)")
    pol = wait_policy(app, wait_replicas, wait_replicas_timeout)
    check_metrics_port(metrics_port)
    sinks = alert_sinks(app, [f"q:{q}" for q in names] + [f"c:{sp.name}" for sp in specs])
    events = start_loop(app, metrics_port, sinks)
    rs = app.rs
    log = app.info if not app.quiet else (lambda _m: None)
    consumer = (
        consumer_for(
            pyapp,
            rs,
            concurrency,
            log=app.log,
            verbose=app.verbose,
            quiet=app.quiet,
            queues=names,
            **loop_opts,
        )
        if names
        else None
    )
    for sp in specs:
        if sp.schedule is not None:
            app.info(f"rsched: cron {sp.name}: schedule {sp.schedule.expr!r} ({sp.schedule.tz})")
    from rsched.app.worker import run_worker

    interrupted = run_worker(pyapp, rs, specs, consumer, log, app.debug, pol)
    events.stop(events.drain_budget_s())  # what the last runs recorded, delivered
    pyapp.close()
    if interrupted:
        raise SystemExit(int(ExitCode.INTERRUPTED))
