"""`rsched metrics`: the run-duration histogram of real cron, exec and task runs,
counted by the Lua scripts that record them."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from rsched.api import Rsched
from tests.integration.cron.test_cron import spawn_runner, stop_all
from tests.support import Cli, wait_for

NAME = "rsched_run_duration_seconds"


def hist(text: str, **labels: str) -> dict[str, float]:
    """bucket le -> count, plus 'sum' and 'count', of the series with ``labels``."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name != NAME:
            continue
        assert fam.type == "histogram"
        for s in fam.samples:
            lab = dict(s.labels)
            le = lab.pop("le", None)
            if lab != {"kind": "", "name": "", "queue": "", "type": "", **labels}:
                continue
            key = le if s.name.endswith("_bucket") else s.name.rsplit("_", 1)[1]
            out[str(key)] = s.value
    return out


def test_cron_exec_and_task_runs_are_in_the_histogram(cli: Cli, rs: Rsched, tmp_path: Path) -> None:
    p = spawn_runner(cli, tmp_path, "nap", "0 0 1 1 *", ["sleep", "0.6"])
    wait_for(
        lambda: [r for r in cli.json("crons") if r["runners"] == 1], timeout=15, what="a runner"
    )
    assert cli.json("trigger", "nap", "--wait")["result"] == "ok"
    cli("exec", "--lock", "backup", "--", "sleep", "0.6", check=0)
    cli("add", "t.nap", "0", check=0)  # the ID is the handler's last argument: sleep 0.6 0
    cli("add", "t.bad", "x", "--max-attempts", "1", check=0)
    cli("run", "consumer", "--handler", "t.nap=sleep 0.6", "--handler", "t.bad=false", "--burst")
    text = cli("metrics", check=0).stdout
    for labels in ({"kind": "cron", "name": "nap"}, {"kind": "exec", "name": "backup"}):
        h = hist(text, **labels)
        assert h["count"] == 1 and h["+Inf"] == 1, (labels, h)
        assert h["0.5"] == 0 and h["sum"] >= 0.6, (labels, h)  # it slept 0.6 s
    h = hist(text, kind="task", queue="default", type="t.nap")
    assert h["count"] == 1 and h["0.5"] == 0 and h["sum"] >= 0.6, h
    h = hist(text, kind="task", queue="default", type="t.bad")  # a failed run (fail-7)
    assert h["count"] == 1, h
    # cumulative buckets
    les = [k for k in hist(text, kind="cron", name="nap") if k not in ("sum", "count")]
    vals = [hist(text, kind="cron", name="nap")[k] for k in les]
    assert vals == sorted(vals)
    # the run counters are not confused with the histogram's fields
    runs = [
        s.labels
        for f in text_string_to_metric_families(text)
        if f.name == "rsched_cron_runs"
        for s in f.samples
    ]
    assert runs == [{"cron": "nap", "result": "ok"}], runs
    assert stop_all([p]) == [0]
