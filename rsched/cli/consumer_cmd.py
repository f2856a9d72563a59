"""`rsched run consumer`: parse and validate, then hand over to rsched.consumer.loop."""

from __future__ import annotations

import shutil
from typing import Any

import click

from rsched.cli.loop_opts import check_metrics_port, loop_options, start_loop
from rsched.cli.main import App, pass_app
from rsched.core.errors import BadInput, ConfigError, ExitCode


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
    from rsched.consumer.loop import (
        CommandHandler,
        HandlerTable,
        _check_pattern,
        load_callable,
        make_handler,
    )

    table: dict[str, Any] = {}
    for t, spec in config_handlers.items():
        try:
            _check_pattern(t, f"handlers.{t}")
            table[t] = make_handler(spec, f"handlers.{t}", id_arg)
        except BadInput as exc:
            raise ConfigError(f"config: {exc}") from None
    for t, cmd in _pairs(handler, "--handler", "TYPE=COMMAND (like order.close=./close-order)"):
        _check_pattern(t, "--handler")
        h = make_handler(cmd, f"--handler {t}", id_arg)
        if isinstance(h, CommandHandler) and shutil.which(h.argv[0]) is None:
            raise BadInput(
                f"--handler {t}",
                f"{h.argv[0]!r} is not an executable file here or on PATH",
            )
        table[t] = h
    for t, spec in _pairs(
        call, "--call", "TYPE=MODULE:FUNCTION (like order.close=shop.tasks:close)"
    ):
        _check_pattern(t, "--call")
        table[t] = load_callable(spec, f"--call {t}")
    return HandlerTable(table)


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
    "--timeout",
    metavar="DUR",
    help="Kill a command handler's process group after DUR [config; default none].",
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
    from rsched.consumer.loop import Consumer, _from_config, _ms, _positive_int, queue_options
    from rsched.core import validate

    names = list(queues) or ["default"]
    for q in names:
        validate.queue(q)
    table = build_handlers(app.settings.handlers, handler, call, id_arg)
    if not len(table):
        raise BadInput(
            "--handler",
            "no handlers: give --handler TYPE=COMMAND, --call TYPE=MODULE:FUNCTION "
            "or a [handlers] section in the config file",
        )
    kw: dict[str, Any] = {}
    if concurrency is not None:
        kw["concurrency"] = _positive_int(concurrency, "--concurrency", 1024)
    if partitions is not None:
        from rsched.queue.queues import check_count

        kw["partitions"] = check_count(partitions)
    if max_attempts is not None:
        validate.max_attempts(max_attempts)
        kw["max_attempts"] = int(max_attempts)
    for name, value, flag in (
        ("lease_ms", lease, "--lease"),
        ("backoff_ms", backoff, "--backoff"),
        ("backoff_max_ms", backoff_max, "--backoff-max"),
        ("timeout_ms", timeout, "--timeout"),
        ("grace_ms", grace, "--grace"),
    ):
        if value is not None:
            kw[name] = _ms(value, flag)
    opt_kw = {k: v for k, v in kw.items() if k not in ("concurrency", "grace_ms", "partitions")}
    for q in names:
        queue_options(app.settings, q, **opt_kw)
    _from_config(app.settings, names[0], "concurrency", _positive_int)
    _from_config(app.settings, names[0], "grace", _ms)
    check_metrics_port(metrics_port)
    # Everything is checked; only now touch Redis.
    start_loop(app, metrics_port)
    c = Consumer(
        app.rs,
        names,
        table,
        burst=burst,
        verbose=app.verbose,
        quiet=app.quiet,
        log=app.log,
        **kw,
    )
    c.run()
    if c.interrupted:  # Ctrl-C: 130, as the exit-code table says (SIGTERM: a clean stop, 0)
        raise SystemExit(int(ExitCode.INTERRUPTED))
