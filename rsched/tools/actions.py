"""The operator's actions and views whose JSON the CLI and the web console share.

``rsched pause|resume|unlock|next --json`` print exactly what these return, and
``rsched web``'s ``/api/...`` endpoints answer with the same objects: one
function builds each, so the two surfaces cannot drift apart. Each returns the
JSON object and, where the CLI says something to a person, the sentence.

Each action (switch, trigger, unlock, cancel, retry, purge_dead) leaves one
audit record (:mod:`rsched.tools.audit`), done or refused, naming ``by``: the
web console passes its caller; the CLI's default is the OS user at this host.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rsched.core.errors import BadInput, Conflict, NotFound, RschedError
from rsched.tools.audit import Actor, cli_actor, record, recording, refusal

if TYPE_CHECKING:  # pragma: no cover
    from rsched.api import Rsched
    from rsched.queue.model import TaskRef


def switch(
    rs: Rsched,
    name: str | None,
    queue: str | None,
    pausing: bool,
    create: bool,
    by: Actor | None = None,
) -> tuple[dict[str, Any], str]:
    """Pause or resume a cron (``name``) or a queue: ``(json, note)``.

    JSON: ``{"name"|"queue", "paused", "known"}`` when pausing (known: whether a
    runner registered the cron, or the queue existed), ``{..., "was_paused"}``
    when resuming."""
    verb = "pause" if pausing else "resume"
    if queue is not None:
        with recording(rs, f"queue.{verb}", {"queue": queue}, by):
            return _switch(rs, name, queue, pausing, create)
    with recording(rs, f"cron.{verb}", {"cron": name}, by):
        return _switch(rs, name, queue, pausing, create)


def _switch(
    rs: Rsched, name: str | None, queue: str | None, pausing: bool, create: bool
) -> tuple[dict[str, Any], str]:
    obj: dict[str, Any]
    if queue is not None:
        from rsched.queue import ops as tasks

        if pausing:
            known = tasks.pause(rs, queue, create=create)
            obj = {"queue": queue, "paused": True, "known": known}
            note = f'queue "{queue}" paused' + (
                "" if known else " (a new queue: no task was added to it yet)"
            )
        else:
            was = tasks.resume(rs, queue, create=create)
            obj = {"queue": queue, "paused": False, "was_paused": was}
            note = f'queue "{queue}" resumed' if was else f'queue "{queue}" was not paused'
        return obj, note
    from rsched.cron import admin as cron

    assert name is not None
    if pausing:
        known = cron.pause(rs, name, create=create)
        obj = {"name": name, "paused": True, "known": known}
        note = f'cron "{name}" paused: its ticks are recorded as skipped' + (
            "" if known else " (no runner has registered it yet)"
        )
    else:
        was = cron.resume(rs, name, create=create)
        obj = {"name": name, "paused": False, "was_paused": was}
        note = f'cron "{name}" resumed' if was else f'cron "{name}" was not paused'
    return obj, note


def unlock(
    rs: Rsched, name: str, token: str | None, force: bool = False, by: Actor | None = None
) -> tuple[dict[str, Any], str]:
    """Release lock ``name`` (only if its fencing token is ``token``, unless
    ``force``): ``({"name", "released": true, "token": N}, note)``. NotFound
    when it is not held, Conflict when the token differs."""
    target: dict[str, Any] = {"lock": name, "token": token}
    if force:
        target["force"] = True
    with recording(rs, "lock.unlock", target, by):
        return _unlock(rs, name, token, force)


def _unlock(rs: Rsched, name: str, token: str | None, force: bool) -> tuple[dict[str, Any], str]:
    from rsched.locks.admin import unlock as do_unlock

    try:
        tok = do_unlock(rs, name, token, force)
    except NotFound:
        raise NotFound(f'no lock "{name}" is held') from None
    except Conflict as exc:
        text = str(exc)
        text = (
            f'lock "{name}"{text[len("the lock") :]}'
            if text.startswith("the lock ")
            else f'lock "{name}": {text}'
        )
        raise Conflict(text) from None
    return (
        {"name": name, "released": True, "token": tok},
        f'released lock "{name}" (fencing token {tok})',
    )


def schedule_of(
    rs: Callable[[], Rsched],
    config_crons: dict[str, Any],
    what: str,
    tz: str | None,
    dialect: str | None,
) -> Any:
    """The parsed schedule of ``what``: a ``[cron.NAME]`` of the config file, a
    registered cron, or an expression (a single word that is neither: NotFound).
    ``rs`` gives the client only when Redis must be read (an expression needs none)."""
    from rsched.core import cronexpr

    name_like = len(what.split()) == 1 and not what.startswith("@")
    if name_like:
        cfg = config_crons.get(what)
        if isinstance(cfg, dict) and cfg.get("schedule"):
            expr, ztz, zd = cfg["schedule"], cfg.get("tz", "UTC"), cfg.get("dialect")
        else:
            from rsched.core.validate import name as check_name

            check_name(what, "NAME")
            client = rs()
            st = client.redis.hgetall(client.keys.cron(what).state)
            if not st.get("schedule"):
                raise NotFound(
                    f"no cron named {what!r}: not a [cron.{what}] of the config file, and no "
                    "runner registered it (an expression has 5, 6 or 7 fields, or is @daily...)"
                )
            expr, ztz, zd = st["schedule"], st.get("tz") or "UTC", st.get("dialect")
        field = "NAME"
    else:
        expr, ztz, zd, field = what, "UTC", None, "--schedule"
    return cronexpr.parse(expr, tz or ztz, field=field, dialect=dialect or zd, tz_field="--tz")


def next_ticks(sched: Any, count: int, after_ms: int | None = None) -> list[dict[str, Any]]:
    """The next ``count`` ticks of ``sched`` after ``after_ms`` (default: now),
    as ``rsched next --json`` rows: fire_at, fire_ms, local (ISO 8601 with its
    offset), offset."""
    from rsched.core.timeutil import iso, local_parts

    if not 1 <= count <= 1000:
        raise BadInput("-n", f"{count} is not 1-1000 (how many ticks to show)")
    t = int(time.time() * 1000) if after_ms is None else after_ms
    rows = []
    for _ in range(count):
        try:
            t = sched.next_after(t)
        except BadInput:
            break  # a Quartz year list that ends
        local, offset = local_parts(t, sched.tz)
        rows.append({"fire_at": iso(t), "fire_ms": t, "local": local, "offset": offset})
    return rows


def cancel(rs: Rsched, ref: TaskRef, by: Actor | None = None) -> tuple[dict[str, Any], str]:
    """Cancel one task (``ref`` validated by :func:`rsched.queue.specs.task_ref`, before
    anything connects): ``({"type", "id", "queue", "cancelled": true, "was": STATE}, note)``."""
    from rsched.queue import ops as tasks

    task_type, task_id, queue = ref.type, ref.id, ref.queue
    target = {"queue": queue, "type": task_type, "id": task_id}
    with recording(rs, "task.cancel", target, by) as extra:
        was = tasks.cancel_ref(rs, ref)
        extra["was"] = was
    note = "; its handler is being stopped" if was == "processing" else ""
    return (
        {"type": task_type, "id": task_id, "queue": queue, "cancelled": True, "was": was},
        f"cancelled {task_type} {task_id} in queue {queue} (was {was}{note})",
    )


def check_retry(queue: str | None, task: tuple[str, str] | None) -> None:
    """Refuse a bad :func:`retry` before anything connects."""
    from rsched.core import validate

    if queue is not None:
        validate.queue(queue)
    if task is not None:
        validate.task_type(task[0])
        validate.task_id(task[1])


def retry(
    rs: Rsched, queue: str | None, task: tuple[str, str] | None, by: Actor | None = None
) -> tuple[dict[str, Any], str]:
    """Move dead task ``task`` (TYPE, ID), or every dead task of ``queue`` (or of
    every queue) when None, back to due: ``({"retried": N}, note)``. Checked by
    :func:`check_retry` first."""
    from rsched.queue import ops as tasks

    if task is None:
        with recording(rs, "dead.retry", {"queue": queue}, by) as extra:
            n = extra["count"] = tasks.retry_all(rs, queue)
    else:
        target = {"queue": queue or "default", "type": task[0], "id": task[1]}
        with recording(rs, "task.retry", target, by) as extra:
            n = extra["count"] = tasks.retry(rs, queue or "default", [task])
    return {"retried": n}, f"retried {n}"


def purge_dead(
    rs: Rsched, queue: str | None, older_than_ms: int | None = None, by: Actor | None = None
) -> tuple[dict[str, Any], str]:
    """Delete dead tasks (of ``queue``, dead longer than ``older_than_ms``):
    ``({"purged": N}, note)``."""
    from rsched.queue import ops as tasks

    target = {"queue": queue, "older_than_ms": older_than_ms}
    with recording(rs, "dead.purge", target, by) as extra:
        n = extra["count"] = tasks.purge_dead(rs, queue, older_than_ms)
    return {"purged": n}, f"purged {n}"


def trigger(
    rs: Rsched,
    name: str,
    wait: bool = False,
    timeout_ms: int | None = None,
    on_taken: Callable[[dict[str, Any]], None] | None = None,
    by: Actor | None = None,
) -> dict[str, Any]:
    """Run cron ``name`` now (:func:`rsched.cron.trigger.trigger`): what it returns.
    The audit record is written when a runner took the run (before ``wait``
    waits for its end), or when the request was refused."""
    from rsched.cron import trigger as trig

    who = by or cli_actor()
    taken_by: list[dict[str, Any]] = []

    def taken(out: dict[str, Any]) -> None:
        record(rs, "cron.trigger", {"cron": name, "token": out.get("token")}, who)
        taken_by.append(out)
        if on_taken is not None:
            on_taken(out)

    try:
        return trig.trigger(rs, name, wait=wait, timeout_ms=timeout_ms, on_taken=taken)
    except RschedError as exc:
        if not taken_by and refusal(exc):
            record(rs, "cron.trigger", {"cron": name}, who, "refused", str(exc))
        raise
