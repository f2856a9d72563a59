"""Queue commands: add, cancel, list, show, queues, requeue-stale, dead, retry, purge."""

from __future__ import annotations

from typing import IO, Any

import click

from rsched.cli import render
from rsched.cli.main import App, output_options, pass_app, wait_policy, wait_replicas_options
from rsched.cli.params import AsciiIntRange, queue_cb, zone_cb
from rsched.core.errors import BadInput

queue_option = click.option(
    "--queue", "queue", default="default", show_default=True, metavar="Q", help="Queue name."
)


def _progress_text(p: dict[str, Any] | None, now: int) -> str:
    """``40% copying (2s ago)``; ``-`` for none."""
    from rsched.core.timeutil import show

    if not p:
        return "-"
    msg = f" {p['message']}" if p.get("message") else ""
    return f"{p['fraction'] * 100:.0f}%{msg} ({show(p['at_ms'], now)})"


def _task_columns(now: int) -> list[render.Column]:
    from rsched.core.timeutil import show

    return [
        ("TYPE", lambda t: t.type),
        ("ID", lambda t: t.id),
        ("QUEUE", lambda t: t.queue),
        ("STATE", lambda t: t.state),
        ("DUE", lambda t: show(t.due_ms, now)),
        ("ATTEMPTS", lambda t: f"{t.attempts}/{t.max_attempts or 'default'}"),
        ("PROGRESS", lambda t: _progress_text(t.progress, now)[:40] if t.progress else None),
        (
            "LAST ERROR",
            lambda t: (t.last_error or "").splitlines()[0][:60] if t.last_error else None,
        ),
    ]


def _task_record(app: App, task: Any, now: int, extra: dict[str, Any] | None = None) -> None:
    from rsched.core.timeutil import show

    obj = {**(extra or {}), **task.to_json()}
    if app.fmt == "json":
        render.emit_json(obj)
        return
    rows = [
        *(extra or {}).items(),
        ("type", task.type),
        ("id", task.id),
        ("queue", task.queue),
        ("state", task.state),
        ("due", show(task.due_ms, now)),
        ("attempts", f"{task.attempts} of {task.max_attempts or 'the consumer default'}"),
        ("payload", render.dumps(task.payload)),
        ("last error", task.last_error or "-"),
    ]
    if task.priority:
        rows.insert(-2, ("priority", str(task.priority)))
    if task.progress:
        rows.append(("progress", _progress_text(task.progress, now)))
    if task.state == "processing" and task.lease_ms:
        rows.append(("lease ends", show(task.lease_ms, now)))
    if task.state == "dead" and task.lease_ms:
        rows.append(("died", show(task.lease_ms, now)))
    if task.waiting_for:
        rows.insert(
            rows.index(("state", task.state)) + 1, ("waiting for", ", ".join(task.waiting_for))
        )
    render.record(obj, app.fmt, rows=rows)


