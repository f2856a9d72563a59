"""The one renderer for everything tabular: aligned columns for people (the layout
of tabulate's "simple" format, which a test holds it to, without its ~40 ms
import), JSON for scripts (data on stdout, diagnostics on stderr).

Text for people never carries a control character: anything read from Redis
(a handler's stderr kept as a task's last error, a lock owner, a host name, a
payload) may hold a terminal escape (``ESC ] 0 ; title BEL`` retitles the
terminal, others move the cursor or rewrite what was printed). Every cell and
value of the table and plain formats goes through :func:`printable`, which
writes C0/C1 control characters and DEL as ``\\xHH`` (``\\n``, ``\\t``,
``\\r`` for the common three) and the bidirectional overrides as ``\\uHHHH``.
JSON keeps the raw text (its encoder escapes control characters itself).
``rsched top`` uses the same function.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import click

from rsched.core.text import printable

Column = tuple[str, Callable[[Any], Any]]


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def emit_json(value: Any) -> None:
    click.echo(dumps(value))


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, dict | list):
        return printable(dumps(v))
    return printable(str(v))


def info(message: str) -> None:
    """A note for people on stderr ("no locks held"): through the command's
    ``App.info``, so ``-q`` silences it and ``--log-format json`` shapes it."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        from rsched.cli.main import App

        app = ctx.find_object(App)
        if app is not None:
            app.info(message)
            return
    click.echo(message, err=True)


def table(
    rows: Sequence[Any],
    columns: Sequence[Column],
    fmt: str,
    *,
    to_json: Callable[[Any], Any] | None = None,
    empty: str | None = None,
) -> None:
    """Print ``rows``: a JSON array (``to_json`` per row), a table, or tab-separated plain text."""
    if fmt == "json":
        emit_json([to_json(r) if to_json else r for r in rows])
        return
    cells = [[_cell(fn(r)) for _, fn in columns] for r in rows]
    if fmt == "plain":
        for c in cells:
            click.echo("\t".join(c))
        return
    if not rows:
        if empty:
            info(empty)
        return
    click.echo(simple_table([h for h, _ in columns], cells))


def text_width(text: str) -> int:
    """Terminal columns of ``text``: East Asian wide and full-width characters take
    two, combining marks none."""
    if text.isascii():
        return len(text)
    import unicodedata

    return sum(
        0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
        for c in text
    )


def simple_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns left-aligned, two spaces apart, each as wide as its widest cell and
    at least its header plus two, a dashed rule under the headers; cells and line
    ends stripped (tabulate's "simple" format, for text)."""
    cells = [[c.strip() for c in row] for row in rows]
    widths = [
        max([text_width(h) + 2] + [text_width(row[i]) for row in cells])
        for i, h in enumerate(headers)
    ]

    def line(row: Sequence[str]) -> str:
        return "  ".join(
            c + " " * (w - text_width(c)) for c, w in zip(row, widths, strict=True)
        ).rstrip()

    return "\n".join([line(headers), "  ".join("-" * w for w in widths), *map(line, cells)])


def record(obj: dict[str, Any], fmt: str, *, rows: Sequence[tuple[str, Any]] | None = None) -> None:
    """Print one object: JSON object, or a two-column key/value table."""
    if fmt == "json":
        emit_json(obj)
        return
    items = rows if rows is not None else list(obj.items())
    if fmt == "plain":
        for k, v in items:
            click.echo(f"{printable(str(k))}\t{_cell(v)}")
        return
    # Two aligned columns.
    # A value of several lines (a stack trace) keeps its lines, each indented under
    # the value column and escaped on its own.
    width = max((len(str(k)) for k, _ in items), default=0)
    for k, v in items:
        text = v if isinstance(v, str) else None
        if text is not None and "\n" in text.strip("\n"):
            first, *rest = text.strip("\n").split("\n")
            click.echo(f"{printable(str(k)):<{width}}  {printable(first)}".rstrip())
            for line in rest:
                click.echo(f"{'':<{width}}  {printable(line)}".rstrip())
        else:
            click.echo(f"{printable(str(k)):<{width}}  {_cell(v)}".rstrip())


def stderr_is_tty() -> bool:
    return sys.stderr.isatty()
