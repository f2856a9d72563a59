"""`rsched run ...`: the long-running loops."""

from __future__ import annotations

import click

from rsched.cli.main import LazyGroup

RUN_COMMANDS = {
    "consumer": "rsched.cli.consumer_cmd:consumer",
    "cron": "rsched.cli.cron_cmds:run_cron",
    "expired": "rsched.cli.expired_cmd:expired",
    "worker": "rsched.cli.worker_cmd:worker",
}


@click.group(cls=LazyGroup, lazy=RUN_COMMANDS)
def run() -> None:
    """Run a loop: a ZSet consumer, a lock-guarded cron runner, or an app's worker.

    Both stop cleanly on SIGTERM/SIGINT and support systemd Type=notify.
    """
