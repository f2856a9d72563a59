"""What every `run` loop shares at start: the server checks `doctor` would warn
about, an optional live Prometheus endpoint (`--metrics-port`), and the alert
sinks (``[[alerts]]`` and the quick-use ``--alert-command`` / ``--alert-url``,
:func:`alert_options`) with the thread that delivers their events."""

from __future__ import annotations

from typing import Any

import click

from rsched.cli.main import App
from rsched.cli.params import ASCII_INT
from rsched.core.errors import BadInput


def _set_log_format(ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
    app = ctx.find_object(App)
    if app is not None and value:
        app.log_format = value
    return value


def _set_alerts(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    app = ctx.find_object(App)
    if app is not None:
        if param.name == "alert_url":
            from rsched.tools.events import check_url

            for u in value or ():
                check_url(u, "--alert-url")  # refused before anything connects
        setattr(app, f"_{param.name}", tuple(value or ()))
    return value


def alert_options(f: Any) -> Any:
    """``--alert-command CMD`` / ``--alert-url URL`` (repeatable): every event of the
    loop's own names goes there. Read back by :func:`alert_sinks`."""
    f = click.option(
        "--alert-url",
        "alert_url",
        multiple=True,
        metavar="URL",
        expose_value=False,
        callback=_set_alerts,
        help="POST every event of this loop's names here as JSON (repeatable).",
    )(f)
    f = click.option(
        "--alert-command",
        "alert_command",
        multiple=True,
        metavar="CMD",
        expose_value=False,
        callback=_set_alerts,
        help="Run CMD (split like a handler command, never a shell) with each event of "
        "this loop's names as JSON on stdin (repeatable).",
    )(f)
    return f


def alert_sinks(app: App, sources: Any = ()) -> list[Any]:
    """The sinks of this loop: ``[[alerts]]`` of the config file, then the quick-use
    flags for ``sources`` (tags "c:NAME", "q:QUEUE", "l:NAME"). Checked here,
    before anything connects: a bad one is exit 2."""
    from rsched.tools.events import parse_alerts, quick_sinks

    sinks = parse_alerts(app.settings.file.get("alerts"), app.settings.config_path)
    app._loop_sources = tuple(sources)  # type: ignore[attr-defined]  # watched from the start
    cmds = getattr(app, "_alert_command", ())
    urls = getattr(app, "_alert_url", ())
    return sinks + quick_sinks(cmds, urls, sources)


def start_events(app: App, sinks: Any) -> Any:
    """Start the thread that delivers ``sinks``' events and notices silent crons
    (the dead-man's switch needs any live loop, sinks or not: the loops of a
    namespace take turns, one per interval). Returns it (stop())."""
    from rsched.tools.check import SilenceTurns
    from rsched.tools.events import Deliverer

    own = getattr(app, "_loop_sources", ())
    d = Deliverer(app.rs, sinks, log=app.info, own=own)
    d.every = SilenceTurns(app.rs, d.me, runs_crons=any(t.startswith("c:") for t in own))
    return d.start()


def loop_options(f: Any) -> Any:
    f = alert_options(f)
    f = click.option(
        "--log-format",
        type=click.Choice(["text", "json"]),
        default="text",
        show_default=True,
        expose_value=False,
        callback=_set_log_format,
        help="Log lines on stderr as text, or one JSON object a line for log shippers.",
    )(f)
    f = click.option(
        "--metrics-port",
        type=ASCII_INT,
        metavar="PORT",
        help="Serve the `rsched metrics` exposition live on 127.0.0.1:PORT/metrics.",
    )(f)
    return f


def check_metrics_port(port: int | None) -> None:
    if port is not None and not 1 <= port <= 65535:
        raise BadInput("--metrics-port", f"{port} is not a TCP port (1-65535)")


def start_loop(app: App, metrics_port: int | None, sinks: Any = None) -> Any:
    """Log the startup warnings (eviction, persistence, clock), start the metrics
    server and the events thread (``sinks`` from :func:`alert_sinks`; None: the
    config file's only). Returns the events thread."""
    from rsched.runtime.loop import catch_early_signals

    catch_early_signals()  # a SIGTERM from here on is a clean stop, not a death
    if sinks is None:
        sinks = alert_sinks(app)
    rs = app.rs
    try:
        from rsched.tools.doctor import startup_warnings

        for line in startup_warnings(rs.redis):
            app.info(f"rsched: {line}")
    except Exception as exc:  # noqa: BLE001 - a check that cannot run must not stop the loop
        app.debug(f"rsched: startup checks could not run: {exc}")
    if metrics_port is not None:
        from rsched.tools.metrics import serve

        try:
            serve(rs, metrics_port)
        except OSError as exc:
            raise BadInput(
                "--metrics-port", f"cannot listen on 127.0.0.1:{metrics_port} ({exc.strerror})"
            ) from None
        app.info(f"rsched: metrics on http://127.0.0.1:{metrics_port}/metrics")
    return start_events(app, sinks)