@click.command()
@click.argument("task_type", metavar="TYPE", required=False)
@click.argument("task_id", metavar="ID", required=False)
@click.option(
    "--in",
    "delay",
    metavar="DUR",
    help="Due after this duration (30s, 30m, 1h30m) by the server's clock.",
)
@click.option(
    "--at", "at", metavar="TIME", help="Due at this ISO 8601 time (2026-12-01T02:00+08:00)."
)
@click.option(
    "--tz",
    metavar="ZONE",
    callback=zone_cb,
    help="IANA zone for an --at time (or --from lines' at) written without an offset.",
)
@queue_option
@click.option("--payload", metavar="JSON", help="Task payload (JSON, at most 1 MiB).")
@click.option(
    "--payload-file",
    type=click.File("rb"),
    metavar="FILE",
    help="Read the payload JSON from FILE (- for stdin).",
)
@click.option(
    "--max-attempts",
    metavar="N",
    help="Attempts before the task is dead-lettered [default: the consumer's].",
)
@click.option(
    "--priority",
    metavar="N",
    help="-1000..1000: among due tasks a higher priority is claimed first; equal "
    "priorities in due-time order [default: 0].",
)
@click.option(
    "--after",
    "after",
    nargs=2,
    multiple=True,
    metavar="TYPE ID",
    help="Wait (state waiting) until this task of the same queue finished ok; repeatable. "
    "If it goes dead or is cancelled, so does this one. Not on a partitioned queue.",
)
@click.option(
    "--if-exists",
    type=click.Choice(["keep", "replace", "error"]),
    default="keep",
    show_default=True,
    help="An existing task: keep it (exit 0), replace (reschedule) it, or error (exit 4).",
)
@click.option(
    "--from",
    "from_file",
    type=click.File("rb"),
    metavar="FILE",
    help="Bulk add from JSON lines (- for stdin): type, id, queue, in|at, payload, max_attempts, "
    "priority, after ([[TYPE, ID], ...]), "
    'with the flags\' rules: {"type": "order.close", "id": "1001", "in": "30m"}.',
)
@click.option(
    "--partitions",
    metavar="N",
    help="The queue is (or becomes, on first use) split into N partitions, spread over a "
    "cluster's primaries; must match what Redis has stored [config; default: as stored, else 1].",
)
@click.option(
    "--retry-for",
    "retry_for",
    metavar="DUR",
    default="30s",
    show_default=True,
    help="With --from: ride out a Redis outage (restart, failover) this long, writing the "
    "batch again (not with --if-exists error); 0 = fail at once.",
)
@wait_replicas_options
@output_options
@pass_app
def add(
    app: App,
    task_type: str | None,
    task_id: str | None,
    delay: str | None,
    at: str | None,
    tz: str | None,
    queue: str,
    payload: str | None,
    payload_file: IO[bytes] | None,
    max_attempts: str | None,
    priority: str | None,
    after: tuple[tuple[str, str], ...],
    if_exists: str,
    from_file: IO[bytes] | None,
    partitions: str | None,
    retry_for: str,
    wait_replicas: int | None,
    wait_replicas_timeout: str | None,
) -> None:
    """Schedule a task: TYPE ID, due now, --in DUR or --at TIME.

    \b
      rsched add --in 30m order.close 1001
      rsched add --at 2026-12-01T02:00+08:00 report.send r-77 --payload '{"to":"ops"}'
      rsched add --from tasks.jsonl

    With --wait-replicas N the command then waits (Redis WAIT) until N replicas
    have the write; if fewer acknowledge it in time, the task stays added, the
    shortfall is reported on stderr and the exit status is 1 (adding it again
    keeps it; if a consumer already ran it, it runs once more).

    --from writes batches of 10,000 lines; a batch that meets a Redis outage is
    written again for up to --retry-for (each retry noted on stderr): re-adding
    a task is idempotent, so tasks of the lost attempt that had been written
    count as kept. If the outage lasts longer the command exits 69, saying how
    many tasks were written; running it again keeps those.
    """
    from rsched.queue import ops as tasks
    from rsched.queue.specs import make_spec

    pol = wait_policy(app, wait_replicas, wait_replicas_timeout)
    n_parts = None
    if partitions is not None:
        from rsched.queue.queues import check_count

        n_parts = check_count(partitions)
    if from_file is not None:
        if task_type or task_id:
            raise BadInput("--from", "give either TYPE ID or --from FILE, not both")
        if after:
            raise BadInput("--after", 'goes with TYPE ID; --from lines take "after"')
        from rsched.core.timeutil import parse_duration

        retry_ms = 0 if retry_for.strip() == "0" else parse_duration(retry_for, "--retry-for")
        _add_from(app, from_file, if_exists, pol, n_parts, retry_ms / 1000, tz)
        return
    if not task_type or not task_id:
        raise BadInput("TYPE ID", "both are required (or use --from FILE)")
    if payload is not None and payload_file is not None:
        raise BadInput("--payload", "give either --payload or --payload-file, not both")
    payload_json: str | bytes | None = payload
    field = "--payload"
    if payload_file is not None:
        payload_json = payload_file.read()
        field = "--payload-file"
    # Everything validated before connecting; the library takes the spec as it is.
    spec = make_spec(
        task_type,
        task_id,
        queue=queue,
        delay=delay,
        at=at,
        tz=tz,
        payload_json=payload_json,
        max_attempts=max_attempts,
        priority=priority,
        after=after,
        fields={"payload": field},
    )
    if spec.after and n_parts is not None and n_parts > 1:
        raise tasks.after_refused(queue, n_parts)
    rs = _oneshot(app)
    res = tasks.add_spec(rs, spec, if_exists=if_exists, partitions=n_parts)
    now = res.now_ms if res.now_ms is not None else rs.now_ms()
    extra: dict[str, Any] = {"status": res.status}
    if pol:
        written = rs.keys.queue(res.stored_queue or queue).tasks
        extra["replicas_acked"] = _wait(rs, pol, [written])
    if res.status == "kept" and app.fmt != "json":
        app.info(
            f"task {task_type} {task_id} already exists in queue {queue}; kept it (--if-exists replace to reschedule)"
        )
    _task_record(app, res.task, now, extra)
    _short(pol, extra.get("replicas_acked"), f"task {task_type} {task_id}")


