"""`rsched events`: recent events, newest first, with their delivery state."""

from __future__ import annotations

from typing import Any

import click

from rsched.cli.main import App, output_options, pass_app
from rsched.cli.params import ASCII_INT
from rsched.cli.render import dumps, table
from rsched.core.errors import BadInput

COLUMNS = [
    ("AT", lambda e: e["at"]),
    ("EVENT", lambda e: e["event"]),
    ("NAME", lambda e: e["name"] or (f"{e['queue']} {e['type']} {e['id']}")),
    ("FIRE_AT", lambda e: e["fire_at"]),
    ("RESULT", lambda e: e["result"]),
    ("HOST", lambda e: e["host"]),
    ("DELIVERY", lambda e: e["delivery"]),
    ("ATTEMPTS", lambda e: e["attempts"]),
    ("ERROR", lambda e: (e["error"] or "")[:60] or None),
]


@click.command("events")
@click.option(
    "--limit",
    "-n",
    type=ASCII_INT,
    default=50,
    show_default=True,
    metavar="N",
    help="How many of the newest events (1-1000).",
)
@click.option(
    "--follow",
    "-f",
    is_flag=True,
    help="Then print each new event as it is recorded (one JSON object a line with --json).",
)
@output_options
@pass_app
def events(app: App, limit: int, follow: bool) -> None:
    """Recent events (run.failed, run.lost, tick.missed, task.dead, cron.silent,
    run.recovered), newest first, with DELIVERY (pending, delivered or failed:
    the worst over the alert sinks that want the event) and ATTEMPTS.

    Every event is recorded whether or not a sink wants it; a sink is any
    [[alerts]] table of the config file or a loop's --alert-command /
    --alert-url. --json: an array of event objects (SPEC fields) with
    "delivery" and "attempts".

    \b
        rsched events -n 20
        rsched events --follow --json | jq .event
    """
    if not 1 <= limit <= 1000:
        raise BadInput("--limit", f"{limit} is not in 1-1000")
    from rsched.tools.events import follow as follow_events

    if not follow:
        table(app.rs.events(limit=limit), COLUMNS, app.fmt, empty="no events")
        return
    # The streams' positions first, then the recent events: nothing falls between.
    batches = iter(follow_events(app.rs))
    next(batches)
    _show(app, list(reversed(app.rs.events(limit=limit))))
    for new in batches:
        _show(app, new)


def _show(app: App, rows: list[dict[str, Any]]) -> None:
    if app.json:
        for r in rows:
            click.echo(dumps(r))
    elif rows:
        table(rows, COLUMNS, "plain")
