"""What every `run` loop shares at start: the server checks `doctor` would warn
about, and an optional live Prometheus endpoint (`--metrics-port`)."""

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


def loop_options(f: Any) -> Any:
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


def start_loop(app: App, metrics_port: int | None) -> None:
    """Log the startup warnings (eviction, persistence, clock) and start the metrics server."""
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
