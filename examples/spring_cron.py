"""A Spring-style scheduled job, declared in code: ``@app.cron`` is
``@Scheduled(cron = "0 0 2 * * ?", zone = "Asia/Shanghai")``, with rsched's
guarantees (once per tick however many workers run, a fencing token per run,
history and run logs in Redis).

Run it (from this directory; the URL and namespace come from RSCHED_REDIS_URL
/ RSCHED_NAMESPACE or rsched.toml, as for the CLI):

    rsched run worker spring_cron:app

Start it on as many hosts as you like: each tick runs once. ``REPORT_CRON``
overrides the schedule (``"*/5 * * * * ?"`` to watch it fire every 5 s).
"""

import os

from rsched import App

app = App()


@app.cron(
    os.environ.get("REPORT_CRON", "0 0 2 * * ?"),  # Quartz form: sec min hour day month weekday
    name="report.daily",
    tz="Asia/Shanghai",
    concurrency="forbid",  # a run still going makes the next tick `skipped`
    timeout="10m",  # killed and recorded `timeout` past this
)
def daily_report(run):
    day = run.fire_at[:10]
    # The fencing token grows with every run: pass it to storage that refuses older writers.
    print(f"daily report for {day} (tick {run.fire_at}, token {run.fencing_token})")
    # Fan out the heavy part as tasks any worker can take.
    build_report.delay(f"{day}-{run.fencing_token}", payload={"day": day})


@app.task("report.build", queue="reports", max_attempts=3, timeout="5m")
def build_report(task):
    print(f"building report {task.id} for {task.payload['day']} (attempt {task.attempt})")
