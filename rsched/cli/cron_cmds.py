"""CLI for locks and cron: `exec`, `run cron`, `locks`, `unlock`, `crons`,
`pause` / `resume`, `history`. Parses, calls the library, renders."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

import click

from rsched.cli.loop_opts import (
    alert_options,
    alert_sinks,
    check_metrics_port,
    loop_options,
    start_loop,
)
from rsched.cli.main import App, output_options, pass_app, wait_policy, wait_replicas_options
from rsched.cli.params import (
    ASCII_INT,
    AsciiIntRange,
    lock_cb,
    name_cb,
    once_per_cb,
    queue_cb,
    token_cb,
    zone_cb,
)
from rsched.cli.render import emit_json, record, table
from rsched.core.errors import BadInput, ConfigError, ExitCode, RedisFull
from rsched.core.timeutil import human_duration, iso, local_time, show

_CMD = click.argument("command", nargs=-1, required=False, metavar="-- CMD...")

DIALECT_HELP = (
    "How to read the expression: cron (Vixie/cronie, 5 fields), spring (6 fields, "
    "1 = MON, day fields ANDed), quartz (6 or 7 fields, 1 = SUN, a year). "
    "Default: 5 fields cron, 6 spring."
)


def _dialect_option(help_: str = DIALECT_HELP) -> Any:
    return click.option(
        "--dialect", type=click.Choice(["cron", "spring", "quartz"]), default=None, help=help_
    )


# --- exec -----------------------------------------------------------------------------
@click.command("exec", context_settings={"ignore_unknown_options": False})
@click.option(
    "--lock",
    "lock",
    required=True,
    metavar="NAME",
    callback=lock_cb,
    help="Lock name (1-128 of A-Z a-z 0-9 _ . -).",
)
@click.option(
    "--ttl",
    default="30s",
    show_default=True,
    metavar="DUR",
    help="Lock lease; the watchdog renews it every TTL/3 while CMD runs.",
)
@click.option(
    "--once-per",
    "once_per",
    metavar="CRON|DUR",
    callback=once_per_cb,
    help="Run at most once per tick of this schedule (the latest tick at or before the server's now).",
)
@click.option(
    "--tz",
    default="UTC",
    show_default=True,
    metavar="ZONE",
    callback=zone_cb,
    help="Time zone of --once-per.",
)
@_dialect_option("How to read --once-per CRON (cron, spring, quartz); default by its field count.")
@click.option(
    "--if-locked",
    "if_locked",
    type=click.Choice(["skip", "wait", "fail"]),
    default="skip",
    show_default=True,
    help="When another host holds the lock: exit 0, wait for it (woken by its release), or exit 75.",
)
@click.option(
    "--wait-timeout",
    "wait_timeout",
    metavar="DUR",
    help="With --if-locked wait: give up (exit 75) after this.",
)
@click.option("--timeout", metavar="DUR", help="Kill CMD's process group after this.")
@click.option(
    "--on-lock-lost",
    "on_lock_lost",
    type=click.Choice(["kill", "continue"]),
    default="kill",
    show_default=True,
    help="When the lease is lost: stop CMD (SIGTERM, then SIGKILL before the lease can have "
    "expired) or let it run.",
)
@wait_replicas_options
@alert_options
@_CMD
@pass_app
@click.pass_context
def exec_cmd(
    ctx: click.Context,
    app: App,
    lock: str,
    ttl: str,
    once_per: str | None,
    tz: str,
    dialect: str | None,
    if_locked: str,
    wait_timeout: str | None,
    timeout: str | None,
    on_lock_lost: str,
    wait_replicas: int | None,
    wait_replicas_timeout: str | None,
    command: tuple[str, ...],
) -> None:
    """Run CMD on at most one host at a time (per tick with --once-per).

    For host crontabs and systemd timers:

    \b
      * * * * * rsched exec --lock backup --once-per '* * * * *' -- ./backup.sh

    CMD's exit status is passed through; when the lock is held (or the tick
    already ran) it exits 0 without running CMD (75 with --if-locked fail).
    CMD sees RSCHED_NAME, RSCHED_FIRE_AT and RSCHED_FENCING_TOKEN. If Redis
    cannot be reached (or is full) when CMD ends, the run's history record is
    kept and written once Redis is back, for up to 60s (a signal stops the
    wait); then exec exits with CMD's status. Its events (run.failed,
    run.lost) go to the [[alerts]] sinks that want them and to --alert-command
    / --alert-url before it exits: one attempt each, bounded by the sink's
    timeout (a failed one stays pending for another process with that sink).
    """
    from rsched.locks.exec import make_exec_spec, run_exec

    if not command:
        raise BadInput(
            "CMD", "give the command to run after --, like: rsched exec --lock NAME -- ./job.sh"
        )
    spec = make_exec_spec(  # every refusal here, before anything connects
        lock,
        list(command),
        ttl=ttl,
        once_per=once_per,
        tz=tz,
        dialect=dialect,
        if_locked=if_locked,
        wait_timeout=wait_timeout,
        timeout=timeout,
        on_lock_lost=on_lock_lost,
    )
    sinks = alert_sinks(app, [f"l:{lock}"])  # checked before anything connects
    pol = wait_policy(app, wait_replicas, wait_replicas_timeout)
    deliverer = None
    if sinks:
        from rsched.tools.events import Deliverer

        # registered before the run: a first-seen sink takes only later events
        deliverer = Deliverer(app.rs, sinks, log=app.info, only=[f"l:{lock}"])
        deliverer.register()
    out = run_exec(app.rs, spec, log=app.debug, wait=pol, warn=app.info)
    if deliverer is not None and out.status == "ran" and out.result != "ok":
        deliverer.drain(deliverer.drain_budget_s())
    if out.status == "ran" and out.note:  # the command could not be started: an error, -q or not
        app.log(f"rsched: error: {out.note}", "error")
    elif out.status == "ran" and out.result not in ("ok", "failed"):
        app.info(f"rsched: {lock}: {out.result} (exit status {out.exit_code})")
    ctx.exit(out.exit_code)


# --- run cron ---------------------------------------------------------------------------
@click.command("cron")
@click.argument("name", required=False)
@click.option(
    "--all", "all_", is_flag=True, help="Run every [cron.NAME] of the config file in this process."
)
@click.option(
    "--schedule",
    metavar="EXPR",
    help="Cron expression: 5 fields (cron), 6 with seconds first ('0 0 2 * * ?'; spring), "
    "7 with a year (--dialect quartz), or @hourly/@daily/...",
)
@click.option(
    "--tz",
    default="UTC",
    show_default=True,
    metavar="ZONE",
    callback=zone_cb,
    help="IANA time zone of the schedule.",
)
@_dialect_option()
@click.option(
    "--ttl",
    default="30s",
    show_default=True,
    metavar="DUR",
    help="Run-lock lease, renewed every TTL/3.",
)
@click.option(
    "--concurrency",
    type=click.Choice(["forbid", "allow", "replace"]),
    default="forbid",
    show_default=True,
    help="A tick while the previous run is active: skip it, run both, or stop the old one.",
)
@click.option(
    "--misfire",
    type=click.Choice(["skip", "run-once"]),
    default="skip",
    show_default=True,
    help="Ticks missed while no runner was alive or Redis was down: record them, or fire the latest once.",
)
@click.option(
    "--starting-deadline",
    "starting_deadline",
    metavar="DUR",
    help="A tick later than this is not started (recorded missed) [default: 5s, and at most "
    "half the gap to the next tick].",
)
@click.option("--timeout", metavar="DUR", help="Kill the job's process group after this.")
@click.option("--jitter", metavar="DUR", help="Delay each start by a random amount up to this.")
@click.option(
    "--shards",
    type=ASCII_INT,
    metavar="N",
    help="N shard items per tick, split among the live runners.",
)
@click.option("--broadcast", is_flag=True, help="Every live runner runs every tick once.")
@click.option(
    "--after",
    "after",
    multiple=True,
    metavar="CRON",
    callback=name_cb("--after"),
    help="Also run once each time CRON finishes ok (repeatable; --schedule is optional then).",
)
@click.option(
    "--on-lock-lost",
    "on_lock_lost",
    type=click.Choice(["kill", "continue"]),
    default="kill",
    show_default=True,
    help="When the run lock is lost: stop the job (SIGKILL before the lease can have expired), "
    "or let it run.",
)
@click.option(
    "--once",
    is_flag=True,
    help="Run the cron once now, here, with every guarantee of a tick (claimed as "
    '`rsched trigger` claims it, with this process as a live runner; cause "manual"), '
    "then exit with the job's status: for a cron with no runner alive.",
)
@wait_replicas_options
@loop_options
@_CMD
@pass_app
def run_cron(
    app: App,
    name: str | None,
    all_: bool,
    schedule: str | None,
    tz: str,
    dialect: str | None,
    ttl: str,
    concurrency: str,
    misfire: str,
    starting_deadline: str | None,
    timeout: str | None,
    jitter: str | None,
    shards: int | None,
    broadcast: bool,
    on_lock_lost: str,
    after: tuple[str, ...],
    once: bool,
    wait_replicas: int | None,
    wait_replicas_timeout: str | None,
    metrics_port: int | None,
    command: tuple[str, ...],
) -> None:
    """Lock-guarded cron runner: each tick fires exactly once across all runners.

    \b
      rsched run cron report.daily --schedule '0 0 2 * * ?' --tz Asia/Shanghai -- ./report
      rsched run cron --all          # every [cron.NAME] of the config file
      rsched run cron report.mail --after report.daily -- ./mail-report

    Start it on as many hosts as you like; jobs see RSCHED_NAME, RSCHED_FIRE_AT,
    RSCHED_FENCING_TOKEN (and RSCHED_SHARD_INDEX / RSCHED_SHARD_TOTAL with --shards).
    Stops cleanly on SIGTERM/SIGINT (running jobs get SIGTERM, then SIGKILL):
    exit 0 after SIGTERM, 130 after SIGINT (Ctrl-C).
    """
    from rsched.cron.runner import run_runners
    from rsched.cron.spec import make_spec, spec_from_config

    pol = wait_policy(app, wait_replicas, wait_replicas_timeout)
    check_metrics_port(metrics_port)
    if once and all_:
        raise BadInput("--once", "runs one cron: give its NAME, not --all")
    if all_:
        if name or schedule or command or dialect or after:
            raise BadInput(
                "--all",
                "runs the [cron.NAME] entries of the config file; give no NAME, --schedule or CMD",
            )
        table_ = app.settings.crons
        if not table_:
            raise ConfigError(
                "run cron --all: the config file has no [cron.NAME] entries"
                + (
                    f" ({app.settings.config_path})"
                    if app.settings.config_path
                    else " (no config file found)"
                )
            )
        specs = [spec_from_config(n, t) for n, t in sorted(table_.items())]
    else:
        if not name:
            raise BadInput("NAME", "give the cron's name (or --all)")
        if not schedule and not after:
            raise BadInput(
                "--schedule", "is required (unless --after), like --schedule '*/5 * * * *'"
            )
        if not command:
            raise BadInput(
                "CMD",
                f"no command after the cron's name {name!r}: give both, like "
                "rsched run cron NAME --schedule EXPR -- CMD...",
            )
        specs = [
            make_spec(
                name,
                schedule,
                list(command),
                tz=tz,
                dialect=dialect,
                ttl=ttl,
                concurrency=concurrency,
                misfire=misfire,
                starting_deadline=starting_deadline,
                timeout=timeout,
                jitter=jitter,
                shards=shards,
                broadcast=broadcast,
                on_lock_lost=on_lock_lost,
                after=after,
            )
        ]
    from rsched.cron.trigger import check_cycles, registered_after

    own = {sp.name: list(sp.after) for sp in specs}
    conf = {
        n: list(t["after"])
        for n, t in (app.settings.crons or {}).items()
        if isinstance(t, dict) and isinstance(t.get("after"), list)
    }
    check_cycles({**conf, **own}, list(own))  # exit 2 before anything connects
    sinks = alert_sinks(app, [f"c:{sp.name}" for sp in specs])
    rs = app.rs  # connects (exit 69 when unreachable at start)
    if any(sp.after for sp in specs):
        seen = registered_after(rs, [a for sp in specs for a in sp.after])
        check_cycles({**seen, **conf, **own}, list(own))
    events = start_loop(app, metrics_port, sinks)
    stop = threading.Event()
    interrupted: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        if signum == signal.SIGINT:
            interrupted.append(signum)
        if not stop.is_set():
            app.info(f"rsched: {signal.Signals(signum).name}: stopping (running jobs get SIGTERM)")
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    from rsched.runtime.loop import replay_early_signal

    replay_early_signal(on_signal)  # one that came while the loop was starting
    for sp in specs:
        when = (
            f"schedule {sp.schedule.expr!r} ({sp.schedule.tz}, {sp.schedule.dialect}), "
            if sp.schedule
            else ""
        )
        app.info(
            f"rsched: cron {sp.name}: {when}"
            + (f"after {', '.join(sp.after)}, " if sp.after else "")
            + f"concurrency {sp.concurrency}"
            + (f", {sp.shards} shards" if sp.shards else "")
            + (", broadcast" if sp.broadcast else "")
        )
    log = app.info if not app.quiet else (lambda _m: None)
    code = 0
    if once:
        code = _run_once(app, rs, specs[0].name, stop, lambda: run_runners(
            rs, specs, stop, log, app.debug, wait=pol
        ))  # fmt: skip
    else:
        run_runners(rs, specs, stop, log, app.debug, wait=pol)
    events.stop(events.drain_budget_s())  # what the last runs recorded, delivered
    if interrupted:  # Ctrl-C: 130, as the exit-code table says (SIGTERM: a clean stop, 0)
        raise SystemExit(int(ExitCode.INTERRUPTED))
    if code:
        raise SystemExit(code)


def _run_once(app: App, rs: Any, name: str, stop: threading.Event, run: Callable[[], Any]) -> int:
    """``run cron NAME --once``: this process's runner (``run``, in a thread) is live,
    then one manual run is asked for and waited for (one of the live runners claims
    it, as for ``rsched trigger --wait``); the job's exit status."""
    import time

    from rsched.cron import trigger as trig
    from rsched.tools import actions

    t = threading.Thread(target=run, name="rsched-cron-once", daemon=True)
    t.start()
    runners = rs.keys.cron(name).runners
    deadline = time.monotonic() + 15
    while not stop.is_set() and rs.redis.zcount(runners, rs.now_ms(), "+inf") == 0:
        if time.monotonic() > deadline or not t.is_alive():
            stop.set()
            t.join(timeout=60)
            raise ConfigError(f"cron {name}: this runner did not register within 15 s")
        stop.wait(0.05)
    try:
        out = {} if stop.is_set() else actions.trigger(rs, name, wait=True)
    finally:
        stop.set()
        t.join(timeout=60)
    if out:
        app.info(
            f"cron {name}: {out.get('result')} (exit code {out.get('exit_code')}), "
            f"token {out.get('token')}"
        )
    return trig.exit_status(out) if out else 0


