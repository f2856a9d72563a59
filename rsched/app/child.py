"""``python -m rsched.app.child MODULE:ATTR NAME``: one run of a Python cron.

The cron runner (:mod:`rsched.cron.job`) starts this like the command of
``rsched run cron``: ``RSCHED_NAME``, ``RSCHED_FIRE_AT``,
``RSCHED_FENCING_TOKEN`` (and ``RSCHED_SHARD_*``) in the environment, the
worker's connection settings (pickled :class:`~rsched.core.config.Settings`,
password included: a pipe from our own worker, never argv or the
environment) on stdin. Imports the app (the current directory on the import
path), builds the :class:`~rsched.app.app.CronRun`, calls the function
(``async def``: on a fresh event loop). Exit 0: ``ok``; an exception is
printed (the run log and the history's error) and exits 1: ``failed``.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import pickle
import sys
import traceback
from datetime import datetime

USAGE = "usage: python -m rsched.app.child MODULE:ATTR NAME"


def cron_run(env: dict[str, str]) -> object:
    from rsched.app.app import CronRun

    fire_at = env.get("RSCHED_FIRE_AT", "")
    fire_ms = int(datetime.fromisoformat(fire_at.replace("Z", "+00:00")).timestamp() * 1000)
    idx, total = env.get("RSCHED_SHARD_INDEX"), env.get("RSCHED_SHARD_TOTAL")
    return CronRun(
        name=env.get("RSCHED_NAME", ""),
        fire_at=fire_at,
        fire_ms=fire_ms,
        fencing_token=int(env.get("RSCHED_FENCING_TOKEN", "0")),
        shard_index=int(idx) if idx is not None else None,
        shard_total=int(total) if total is not None else None,
    )


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(USAGE, file=sys.stderr)
        return 2
    from rsched.app.app import App
    from rsched.consumer.handlers import load_object

    app = load_object(argv[1], "MODULE:ATTR")
    if not isinstance(app, App):
        print(f"{argv[1]} is not an rsched.App", file=sys.stderr)
        return 2
    d = app.crons.get(argv[2])
    if d is None:
        print(f"{argv[1]} has no cron {argv[2]!r}", file=sys.stderr)
        return 2
    data = sys.stdin.buffer.read()
    if data:
        app.configure(pickle.loads(data))  # noqa: S301 - our own worker's pipe
    run = cron_run(dict(os.environ))
    try:
        out = d.fn(run)
        if inspect.isawaitable(out):
            asyncio.run(_wait(out))
    except Exception:  # noqa: BLE001 - the run failed: its traceback is the log
        traceback.print_exc()
        return 1
    finally:
        app.close()
    return 0


async def _wait(aw: object) -> None:
    await aw  # type: ignore[misc]


if __name__ == "__main__":  # pragma: no cover - run as a child process
    sys.stdout.flush()
    raise SystemExit(main(sys.argv))
