"""``rsched run worker MODULE:ATTR``: every task and cron of one :class:`App`
in one process.

One :class:`~rsched.consumer.loop.Consumer` claims from every queue the app's
tasks name (each queue's lease: the longest ``lease`` of its tasks, else the
queue's option), with a handler per task type (its ``timeout``:
:mod:`rsched.runtime.pycall`); one :class:`~rsched.cron.runner.CronRunner`
thread per cron, whose job is the child ``python -m rsched.app.child`` (see
:mod:`rsched.app.app`). SIGTERM/SIGINT: the consumer stops claiming and gives
running handlers its grace; the cron runners stop their jobs (SIGTERM, SIGKILL
after the grace) and record them; then the process exits. The consumer drives
systemd's notify protocol (``READY=1``, ``WATCHDOG=1``, ``STOPPING=1``); an
app of crons only, the cron loop does.
"""

from __future__ import annotations

import dataclasses
import pickle
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rsched.core import errors

if TYPE_CHECKING:  # pragma: no cover
    from rsched.app.app import App
    from rsched.consumer.loop import Consumer
    from rsched.context import Context
    from rsched.core.replication import WaitPolicy
    from rsched.cron.spec import CronSpec


def load_app(spec: str) -> App:
    from rsched.app.app import App
    from rsched.consumer.handlers import load_object

    app = load_object(spec, "MODULE:ATTR")
    if not isinstance(app, App):
        raise errors.BadInput("MODULE:ATTR", f"{spec!r} is {type(app).__name__}, not an rsched.App")
    if not app.tasks and not app.crons:
        raise errors.BadInput("MODULE:ATTR", f"{spec!r} declares no @app.task and no @app.cron")
    return app


def cron_specs(app: App, spec: str, settings: Any) -> list[CronSpec]:
    """The runners' specs: each cron's job is its child (settings on its stdin)."""
    stdin = pickle.dumps(settings)
    return [
        d.spec([sys.executable, "-m", "rsched.app.child", spec, d.name], stdin=stdin)
        for d in app.crons.values()
    ]


def app_queues(app: App, only: Sequence[str] = ()) -> list[str]:
    """The queues the app's tasks name, in order; ``only`` (``--queue``, checked):
    those of them, a queue no task names refused."""
    queues = list(dict.fromkeys(t.queue for t in app.tasks.values()))
    if not only:
        return queues
    from rsched.consumer.options import check_queues

    picked = check_queues(list(only))
    for q in picked:
        if q not in queues:
            raise errors.BadInput(
                "--queue",
                f"no @app.task of the app uses queue {q!r} (its queues: "
                f"{', '.join(queues) or 'none'})",
            )
    return picked


def consumer_for(
    app: App,
    rs: Context,
    concurrency: Any = None,
    log: Callable[[str], None] | None = None,
    verbose: int = 0,
    quiet: bool = False,
    queues: Sequence[str] = (),
    **options: Any,
) -> Consumer | None:
    """The consumer of the app's tasks (None: the app has none); ``queues``: only
    the tasks of these; ``options``: more of :func:`consumer_options`' (``grace_ms``,
    ``partitions``)."""
    if not app.tasks:
        return None
    from rsched.consumer.handlers import PythonHandler
    from rsched.consumer.loop import Consumer
    from rsched.consumer.options import consumer_options

    names = app_queues(app, queues)
    opts = consumer_options(rs.settings, names, concurrency=concurrency, **options)
    per = dict(opts.per_queue)
    for q in names:
        leases = [t.lease_ms for t in app.tasks.values() if t.queue == q and t.lease_ms]
        if leases:
            per[q] = dataclasses.replace(per[q], lease_ms=max(leases))
        # @app.task(rate_limit=...): the type's limit, unless the config file gives one
        given = {t[0] for t in per[q].type_rate_limits}
        coded = [
            (t.type, *t.rate_limit)
            for t in app.tasks.values()
            if t.queue == q and t.rate_limit and t.type not in given
        ]
        if coded:
            merged = sorted([*per[q].type_rate_limits, *coded])
            per[q] = dataclasses.replace(per[q], type_rate_limits=tuple(merged))
    opts = dataclasses.replace(opts, per_queue=per)
    table = {
        t.type: PythonHandler(t.fn, f"{t.fn.__module__}:{t.fn.__qualname__}", t.timeout_ms)
        for t in app.tasks.values()
        if t.queue in names
    }
    return Consumer(
        rs,
        handlers=table,
        options=opts,
        log=log,
        verbose=verbose,
        quiet=quiet,
        install_signals=False,
    )


def run_worker(
    app: App,
    rs: Context,
    specs: list[CronSpec],
    consumer: Consumer | None,
    log: Callable[[str], None],
    debug: Callable[[str], None] | None = None,
    wait: WaitPolicy | None = None,
) -> bool:
    """Run until SIGTERM/SIGINT; True when stopped by SIGINT (Ctrl-C)."""
    from rsched.cron.runner import CronRunner, run_runners

    stop = threading.Event()
    interrupted: list[str] = []

    def on_signal(signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if signum == signal.SIGINT:
            interrupted.append(name)
        if consumer is not None:
            consumer.stop(name)
        stop.set()  # the cron runners stop their jobs now, not after the consumer's grace

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    from rsched.runtime.loop import replay_early_signal

    replay_early_signal(on_signal)  # one that came while the worker was starting
    try:
        if consumer is None:
            run_runners(rs, specs, stop, log, debug, wait)
            return bool(interrupted)
        runners = [CronRunner(rs, sp, stop, log, debug, wait) for sp in specs]
        threads = [
            threading.Thread(target=r.run, name=f"rsched-cron-{r.spec.name}", daemon=True)
            for r in runners
        ]
        for t in threads:
            t.start()
        try:
            consumer.run()
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=60)
        return bool(interrupted) or consumer.interrupted
    finally:
        for s, h in old.items():
            signal.signal(s, h)