# --- locks / unlock ------------------------------------------------------------------------
@click.command("locks")
@click.argument("pattern", required=False)
@output_options
@pass_app
def locks(app: App, pattern: str | None) -> None:
    """Held locks (exec / library locks and cron run locks): owner, TTL left, held for, fencing token.

    PATTERN is a glob on the name (`backup*`). Uses SCAN, never KEYS.
    """
    from rsched.locks.admin import list_locks

    rows = list_locks(app.rs, pattern)
    table(
        rows,
        [
            ("NAME", lambda r: r.name),
            ("KIND", lambda r: r.kind),
            ("OWNER", lambda r: r.owner),
            ("TTL", lambda r: human_duration(r.ttl_ms) if r.ttl_ms >= 0 else "none"),
            ("HELD FOR", lambda r: human_duration(r.held_ms) if r.held_ms is not None else None),
            ("TOKEN", lambda r: r.token),
        ],
        app.fmt,
        to_json=lambda r: r.to_json(),
        empty="no locks held",
    )


@click.command("unlock")
@click.argument("name", callback=name_cb())
@click.option(
    "--token",
    metavar="T",
    callback=token_cb,
    help="The fencing token shown by `rsched locks` (safe: fails if it changed).",
)
@click.option("--force", is_flag=True, help="Release whoever holds it.")
@output_options
@pass_app
def unlock(app: App, name: str, token: str | None, force: bool) -> None:
    """Release a lock (or a cron's run lock). Exit 3 if not held, 4 if the token differs.

    With --json: {"name": NAME, "released": true, "token": N} (the released fencing token).
    """
    from rsched.tools import actions

    if token and force:
        raise BadInput("--force", "give either --token or --force, not both")
    obj, note = actions.unlock(app.rs, name, token, force)
    if app.json:
        emit_json(obj)
    else:
        app.info(note)


