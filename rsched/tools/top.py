"""`rsched top`: what one refresh of the dashboard reads, and how a frame looks.

:func:`collect` takes a :class:`Snapshot` with a handful of pipelined round
trips (the same library calls as `rsched queues`, `crons`, `locks` and
`history`); :func:`render` turns a snapshot into a rich renderable that fits
``width`` x ``height`` cells (columns ellipsized or dropped, rows per panel
limited with "+N more"). Rendering is pure, so a frame can be tested headless;
the terminal loop lives in :mod:`rsched.cli.top_cmd`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from rich.console import Group, JustifyMethod, RenderableType
from rich.table import Table
from rich.text import Text

from rsched.core import cronexpr, errors
from rsched.core.timeutil import human_duration, local_time, relative
from rsched.queue import queues as partitions

if TYPE_CHECKING:  # pragma: no cover
    from rsched.api import Rsched
    from rsched.cron.admin import CronInfo
    from rsched.locks.admin import LockInfo
    from rsched.queue.model import Task
    from rsched.queue.ops import QueueStats
    from rsched.tools.history import Record

#: Records read for the "latest runs" panel (one XREVRANGE ... COUNT per stream).
RUNS = 20
#: running tasks read per queue that has any (their progress)
RUNNING = 10
#: Rows per panel when the frame has no height (``--once`` into a pipe).
ROWS_UNBOUNDED = 15
#: `locks` SCANs the keyspace: do it at most this often; in between, the locks
#: already seen are re-read by key (a lock taken meanwhile shows up at the next SCAN).
LOCK_SCAN_EVERY_MS = 5_000

_RESULT_STYLE = {
    "ok": "green",
    "failed": "red",
    "timeout": "red",
    "lost": "red",
    "skipped": "yellow",
    "missed": "yellow",
}


@dataclass
class Snapshot:
    """Everything one frame shows, as of ``now_ms`` on the server's clock."""

    now_ms: int
    queues: list[QueueStats] = field(default_factory=list)
    crons: list[CronInfo] = field(default_factory=list)
    locks: list[LockInfo] = field(default_factory=list)
    runs: list[Record] = field(default_factory=list)
    locks_scan_ms: int | None = None  # server time of the last lock SCAN
    fetch_ms: float = 0.0  # how long the refresh took (local clock)
    #: tasks running now (of the queues with any), with their progress
    running: list[Task] = field(default_factory=list)


def latest_runs(rs: Rsched, limit: int = RUNS) -> tuple[list[Record], list[str]]:
    """The newest ``limit`` execution records over every cron, lock and queue
    (one pipeline of ``XREVRANGE key + - COUNT limit``), and the known queues."""
    from rsched.tools import history

    pipe = rs.redis.pipeline(transaction=False)
    pipe.smembers(rs.keys.crons)
    pipe.smembers(rs.keys.locks)
    pipe.smembers(rs.keys.queues)
    crons, locks, queues = pipe.execute()
    keys = [rs.keys.cron(n).history for n in sorted(crons)]
    keys += [rs.keys.lock(n).history for n in sorted(locks)]
    keys += [rs.keys.queue(p).history for q in sorted(queues) for p in partitions.names(rs, q)]
    recs: list[Record] = []
    if keys:
        pipe = rs.redis.pipeline(transaction=False)
        for k in keys:
            pipe.xrevrange(k, max="+", min="-", count=limit)
        for entries in pipe.execute():
            recs.extend(history._parse(eid, fields) for eid, fields in entries)
    recs.sort(key=lambda r: r.sort_key, reverse=True)
    return recs[:limit], sorted(queues)


def _recheck_locks(rs: Rsched, locks: list[LockInfo], now: int) -> list[LockInfo]:
    """Re-read locks found by the last SCAN (one pipeline): drop the released or
    re-acquired ones, refresh TTLs."""
    if not locks:
        return []
    pipe = rs.redis.pipeline(transaction=False)
    for lk in locks:
        key = rs.keys.lock(lk.name).lock if lk.kind == "lock" else rs.keys.cron(lk.name).run_lock
        pipe.hget(key, "token")
        pipe.pttl(key)
    res = pipe.execute()
    out = []
    for i, lk in enumerate(locks):
        token, ttl = res[2 * i], int(res[2 * i + 1])
        if ttl == -2 or token is None or str(token) != str(lk.token):
            continue
        held = now - lk.since_ms if lk.since_ms is not None else None
        out.append(replace(lk, ttl_ms=ttl, held_ms=held))
    return out