def _wait(rs: Any, pol: Any, keys: list[str] | None = None) -> int:
    from rsched.core import replication

    return replication.wait(rs.redis, pol, keys)


def _short(pol: Any, acked: int | None, what: str) -> None:
    """Exit 1 (after the output) when fewer replicas than asked acknowledged the write."""
    from rsched.core import replication

    if acked is None:
        return
    msg = pol.shortfall(acked, what)
    if msg:
        raise replication.ReplicasShort(msg, acked, pol.replicas)


def _oneshot(app: App) -> Any:
    """A connection for one add: the small client of rsched.core.resp where it can serve
    (redis-py's import alone would double the command's start-up time)."""
    from rsched.api import Rsched
    from rsched.core.conn import connect_oneshot

    s = app.settings
    return Rsched(connect_oneshot(s), s.namespace, settings=s)


def _add_from(
    app: App,
    fh: IO[bytes],
    if_exists: str,
    pol: Any,
    partitions: int | None = None,
    retry_s: float = 0.0,
    tz: str | None = None,
) -> None:
    from rsched.queue import bulk

    progress = None
    on_batch = None
    if render.stderr_is_tty() and not app.quiet and app.fmt != "json":
        from rich.progress import Progress, SpinnerColumn, TextColumn

        progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), transient=True)
        progress.start()
        bar = progress.add_task("adding tasks", total=None)

        def on_batch(counts: dict[str, int]) -> None:
            assert progress is not None
            progress.update(bar, description=f"added {sum(counts.values())} tasks")

    try:
        # Connect on the first batch: a file whose first lines are bad needs no Redis.

        noted = [0.0]

        def on_retry(exc: BaseException, left_s: float) -> None:
            import time

            now = time.monotonic()
            if now - noted[0] < 10:  # the first retry, then one line per 10 s
                return
            noted[0] = now
            what = str(exc).strip().rstrip(".") or type(exc).__name__
            app.info(f"rsched add: {what}; writing the batch again (for {left_s:.0f}s more)")

        counts = bulk.add_lines(
            lambda: app.rs,
            fh,
            if_exists=if_exists,
            progress=on_batch,
            partitions=partitions,
            retry_s=retry_s,
            on_retry=on_retry,
            tz=tz,
        )
    finally:
        if progress is not None:
            progress.stop()
    acked = None
    if pol and sum(counts.values()):
        # The last batch's connection is the pool's most recently released one.
        acked = _wait(app.rs, pol)
    if app.fmt == "json":
        render.emit_json(counts if acked is None else {**counts, "replicas_acked": acked})
    else:
        click.echo(f"added {counts['added']}, kept {counts['kept']}, replaced {counts['replaced']}")
    _short(pol, acked, f"{sum(counts.values())} tasks")


@click.command()
@click.argument("task_type", metavar="TYPE", required=False)
@click.argument("task_id", metavar="ID", required=False)
@queue_option
@click.option(
    "--all", "all_", is_flag=True, help="Cancel every task of --type (paged on the server)."
)
@click.option("--type", "all_type", metavar="T", help="With --all: the tasks' type (required).")
@click.option(
    "--state",
    type=click.Choice(["scheduled", "due", "processing", "dead", "waiting", "all"]),
    default=None,
    help="With --all: only tasks in this state [default: all].",
)
@click.option("--dry-run", "dry_run", is_flag=True, help="With --all: count, cancel nothing.")
@output_options
@pass_app
def cancel(
    app: App,
    task_type: str | None,
    task_id: str | None,
    queue: str,
    all_: bool,
    all_type: str | None,
    state: str | None,
    dry_run: bool,
) -> None:
    """Remove a task in any state (exit 3 if there is none).

    A processing task's consumer is told at once: it stops the handler (a
    command's process group gets SIGTERM, then SIGKILL after the consumer's
    --grace, at most 10s; a Python handler sees task.cancelled), its result
    does not count, and the run is recorded `cancelled` in the history.

    \b
      rsched cancel --all --type order.close [--queue Q] [--state due] [--dry-run]

    --all cancels every task of one type (every partition of the queue), each as
    one cancel does, read and cancelled 500 at a time on the server (never the
    whole queue at once). With --json: {"cancelled": N} ({"would_cancel": N} with
    --dry-run).
    """
    from rsched.queue import ops as tasks
    from rsched.queue.specs import task_query, task_ref

    if all_:
        if task_type is not None or task_id is not None:
            raise BadInput("--all", "takes no TYPE ID: give the type as --type T")
        if all_type is None:
            raise BadInput("--type", "is required with --all (cancel every task of one type)")
        task_query(queue, state=state or "all", task_type=all_type)  # refusals before connecting
        n = tasks.cancel_all(app.rs, all_type, queue, state=state or "all", dry_run=dry_run)
        key = "would_cancel" if dry_run else "cancelled"
        if app.fmt == "json":
            render.emit_json({key: n})
        else:
            click.echo(
                f"{'would cancel' if dry_run else 'cancelled'} {n} task{'' if n == 1 else 's'} "
                f"of type {all_type} in queue {queue}"
                + (f" in state {state}" if state and state != "all" else "")
            )
        return
    for flag, given in (("--type", all_type), ("--state", state), ("--dry-run", dry_run or None)):
        if given is not None:
            raise BadInput(flag, "goes with --all (one task: rsched cancel TYPE ID)")
    if task_type is None or task_id is None:
        raise BadInput("TYPE", "give the task's TYPE and ID (or --all --type T)")
    from rsched.tools import actions

    obj, note = actions.cancel(app.rs, task_ref(task_type, task_id, queue))
    if app.fmt == "json":
        render.emit_json(obj)
    else:
        click.echo(note)