# --- crons / pause / resume -----------------------------------------------------------------
@click.command("crons")
@output_options
@pass_app
def crons(app: App) -> None:
    """Crons: schedule, time zone, the crons each runs after, next fire, last fire (when,
    result, host), live runners, paused. ``--json`` rows: ``name``, ``schedule``, ``tz``,
    ``dialect``, ``next_fire_at``/``_ms``, ``last_fire_at``/``_ms``, ``last_result``,
    ``last_host``, ``runners``, ``paused``, ``running``, ``after`` (a list; [] unless
    the cron runs ``--after``)."""
    from rsched.cron.admin import list_crons

    rs = app.rs
    rows = list_crons(rs)
    now = rs.now_ms() if rows and app.fmt != "json" else 0
    table(
        rows,
        [
            ("NAME", lambda r: r.name),
            ("SCHEDULE", lambda r: r.schedule),
            ("TZ", lambda r: r.tz),
            ("DIALECT", lambda r: r.dialect),
            ("AFTER", lambda r: ",".join(r.after) or None),
            ("NEXT FIRE", lambda r: show(r.next_fire_ms, now) if r.next_fire_ms else None),
            ("NEXT LOCAL", lambda r: local_time(r.next_fire_ms, r.tz) if r.next_fire_ms else None),
            ("LAST FIRE", lambda r: show(r.last_fire_ms, now) if r.last_fire_ms else None),
            ("RESULT", lambda r: r.last_result),
            ("HOST", lambda r: r.last_host),
            ("RUNNERS", lambda r: r.runners),
            ("PAUSED", lambda r: r.paused),
        ],
        app.fmt,
        to_json=lambda r: r.to_json(),
        empty="no crons registered",
    )