def collect(rs: Rsched, previous: Snapshot | None = None, runs: int = RUNS) -> Snapshot:
    """One refresh. Locks are re-SCANned only every :data:`LOCK_SCAN_EVERY_MS`
    (``previous`` supplies them in between; their TTLs are counted down)."""
    from rsched.cron.admin import list_crons
    from rsched.locks.admin import list_locks
    from rsched.queue.ops import list_tasks, queue_stats

    t0 = time.monotonic()
    recs, queue_names = latest_runs(rs, runs)
    qs = queue_stats(rs, queue_names)
    # Only queues with tasks running cost a read: their first RUNNING, with progress.
    running = [
        t
        for q in qs
        if q.processing
        for t in list_tasks(rs, q.queue, state="processing", limit=RUNNING)
    ]
    crons = list_crons(rs)
    now = rs.now_ms()
    if (
        previous is not None
        and previous.locks_scan_ms is not None
        and 0 <= now - previous.locks_scan_ms < LOCK_SCAN_EVERY_MS
    ):
        locks, scanned = _recheck_locks(rs, previous.locks, now), previous.locks_scan_ms
    else:
        locks, scanned = list_locks(rs), now
    return Snapshot(
        now_ms=now,
        queues=qs,
        crons=crons,
        locks=locks,
        runs=recs,
        running=running,
        locks_scan_ms=scanned,
        fetch_ms=(time.monotonic() - t0) * 1000,
    )


# --- rendering ----------------------------------------------------------------------------
def _count(n: int) -> str:
    if n < 100_000:
        return str(n)
    if n < 10_000_000:
        return f"{n // 1000}k"
    return f"{n // 1_000_000}M"


def _ms(ms: int | None) -> str:
    return "-" if ms is None else human_duration(ms)


def _result(value: Any) -> Text:
    if not value:
        return Text("-", style="dim")
    return Text(str(value), style=_RESULT_STYLE.get(str(value), ""))


def _num(n: int, bad: str | None = None) -> Text:
    return Text(_count(n), style=bad if (bad and n) else ("dim" if not n else ""))


@dataclass
class Col:
    """One column: ``flex`` columns (names, hosts) give up width first and are
    ellipsized; columns with a higher ``drop`` are left out first when even
    that is not enough."""

    header: str
    cell: Callable[[Any], Text | str]
    justify: JustifyMethod = "left"
    flex: bool = False
    min_width: int = 6
    drop: int = 0
    min_term: int = 0  # shown only when the frame is at least this wide


def _text(v: Text | str) -> Text:
    """A cell, with any control character read from Redis written as an escape (rich
    drops a few, but lets ESC through to the terminal)."""
    from rsched.core.text import printable

    if isinstance(v, Text):
        plain = v.plain
        return v if plain.isprintable() else Text(printable(plain), style=v.style)
    return Text(printable(v))


def _fit(cols: Sequence[Col], cells: list[list[Text]], width: int) -> list[int | None]:
    """Widths per column (None: left out) so that the row fits ``width`` cells."""
    n = len(cols)
    natural = [
        max([len(cols[i].header)] + [r[i].cell_len for r in cells])
        if cells
        else len(cols[i].header)
        for i in range(n)
    ]
    keep = [i for i in range(n) if width >= cols[i].min_term]

    def need(idx: list[int]) -> int:
        return sum(
            min(natural[i], cols[i].min_width) if cols[i].flex else natural[i] for i in idx
        ) + max(0, len(idx) - 1)

    while need(keep) > width and any(cols[i].drop for i in keep):
        worst = max(keep, key=lambda i: (cols[i].drop, i))
        keep.remove(worst)
    widths: list[int | None] = [None] * n
    fixed = sum(natural[i] for i in keep if not cols[i].flex) + max(0, len(keep) - 1)
    flex = [i for i in keep if cols[i].flex]
    for i in keep:
        if not cols[i].flex:
            widths[i] = natural[i]
    room = max(0, width - fixed)
    # Water-fill the room over the flex columns: short ones keep their natural width.
    pending = sorted(flex, key=lambda i: natural[i])
    while pending:
        share = room // len(pending)
        i = pending.pop(0)
        w = max(1, min(natural[i], share))
        widths[i] = w
        room -= w
    return widths