@click.command("list")
@queue_option
@click.option(
    "--state",
    type=click.Choice(["scheduled", "due", "processing", "dead", "waiting", "all"]),
    default="all",
    show_default=True,
    help="Only tasks in this state.",
)
@click.option("--type", "task_type", metavar="T", help="Only tasks of this type.")
@click.option(
    "--limit",
    type=AsciiIntRange(1, 100_000),
    default=100,
    show_default=True,
    help="At most N tasks.",
)
@output_options
@pass_app
def list_cmd(app: App, queue: str, state: str, task_type: str | None, limit: int) -> None:
    """Tasks of a queue, soonest first (read page by page, never the whole queue)."""
    from rsched.queue import ops as tasks
    from rsched.queue.specs import task_query

    query = task_query(queue, state=state, task_type=task_type, limit=limit)
    rs = app.rs
    rows = tasks.list_query(rs, query)
    render.table(
        rows,
        _task_columns(rs.now_ms()),
        app.fmt,
        to_json=lambda t: t.to_json(),
        empty=f"no tasks in queue {queue}" + ("" if state == "all" else f" in state {state}"),
    )


@click.command()
@click.argument("task_type", metavar="TYPE")
@click.argument("task_id", metavar="ID")
@queue_option
@output_options
@pass_app
def show(app: App, task_type: str, task_id: str, queue: str) -> None:
    """One task: state, due time, attempts, payload, last error (exit 3 if absent)."""
    from rsched.queue import ops as tasks
    from rsched.queue.specs import task_ref

    ref = task_ref(task_type, task_id, queue)
    rs = app.rs
    task = tasks.show_ref(rs, ref)
    _task_record(app, task, rs.now_ms())


@click.command()
@output_options
@pass_app
def queues(app: App) -> None:
    """Per queue: scheduled, due now, processing, stale, dead, lag, next due, live consumers.

    NO HANDLER: due tasks that no live consumer can run (no handler for their
    type; with no live consumer, every due task), with the age of the oldest
    and the types. With --json: unrunnable, unrunnable_lag_ms, unrunnable_types.
    WAITING: tasks waiting for their parents (add --after); --json: waiting.
    RATE: the rate limit its consumers enforce (rate_limit), "(throttled)" while
    no permit is left in its window, then each type's own (type_rate_limits);
    --json: rate_limit, throttled, type_rate_limits, throttled_types.
    """
    from rsched.core.timeutil import human_duration, show
    from rsched.queue import ops as tasks

    rs = _oneshot(app)
    rows = tasks.queue_stats(rs)
    now = rs.now_ms()
    cols: list[render.Column] = [
        ("QUEUE", lambda s: s.queue + (" (paused)" if s.paused else "")),
        ("SCHEDULED", lambda s: s.scheduled),
        ("DUE", lambda s: s.due),
        ("WAITING", lambda s: s.waiting),
        ("PROCESSING", lambda s: s.processing),
        ("STALE", lambda s: s.stale),
        ("DEAD", lambda s: s.dead),
        ("LAG", lambda s: human_duration(s.lag_ms) if s.due else "-"),
        ("NEXT DUE", lambda s: show(s.next_due_ms, now)),
        ("CONSUMERS", lambda s: s.consumers),
        ("NO HANDLER", _unrunnable),
        ("RATE", _rates),
    ]
    render.table(rows, cols, app.fmt, to_json=lambda s: s.to_json(), empty="no queues yet")