@click.command("next")
@click.argument("what", metavar="EXPR|NAME")
@click.option(
    "--tz", default=None, metavar="ZONE", help="Time zone (default UTC, or the named cron's)."
)
@_dialect_option()
@click.option(
    "-n",
    "count",
    type=int,
    default=10,
    show_default=True,
    metavar="N",
    help="How many ticks (1-1000).",
)
@output_options
@pass_app
def next_cmd(app: App, what: str, tz: str | None, dialect: str | None, count: int) -> None:
    """The next N ticks of a cron expression, or of a known cron, in UTC and local time.

    \b
      rsched next '0 0 2 * * ?' --tz Asia/Shanghai
      rsched next '0 0 12 ? * 2-6' --dialect quartz -n 5
      rsched next report.daily          # a [cron.NAME] of the config file, or a registered cron

    An expression is refused with the same message as run cron's --schedule; a NAME
    that is neither in the config file nor registered exits 3. JSON rows: fire_at,
    fire_ms, local (ISO 8601 with its offset), offset.
    """
    from rsched.tools import actions

    if not 1 <= count <= 1000:
        raise BadInput("-n", f"{count} is not 1-1000 (how many ticks to show)")
    sched = actions.schedule_of(lambda: app.rs, app.settings.crons, what, tz, dialect)
    rows = actions.next_ticks(sched, count)
    if app.fmt != "json" and not app.quiet:
        app.info(f"{sched.expr!r} ({sched.dialect}, {sched.tz})")
    table(
        rows,
        [
            ("FIRE AT (UTC)", lambda r: r["fire_at"]),
            ("LOCAL", lambda r: r["local"]),
            ("OFFSET", lambda r: r["offset"]),
        ],
        app.fmt,
        to_json=lambda r: r,
        empty="no ticks",
    )