def _table(title: str, cols: Sequence[Col], rows: Sequence[Any], width: int, more: int) -> Table:
    cells = [[_text(c.cell(r)) for c in cols] for r in rows]
    widths = _fit(cols, cells, width)
    t = Table(
        title=title,
        title_justify="left",
        title_style="bold",
        box=None,
        padding=(0, 1, 0, 0),
        pad_edge=False,
        show_edge=False,
        header_style="bold dim",
        expand=False,
    )
    kept = [i for i, w in enumerate(widths) if w is not None]
    for i in kept:
        c = cols[i]
        t.add_column(
            c.header,
            justify=c.justify,
            width=widths[i],
            no_wrap=True,
            overflow="ellipsis",
        )
    for row in cells:
        t.add_row(*(row[i] for i in kept))
    if more > 0:
        t.add_row(Text(f"+{more} more", style="dim italic"), *([""] * (len(kept) - 1)))
    return t


def _allocate(demands: list[int], avail: int) -> list[int]:
    """Rows per panel: everyone gets a fair share, unused shares go to the others."""
    alloc = [0] * len(demands)
    active = [i for i, d in enumerate(demands) if d > 0]
    while active and avail > 0:
        share = max(1, avail // len(active))
        for i in list(active):
            give = min(share, demands[i] - alloc[i], avail)
            alloc[i] += give
            avail -= give
            if alloc[i] >= demands[i]:
                active.remove(i)
            if avail <= 0:
                break
    return alloc


def _who(r: Record) -> str:
    d = r.data
    if d.get("kind") == "task":
        return f"{d.get('queue')}/{d.get('type')} {d.get('id')}"
    shard = f" #{d['shard']}" if "shard" in d else ""
    return f"{d.get('name')}{shard}"


def _busy_first(queues: Sequence[QueueStats]) -> list[QueueStats]:
    """Queues with work due, running, stale or dead (or paused) first, each group
    by name: when rows must be cut, the idle ones go."""
    return sorted(
        queues,
        key=lambda q: (not (q.due or q.processing or q.stale or q.dead or q.paused), q.queue),
    )


def _next_fire(c: CronInfo, now: int) -> int | None:
    """The cron's next tick as of ``now`` (recomputed locally once the fetched one passed)."""
    nxt = c.next_fire_ms
    if nxt is not None and nxt < now - 999 and c.schedule:
        try:
            return cronexpr.parse(c.schedule, c.tz or "UTC", dialect=c.dialect).next_after(now)
        except errors.BadInput:
            return nxt
    return nxt


def render(
    snap: Snapshot,
    *,
    width: int = 80,
    height: int | None = 24,
    now_ms: int | None = None,
    title: str = "",
    interval_ms: int | None = None,
    banner: str | None = None,
) -> RenderableType:
    """A frame for ``width`` x ``height`` cells (``height=None``: up to
    :data:`ROWS_UNBOUNDED` rows per panel). ``now_ms`` is the server clock at
    render time (countdowns move between refreshes); default ``snap.now_ms``."""
    now = snap.now_ms if now_ms is None else now_ms
    age = max(0, now - snap.now_ms)

    queue_cols = [
        Col("QUEUE", lambda q: q.queue, flex=True),
        Col("SCHED", lambda q: _num(q.scheduled), "right"),
        Col("DUE", lambda q: _num(q.due), "right"),
        Col("PROC", lambda q: _num(q.processing), "right"),
        Col("STALE", lambda q: _num(q.stale, "yellow"), "right"),
        Col("DEAD", lambda q: _num(q.dead, "red"), "right"),
        Col("LAG", lambda q: Text(_ms(q.lag_ms) if q.lag_ms else "-"), "right", drop=2),
        Col(
            "NEXT",
            lambda q: relative(q.next_due_ms, now) if q.next_due_ms else "-",
            "right",
            drop=5,
        ),
        Col("CONS", lambda q: _num(q.consumers), "right", drop=3),
        Col("STATE", lambda q: Text("paused", "yellow") if q.paused else "", drop=4),
    ]
    cron_cols = [
        Col("CRON", lambda c: c.name, flex=True),
        Col("SCHEDULE", lambda c: c.schedule or "-", flex=True, min_width=9, drop=3, min_term=100),
        Col(
            "NEXT",
            lambda c: (
                Text("paused", "yellow")
                if c.paused
                else relative(_next_fire(c, now), now)
                if c.next_fire_ms
                else "-"
            ),
            "right",
        ),
        Col(
            "AT (LOCAL)",
            lambda c: (
                local_time(_next_fire(c, now), c.tz) or "-"
                if c.next_fire_ms and not c.paused
                else "-"
            ),
            min_width=22,
            drop=4,
            min_term=110,
        ),
        Col("LAST", lambda c: relative(c.last_fire_ms, now) if c.last_fire_ms else "-", "right"),
        Col("RESULT", lambda c: _result(c.last_result)),
        Col("HOST", lambda c: c.last_host or "-", flex=True, drop=2),
        Col(
            "RUNNERS",
            lambda c: Text(str(c.runners), style="" if c.runners else "red"),
            "right",
        ),
        Col("STATE", lambda c: "running" if c.running else "", drop=1),
    ]

    def ttl(lk: LockInfo) -> str:
        if lk.ttl_ms < 0:
            return "none"
        return human_duration(max(0, lk.ttl_ms - age))

    def held(lk: LockInfo) -> str:
        if lk.held_ms is None:
            return "-"
        return human_duration(lk.held_ms + age)

    lock_cols = [
        Col("LOCK", lambda lk: lk.name, flex=True),
        Col("KIND", lambda lk: lk.kind, drop=2),
        Col("OWNER", lambda lk: lk.owner, flex=True, min_width=8),
        Col("TTL", ttl, "right"),
        Col("HELD", held, "right", drop=1),
        Col("TOKEN", lambda lk: str(lk.token) if lk.token is not None else "-", "right"),
    ]

    def when(r: Record) -> str:
        for k in ("finished_ms", "started_ms", "fire_ms"):
            v = r.get(k)
            if isinstance(v, int | float):
                return relative(int(v), now)
        return relative(r.sort_key[0], now)

    def error(r: Record) -> str:
        e = r.get("error")
        return str(e).strip().splitlines()[-1] if e and str(e).strip() else ""

    run_cols = [
        Col("WHEN", when, "right"),
        Col("KIND", lambda r: str(r.get("kind") or "-"), drop=3),
        Col("NAME", _who, flex=True, min_width=10),
        Col("RESULT", lambda r: _result(r.get("result"))),
        Col(
            "DUR",
            lambda r: (
                _ms(r.get("duration_ms")) if isinstance(r.get("duration_ms"), int | float) else "-"
            ),
            "right",
        ),
        Col(
            "EXIT",
            lambda r: "-" if r.get("exit_code") is None else str(r.get("exit_code")),
            "right",
            drop=2,
        ),
        Col("HOST", lambda r: str(r.get("host") or "-"), flex=True, drop=1),
        Col("ERROR", error, flex=True, min_width=12, drop=4),
    ]

    def progress(t: Any) -> Text:
        p = t.progress
        if not p:
            return Text("-", style="dim")
        msg = f" {p.get('message')}" if p.get("message") else ""  # (_text escapes it)
        return Text(f"{round(float(p['fraction']) * 100)}%{msg}")

    running_cols = [
        Col("QUEUE", lambda t: t.queue, drop=2),
        Col("TASK", lambda t: f"{t.type} {t.id}", flex=True, min_width=10),
        Col("ATTEMPT", lambda t: str(t.attempts), "right", drop=1),
        Col("PROGRESS", progress, flex=True, min_width=8),
    ]

    panels: list[tuple[str, list[Col], list[Any], bool, str]] = [
        (f"QUEUES ({len(snap.queues)})", queue_cols, _busy_first(snap.queues), True, "no queues"),
        (f"RUNNING ({len(snap.running)})", running_cols, snap.running, True, "no task running"),
        (f"CRONS ({len(snap.crons)})", cron_cols, snap.crons, True, "no crons registered"),
        (f"LOCKS ({len(snap.locks)})", lock_cols, snap.locks, True, "no locks held"),
        ("LATEST RUNS", run_cols, snap.runs, False, "no runs recorded"),
    ]

    # Header line(s).
    from rsched.core.timeutil import iso

    # Header: name and where on the left, the server clock (and keys) on the right;
    # when that does not fit, the clock comes first and the rest is cut.
    left = Text("rsched top", style="bold")
    if title:
        left.append(f"  {title}", style="dim")
    right = Text((iso(now) or "")[11:19] + "Z")
    if interval_ms:
        every = (
            f"{interval_ms // 1000}s"
            if interval_ms % 1000 == 0 and interval_ms < 60_000
            else human_duration(interval_ms)
        )
        right.append(f"  every {every}  q quits", style="dim")
    gap = width - left.cell_len - right.cell_len
    head = Text.assemble(left, " " * gap, right) if gap >= 2 else Text.assemble(right, "  ", left)
    head.no_wrap = True
    head.overflow = "ellipsis"
    parts: list[RenderableType] = [head]
    used = 1
    if banner:
        stale = f"; showing data from {human_duration(age)} ago" if age >= 1000 else ""
        msg = f" {banner}{stale}"
        parts.append(
            Text(msg.ljust(width), style="bold reverse red", no_wrap=True, overflow="ellipsis")
        )
        used += 1

    # Rows per panel: each panel costs a title and a header line (an empty one: its title only).
    overhead = sum(2 if rows else 1 for _, _, rows, _, _ in panels)
    if height is None:
        alloc = [min(len(rows), ROWS_UNBOUNDED) for _, _, rows, _, _ in panels]
    else:
        avail = max(0, height - used - overhead)
        demands = [len(rows) for _, _, rows, _, _ in panels]
        alloc = _allocate(demands, avail)
    for (name, cols, rows, counted, empty), n in zip(panels, alloc, strict=True):
        if not rows:
            t = Text(name.split(" (")[0] + "  ", style="bold")
            t.append(empty, style="dim")
            t.no_wrap = True
            t.overflow = "ellipsis"
            parts.append(t)
            continue
        if n >= len(rows):
            shown, more = list(rows), 0
        elif not counted:  # the latest runs: a log, show what fits
            shown, more = list(rows[:n]), 0
        elif n <= 1:
            shown, more = [], len(rows)
            name = f"{name}  +{len(rows)} more"
        else:
            shown, more = list(rows[: n - 1]), len(rows) - (n - 1)
        if not shown:
            t = Text(name, style="bold", no_wrap=True, overflow="ellipsis")
            parts.append(t)
            continue
        parts.append(_table(name, cols, shown, width, more))
    return Group(*parts)


def snapshot_json(snap: Snapshot) -> dict[str, Any]:
    """The snapshot as the JSON the listings print (for ``top --once --json``)."""
    from rsched.core.timeutil import iso

    return {
        "now": iso(snap.now_ms),
        "now_ms": snap.now_ms,
        "queues": [q.to_json() for q in snap.queues],
        "crons": [c.to_json() for c in snap.crons],
        "locks": [lk.to_json() for lk in snap.locks],
        "runs": [r.to_json() for r in snap.runs],
        "running": [t.to_json() for t in snap.running],
    }


def dumps(snap: Snapshot) -> str:
    return json.dumps(snapshot_json(snap), ensure_ascii=False)