def _rates(s: Any) -> str | None:
    """``100/1s (throttled); mail.send 10/1s (throttled)``, or None without limits."""
    parts = []
    if s.rate_limit:
        parts.append(s.rate_limit + (" (throttled)" if s.throttled else ""))
    for t, text in s.type_rate_limits.items():
        parts.append(f"{t} {text}" + (" (throttled)" if t in s.throttled_types else ""))
    return "; ".join(parts) or None


def _unrunnable(s: Any) -> str | None:
    """``3 (5m 2s: report.send)``, or None when every due task has a live consumer."""
    from rsched.core.timeutil import human_duration

    if not s.unrunnable:
        return None
    types = ", ".join(s.unrunnable_types) or "no consumer"
    return f"{s.unrunnable} ({human_duration(s.unrunnable_lag_ms)}: {types})"


@click.command("requeue-stale")
@click.option("--queue", "queue", metavar="Q", help="Only this queue [default: every queue].")
@click.option("--dry-run", is_flag=True, help="Count what would move; change nothing.")
@output_options
@pass_app
def requeue_stale(app: App, queue: str | None, dry_run: bool) -> None:
    """Move tasks whose lease expired back to due (dead after their last attempt).

    Running consumers do this on their own; this is the same operation on
    demand, safe to run from cron at any time.
    """
    from rsched.core import validate
    from rsched.queue import ops as tasks

    if queue is not None:
        validate.queue(queue)
    res = tasks.requeue_stale(app.rs, queue, dry_run=dry_run)
    if app.fmt == "json":
        render.emit_json(res)
    else:
        verb = "would requeue" if dry_run else "requeued"
        click.echo(
            f"{verb} {res['requeued']}, {'would dead-letter' if dry_run else 'dead-lettered'} {res['dead']}"
        )


@click.command()
@click.option(
    "--queue",
    "queue",
    metavar="Q",
    callback=queue_cb,
    help="Only this queue [default: every queue].",
)
@click.option(
    "--limit",
    type=AsciiIntRange(1, 100_000),
    default=100,
    show_default=True,
    help="At most N tasks.",
)
@output_options
@pass_app
def dead(app: App, queue: str | None, limit: int) -> None:
    """Dead-lettered tasks, most recent first, with their last error."""
    from rsched.queue import ops as tasks

    rs = app.rs
    rows = tasks.dead_tasks(rs, queue, limit)
    render.table(
        rows,
        _task_columns(rs.now_ms()),
        app.fmt,
        to_json=lambda t: t.to_json(),
        empty="no dead tasks",
    )


@click.command()
@click.argument("task_type", metavar="TYPE", required=False)
@click.argument("task_id", metavar="ID", required=False)
@click.option(
    "--queue",
    "queue",
    metavar="Q",
    help="Queue of the task [default: default; with --all: every queue].",
)
@click.option("--all", "all_", is_flag=True, help="Retry every dead task.")
@output_options
@pass_app
def retry(
    app: App, task_type: str | None, task_id: str | None, queue: str | None, all_: bool
) -> None:
    """Move a dead task (or --all) back to due, attempts reset."""
    from rsched.tools import actions

    if all_ == bool(task_type or task_id):
        raise BadInput("TYPE ID", "give TYPE ID or --all")
    if not all_ and (not task_type or not task_id):
        raise BadInput("TYPE ID", "both are required (or --all)")
    task = None if all_ else (task_type or "", task_id or "")
    actions.check_retry(queue, task)
    obj, note = actions.retry(app.rs, queue, task)
    if app.fmt == "json":
        render.emit_json(obj)
    else:
        click.echo(note)


@click.command()
@click.option(
    "--dead",
    "dead_",
    is_flag=True,
    help="Delete dead-lettered tasks (required: the only kind purge deletes).",
)
@click.option("--older-than", metavar="DUR", help="Only tasks dead for longer than DUR.")
@click.option("--queue", "queue", metavar="Q", help="Only this queue [default: every queue].")
@output_options
@pass_app
def purge(app: App, dead_: bool, older_than: str | None, queue: str | None) -> None:
    """Delete dead tasks for good."""
    from rsched.core import validate
    from rsched.core.timeutil import parse_duration
    from rsched.tools import actions

    if not dead_:
        raise BadInput("--dead", "purge only deletes dead tasks; say --dead")
    older = parse_duration(older_than, "--older-than") if older_than is not None else None
    if queue is not None:
        validate.queue(queue)
    obj, note = actions.purge_dead(app.rs, queue, older)
    if app.fmt == "json":
        render.emit_json(obj)
    else:
        click.echo(note)