def _full(exc: RedisFull, name: str | None, queue: str | None, verb: str) -> RedisFull:
    """A refused pause / resume says that nothing changed."""
    what = f'queue "{queue}"' if queue is not None else f'cron "{name}"'
    return RedisFull(f"{exc}; {what} was not {verb} (run it again once Redis has room)")


def _pause_resume(
    app: App, name: str | None, queue: str | None, pausing: bool, create: bool
) -> None:
    verb = "pause" if pausing else "resume"
    if (name is None) == (queue is None):
        raise BadInput("NAME", f"give a cron NAME or --queue Q to {verb}")
    try:
        _switch(app, name, queue, pausing, create)
    except RedisFull as exc:
        raise _full(exc, name, queue, verb + "d") from exc


def _switch(app: App, name: str | None, queue: str | None, pausing: bool, create: bool) -> None:
    from rsched.tools import actions

    obj, note = actions.switch(app.rs, name, queue, pausing, create)
    if app.json:
        emit_json(obj)
    else:
        app.info(note)


@click.command("pause")
@click.argument("name", required=False, callback=name_cb())
@click.option(
    "--queue", metavar="Q", callback=queue_cb, help="Pause a queue's consumers instead of a cron."
)
@click.option(
    "--create",
    is_flag=True,
    help="Pause a name rsched has never seen (a cron before its first runner starts, "
    "a queue before its first task); without it that exits 3.",
)
@output_options
@pass_app
def pause(app: App, name: str | None, queue: str | None, create: bool) -> None:
    """The emergency switch: a paused cron records its ticks as skipped; a paused queue is not consumed.

    A cron no runner has registered, or a queue no task was added to, exits 3
    (a typo, most likely) and nothing is written, unless --create.
    With --json: {"name": NAME, "paused": true, "known": BOOL} ("queue" instead of
    "name" with --queue; known: whether a runner registered the cron, or the queue existed).
    """
    _pause_resume(app, name, queue, True, create)


