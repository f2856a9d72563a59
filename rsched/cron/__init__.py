"""`rsched run cron`: a cron job fired once per tick across runners.

- :mod:`rsched.cron.spec`: :class:`CronSpec` and :func:`make_spec` / ``spec_from_config``
  (every option checked into a value before any Redis I/O; the CLI builds it);
- :mod:`rsched.cron.runner`: the tick / claim loop (:class:`CronRunner`, ``run_runners``);
- :mod:`rsched.cron.job`: one run of the job (child process, watchdog, lock loss, record);
- :mod:`rsched.cron.admin`: ``list_crons`` / ``CronInfo``, ``pause`` / ``resume``.
"""
