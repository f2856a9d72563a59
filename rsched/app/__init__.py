"""Python applications: :class:`App` with ``@app.task``, ``@app.cron`` and
``@app.locked``; ``rsched run worker MODULE:ATTR`` runs them
(:mod:`rsched.app.worker`)."""

from rsched.app.app import App, CronDef, CronRun, TaskDef

__all__ = ["App", "CronRun", "TaskDef", "CronDef"]