@click.command("resume")
@click.argument("name", required=False, callback=name_cb())
@click.option("--queue", metavar="Q", callback=queue_cb, help="Resume a queue instead of a cron.")
@click.option("--create", is_flag=True, help="Accept a name rsched has never seen (else exit 3).")
@output_options
@pass_app
def resume(app: App, name: str | None, queue: str | None, create: bool) -> None:
    """Undo `rsched pause`. A name rsched has never seen exits 3, unless --create.

    With --json: {"name": NAME, "paused": false, "was_paused": BOOL} ("queue" instead
    of "name" with --queue).
    """
    _pause_resume(app, name, queue, False, create)


# --- forget ----------------------------------------------------------------------------------
@click.command("forget")
@click.argument("name", callback=name_cb())
@click.option(
    "--force",
    is_flag=True,
    help="Forget it even while runners are registered live (runners killed less than 30s ago).",
)
@output_options
@pass_app
def forget(app: App, name: str, force: bool) -> None:
    """Remove a retired cron's state: its history, ticks, pause, run lock, registration.

    Exit 3 when rsched has nothing of NAME, 4 while a runner of it is live
    (stop its runners first; --force forgets anyway). Atomic: a runner starting
    at that moment is either refused with the rest or registers afresh.
    With --json: {"name": NAME, "forgotten": true, "keys": N, "live_runners": N}.
    """
    from rsched.cron import admin as cron

    try:
        got = cron.forget(app.rs, name, force=force)
    except RedisFull as exc:
        raise RedisFull(f'{exc}; cron "{name}" was not forgotten') from exc
    if app.json:
        emit_json(got.to_json())
    else:
        app.info(
            f'cron "{name}" forgotten ({got.keys} keys)'
            + (f"; {got.live_runners} live runners were forgotten too" if got.live_runners else "")
        )


