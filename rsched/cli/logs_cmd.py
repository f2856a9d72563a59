"""`rsched logs`: the kept output (stdout and stderr tails) of command runs.

Thin: parses, calls :mod:`rsched.tools.logs`, renders. Text on a terminal
goes through :func:`rsched.cli.render.printable` line by line (a job's output
may hold terminal escapes); piped, and in JSON, it is the raw text.
"""

from __future__ import annotations

import sys

import click

from rsched.cli.main import App, output_options, pass_app
from rsched.cli.params import queue_cb
from rsched.cli.render import emit_json, printable
from rsched.core.errors import BadInput


def _text(s: str, tty: bool) -> str:
    if not tty:
        return s
    return "\n".join(printable(line) for line in s.split("\n"))


@click.command("logs")
@click.argument("args", nargs=-1, metavar="NAME | TYPE ID")
@click.option("--queue", metavar="Q", callback=queue_cb, help="A task's runs: give TYPE ID.")
@click.option("--run", "token", metavar="TOKEN", help="This run (its token, as `history` shows).")
@click.option("--follow", "-f", is_flag=True, help="Stream the run in progress until it ends.")
@click.option(
    "--all", "every", is_flag=True, help="Every kept run, newest first (default: the latest)."
)
@output_options
@pass_app
def logs(
    app: App, args: tuple[str, ...], queue: str | None, token: str | None, follow: bool, every: bool
) -> None:
    """The output (stdout and stderr tails, `[logs] max_bytes` each) of the
    latest run of cron or `exec` lock NAME, or of task TYPE ID with --queue.

    --follow prints what the run in progress wrote so far, then streams it, and
    exits when it ends (from any host). Exit 3 when there is no such run.
    """
    from rsched.core import validate
    from rsched.tools import logs as tl

    task: tuple[str, str] | None = None
    name: str | None = None
    if queue is not None:
        if len(args) != 2:
            raise BadInput("TYPE ID", "--queue Q takes the task's TYPE and ID")
        validate.task_type(args[0])
        validate.task_id(args[1])
        task = (args[0], args[1])
    else:
        if len(args) != 1:
            raise BadInput("NAME", "give one cron or lock NAME (or --queue Q TYPE ID)")
        validate.name(args[0], "NAME")
        name = args[0]
    rs = app.rs
    tty = sys.stdout.isatty()
    if follow:
        found = tl.running(rs, name, queue=queue, task=task, token=token)
        if found is not None:
            keys, tok = found

            def write(stream: str, data: str) -> None:
                out = sys.stdout if stream == "stdout" else sys.stderr
                out.write(_text(data, out.isatty()))
                out.flush()

            def alive() -> bool:
                now = tl.running(rs, name, queue=queue, task=task, token=tok)
                return now is not None and now[1] == tok

            tl.follow(rs, keys, tok, write, alive)
            return
    rows = tl.runs(rs, name, queue=queue, task=task, token=token, every=every)
    if app.fmt == "json":
        emit_json(rows)
        return
    for r in rows:
        who = r["name"] if r["name"] else f"{r['queue']}/{r['type']} {r['id']}"
        head = f"== {who} run {r['token']}: {r['result']}, fired {r['fire_at']}, finished {r['finished_at']}"
        click.echo(_text(head + (" (truncated)" if r["truncated"] else "") + " ==", tty))
        for stream in ("stdout", "stderr"):
            if r[stream]:
                click.echo(f"-- {stream} --")
                text = _text(r[stream], tty)
                click.echo(text, nl=not text.endswith("\n"))
