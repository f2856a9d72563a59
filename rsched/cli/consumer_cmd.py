"""`rsched run consumer`: parse and validate, then hand over to rsched.consumer.loop."""

from __future__ import annotations

from typing import Any

import click

from rsched.cli.loop_opts import alert_sinks, check_metrics_port, loop_options, start_loop
from rsched.cli.main import App, pass_app
from rsched.core.errors import BadInput, ExitCode


def _pairs(values: tuple[str, ...], flag: str, form: str) -> list[tuple[str, str]]:
    out = []
    for v in values:
        t, sep, rest = v.partition("=")
        if not sep or not t.strip() or not rest.strip():
            raise BadInput(flag, f"{v!r} is not {form}")
        out.append((t.strip(), rest.strip()))
    return out


def build_handlers(
    config_handlers: dict[str, Any],
    handler: tuple[str, ...],
    call: tuple[str, ...],
    id_arg: str | None = None,
) -> Any:
    """Config ``[handlers]`` first, then ``--handler`` / ``--call`` (flags win per TYPE).
    ``id_arg``: for command handlers that do not set their own (``--id-arg``)."""
    from rsched.consumer import handlers as h

    table: dict[str, Any] = h.config_handlers(config_handlers, id_arg)
    for t, cmd in _pairs(handler, "--handler", "TYPE=COMMAND (like order.close=./close-order)"):
        table[t] = h.command_handler(t, cmd, id_arg)
    for t, spec in _pairs(
        call, "--call", "TYPE=MODULE:FUNCTION (like order.close=shop.tasks:close)"
    ):
        table[t] = h.call_handler(t, spec)
    return h.handler_table(table)


@click.command()
@click.option(
    "--queue",
    "queues",
    multiple=True,
    metavar="Q",
    help="Queue to consume (repeatable) [default: default].",
)
@click.option(
    "--handler",
    multiple=True,
    metavar="TYPE=COMMAND",
    help="Run COMMAND for tasks of TYPE (repeatable; `*` catches the rest). Split like a shell "
    "would, never run by one; the task ID is appended (see --id-arg); RSCHED_* env; payload "
    "JSON on stdin.",
)
@click.option(
    "--id-arg",
    "id_arg",
    type=click.Choice(["auto", "plain", "none"]),
    default=None,
    help="How command handlers get the task ID: auto puts -- before an ID that begins with - "
    "(so it is never read as an option), plain passes it as is, none passes no ID argument "
    "(RSCHED_TASK_ID only) [config handlers.TYPE.id_arg; default auto].",
)
@click.option(
    "--call",
    multiple=True,
    metavar="TYPE=MODULE:FUNCTION",
    help="Call a Python function fn(task) for tasks of TYPE (repeatable).",
)
@click.option("--concurrency", metavar="N", help="Handlers running at once [config; default 1].")
@click.option(
    "--lease",
    metavar="DUR",
    help="How long a claimed task stays ours without a heartbeat [config; default 60s].",
)
@click.option(
    "--max-attempts",
    metavar="N",
    help="Attempts for tasks added without their own [config; default 5].",
)
@click.option(
    "--backoff",
    metavar="DUR",
    help="Base retry delay, doubled per attempt, full jitter [config; default 1s].",
)
@click.option("--backoff-max", metavar="DUR", help="Retry delay cap [config; default 10m].")
@click.option(
    "--rate-limit",
    metavar="N/DUR",
    help="At most N claims in any window of DUR across every consumer of the queue, by "
    "the server's clock, like 100/1s [config rate_limit; default none].",
)
@click.option(
    "--type-rate-limit",
    "type_rate_limit",
    metavar="TYPE=N/DUR",
    multiple=True,
    help="At most N claims of tasks of TYPE in any window of DUR across every consumer of "
    "the queue; the other types go on (repeatable) [config type_rate_limits; default none].",
)
@click.option(
    "--timeout",
    metavar="DUR",
    help="Stop a handler after DUR, recorded timeout: a command's process group is killed, "
    "a --call function runs in a forked child that is killed [config; default none].",
)
@click.option(
    "--grace",
    metavar="DUR",
    help="On SIGTERM/SIGINT, time running handlers get to finish before they are killed and "
    "their tasks released [config; default 30s].",
)
@click.option(
    "--partitions",
    metavar="N",
    help="The queues are split into N partitions (must match what Redis has stored for them; "
    "see `add --partitions`) [config; default: as stored, else 1].",
)
@click.option("--burst", is_flag=True, help="Exit 0 once nothing is due and nothing is running.")
@loop_options
@pass_app
def consumer(
    app: App,
    queues: tuple[str, ...],
    handler: tuple[str, ...],
    id_arg: str | None,
    call: tuple[str, ...],
    concurrency: str | None,
    lease: str | None,
    max_attempts: str | None,
    backoff: str | None,
    backoff_max: str | None,
    rate_limit: str | None,
    type_rate_limit: tuple[str, ...],
    timeout: str | None,
    grace: str | None,
    partitions: str | None,
    burst: bool,
    metrics_port: int | None,
) -> None:
    """Consume delayed tasks: claim due tasks, run their handler, ack / retry with
    backoff / dead-letter, heartbeat leases, reap stale ones.

    \b
    Examples:
      rsched run consumer --handler 'order.close=./close-order'
      rsched run consumer --queue mail --call 'mail.send=shop.mail:send' --concurrency 8

    Options left out come from the config file ([queues.Q], [handlers]).
    SIGTERM/SIGINT stop claiming and wait --grace for running handlers; a
    second signal stops at once. Unfinished tasks are released back to due.
    Exit 0 after SIGTERM, 130 after SIGINT (Ctrl-C).
    """
    from rsched.consumer.loop import Consumer
    from rsched.consumer.options import check_queues, consumer_options

    names = check_queues(list(queues) or ["default"])
    table = build_handlers(app.settings.handlers, handler, call, id_arg)
    opts = consumer_options(
        app.settings,
        names,
        concurrency=concurrency,
        partitions=partitions,
        max_attempts=max_attempts,
        lease_ms=lease,
        backoff_ms=backoff,
        backoff_max_ms=backoff_max,
        timeout_ms=timeout,
        grace_ms=grace,
        rate_limit=rate_limit,
        type_rate_limits=type_rate_limit or None,
    )
    check_metrics_port(metrics_port)
    sinks = alert_sinks(app, [f"q:{q}" for q in (queues or ("default",))])
    # Everything is checked; only now touch Redis.
    events = start_loop(app, metrics_port, sinks)
    c = Consumer(
        app.rs,
        handlers=table,
        options=opts,
        burst=burst,
        verbose=app.verbose,
        quiet=app.quiet,
        log=app.log,
    )
    c.run()
    events.stop(events.drain_budget_s())  # what the last runs recorded, delivered
    if c.interrupted:  # Ctrl-C: 130, as the exit-code table says (SIGTERM: a clean stop, 0)
        raise SystemExit(int(ExitCode.INTERRUPTED))