# --- trigger ---------------------------------------------------------------------------------
@click.command("trigger")
@click.argument("name", callback=name_cb())
@click.option("--wait", is_flag=True, help="Wait for the run to end and exit with its status.")
@click.option(
    "--timeout",
    metavar="DUR",
    help="With --wait: give up waiting after this (exit 1; the run goes on) [default: no limit].",
)
@output_options
@pass_app
def trigger(app: App, name: str, wait: bool, timeout: str | None) -> None:
    """Run a cron now, through its live runners, exactly once.

    \b
      rsched trigger report.daily
      rsched trigger report.daily --wait --timeout 10m

    One live runner claims the run like a tick at the server's now (pause switch,
    concurrency policy, run lock, fencing token, watchdog, history with cause
    "manual" and triggered_by this host). Exit 0 when a runner took it (without
    --wait), the job's exit status with --wait, 3 when the name is unknown or no
    runner is alive (or none took it within 15s: the request is withdrawn), 4 when
    the cron is paused or (--concurrency forbid) its previous run is still going
    on (or, replace, did not stop in time), 1 when --timeout ran out. A sharded
    cron runs every shard once across its runners, a broadcast one once on every
    live runner; --wait waits for all and exits with the worst status. With
    --json: {"name", "id", "status", "host", "token", "triggered_by"} plus, with
    --wait, "result", "exit_code", "error", "timed_out"; sharded or broadcast:
    "runs" and "missing".
    """
    from rsched.core.timeutil import parse_duration
    from rsched.cron import trigger as trig
    from rsched.tools import actions

    if timeout is not None and not wait:
        raise BadInput("--timeout", "is how long --wait waits: give --wait too")
    timeout_ms = parse_duration(timeout, "--timeout") if timeout is not None else None

    def taken(out: dict[str, Any]) -> None:
        runs = out.get("runs")
        if runs is not None:  # a sharded or broadcast cron: one run per item
            hosts = ", ".join(sorted({str(r.get("host")) for r in runs}))
            missing = f"; {out['missing']} not taken" if out.get("missing") else ""
            app.info(f"cron {name}: {len(runs)} runs taken by {hosts}{missing}")
            return
        tok = f", token {out['token']}" if out.get("token") is not None else ""
        app.info(f"cron {name}: run taken by {out.get('host')}{tok}")

    out = actions.trigger(app.rs, name, wait=wait, timeout_ms=timeout_ms, on_taken=taken)
    if app.json:
        emit_json(out)
    elif wait:
        if out.get("timed_out"):
            app.info(f"cron {name}: still running after --timeout {timeout}")
        else:
            app.info(
                f"cron {name}: {out.get('result')} (exit code {out.get('exit_code')})"
                + (f": {out['error']}" if out.get("error") and out.get("result") != "ok" else "")
            )
    if wait:
        code = trig.exit_status(out)
        if code:
            raise SystemExit(code)


# --- history ---------------------------------------------------------------------------------
@click.command("history")
@click.argument("name", required=False, callback=name_cb())
@click.option("--queue", metavar="Q", callback=queue_cb, help="Task runs of this queue.")
@click.option("--failed", is_flag=True, help="Only failed, timed-out and lost runs.")
@click.option(
    "--actions",
    is_flag=True,
    help="The audit trail instead: operator actions from the CLI and the web console.",
)
@click.option(
    "--limit",
    type=AsciiIntRange(1, 100_000),
    default=50,
    show_default=True,
    help="Newest N records.",
)
@output_options
@pass_app
def history(
    app: App, name: str | None, queue: str | None, failed: bool, actions: bool, limit: int
) -> None:
    """Execution records of cron fires, `exec` runs and task runs, newest first.

    NAME is a cron or an `exec` lock; no NAME merges every cron, lock and queue.
    RESULT: ok, failed, timeout, lost, skipped, missed, or cancelled (a task
    removed by `rsched cancel` while its handler ran).

    With --actions: the audit trail, one record per operator action (pause,
    resume, trigger, retry, purge, cancel, unlock; from the CLI or `rsched
    web`): AT, ACTION, TARGET, BY (OS user; or bearer, session:HASH, local),
    FROM (host or client address), VIA (cli, web), RESULT (done, refused) and
    the REASON of a refusal. --json: {"id", "at", "at_ms", "action", "target",
    "who": {"via", "user", "addr"}, "result", "reason"}.
    """
    from rsched.tools import history as hist

    if name and queue:
        raise BadInput("--queue", "give NAME or --queue, not both")
    if actions and (name or queue or failed):
        raise BadInput(
            "--actions", "lists every operator action: give no NAME, --queue or --failed"
        )
    if actions:
        _audit(app, limit)
        return
    rs = app.rs
    rows = hist.read(rs, name, queue=queue, failed=failed, limit=limit)
    now = rs.now_ms() if rows and app.fmt != "json" else 0

    def who(r: Any) -> Any:
        d = r.data
        if d.get("kind") == "task":
            return f"{d.get('queue')}/{d.get('type')} {d.get('id')}"
        shard = f" #{d['shard']}" if "shard" in d else ""
        return f"{d.get('name')}{shard}"

    table(
        rows,
        [
            ("KIND", lambda r: r.get("kind")),
            ("NAME", who),
            (
                "FIRE",
                lambda r: show(r.get("fire_ms"), now) if r.get("fire_ms") is not None else None,
            ),
            (
                "STARTED",
                lambda r: (
                    show(r.get("started_ms"), now) if r.get("started_ms") is not None else None
                ),
            ),
            (
                "DURATION",
                lambda r: (
                    human_duration(r.get("duration_ms"))
                    if r.get("duration_ms") is not None
                    else None
                ),
            ),
            ("RESULT", lambda r: r.get("result")),
            ("EXIT", lambda r: r.get("exit_code")),
            ("HOST", lambda r: r.get("host")),
            ("ATTEMPT", lambda r: r.get("attempt")),
            ("TOKEN", lambda r: r.get("token")),
            ("LOG", lambda r: r.has_log),  # `rsched logs NAME --run TOKEN` shows it
            ("ERROR", lambda r: hist.short_error(r.get("error"))),
        ],
        app.fmt,
        to_json=lambda r: r.to_json(),
        empty="no records",
    )


def _audit(app: App, limit: int) -> None:
    from rsched.tools import audit

    rows = audit.read(app.rs, min(limit, audit.AUDIT_MAXLEN))

    def target(r: Any) -> str:
        return " ".join(f"{k}={v}" for k, v in sorted(r.target.items()) if v is not None)

    table(
        rows,
        [
            ("AT", lambda r: iso(r.at_ms)),
            ("ACTION", lambda r: r.action),
            ("TARGET", target),
            ("BY", lambda r: r.who.get("user")),
            ("FROM", lambda r: r.who.get("addr")),
            ("VIA", lambda r: r.who.get("via")),
            ("RESULT", lambda r: r.result),
            ("REASON", lambda r: r.reason),
        ],
        app.fmt,
        to_json=lambda r: r.to_json(),
        empty="no actions recorded",
    )


__all__ = [
    "exec_cmd",
    "run_cron",
    "locks",
    "unlock",
    "crons",
    "pause",
    "resume",
    "forget",
    "history",
    "record",
]
