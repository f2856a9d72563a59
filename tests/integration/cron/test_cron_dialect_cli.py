"""The dialects on the command line (SPEC §4): `rsched next`, --dialect on run cron,
exec and next, `dialect` in [cron.NAME], `crons --json` dialect, local next fire in
`crons` and `top`."""

from __future__ import annotations

import io
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from rich.console import Console

from rsched.api import Rsched
from rsched.cron.runner import CronRunner
from rsched.cron.spec import make_spec
from rsched.tools.top import collect, render
from tests.support import Cli


def weekdays(rows: list[dict]) -> set[int]:
    return {datetime.fromisoformat(r["local"]).isoweekday() for r in rows}


def test_next_expression_json_rows(cli: Cli) -> None:
    rows = cli.json("next", "0 30 2 * * ?", "--tz", "America/New_York")
    assert len(rows) == 10  # the default
    for r in rows:
        assert set(r) == {"fire_at", "fire_ms", "local", "offset"}
        local = datetime.fromisoformat(r["local"])
        assert local.utcoffset() is not None and r["local"].endswith(r["offset"])
        assert local.timestamp() * 1000 == r["fire_ms"]
        assert r["fire_at"].endswith(".000Z")
        assert r["offset"] in ("-05:00", "-04:00")
        assert (local.hour, local.minute) in ((2, 30), (3, 0))  # 03:00 only on a DST gap day
    assert [r["fire_ms"] for r in rows] == sorted({r["fire_ms"] for r in rows})
    assert len(cli.json("next", "* * * * * *", "-n", "1000")) == 1000
    assert len(cli.json("next", "@daily", "-n", "1")) == 1


def test_next_counts_out_of_bounds_exit_2_before_connecting(cli: Cli) -> None:
    env = {"RSCHED_REDIS_URL": "redis://127.0.0.1:1/0"}  # nothing listens: 69 if it connected
    for n in ("0", "1001", "-3"):
        res = cli("next", "* * * * *", "-n", n, env=env)
        assert res.returncode == 2 and "-n" in res.stderr and "1-1000" in res.stderr, res.stderr
    res = cli("next", "61 * * * *", env=env)
    assert res.returncode == 2


def test_next_refusal_is_run_crons_message(cli: Cli) -> None:
    for expr in ("61 * * * *", "0 0 5-1 * * ?", "R * * * *", "0 0 * * 7/0"):
        a = cli("next", expr)
        b = cli("run", "cron", "job", "--schedule", expr, "--", "true")
        assert a.returncode == b.returncode == 2
        assert a.stderr == b.stderr and "field" in a.stderr, (a.stderr, b.stderr)
    a = cli("next", "0 0 12 * * MON", "--dialect", "quartz")
    b = cli(
        "run", "cron", "job", "--schedule", "0 0 12 * * MON", "--dialect", "quartz", "--", "true"
    )
    assert a.returncode == b.returncode == 2 and a.stderr == b.stderr
    assert "day-of-month field '*'" in a.stderr


def test_next_dialect_changes_the_days(cli: Cli) -> None:
    spring = cli.json("next", "0 0 12 ? * 2-6", "-n", "20")
    quartz = cli.json("next", "0 0 12 ? * 2-6", "--dialect", "quartz", "-n", "20")
    assert weekdays(spring) == {2, 3, 4, 5, 6}  # TUE-SAT (1 = MON)
    assert weekdays(quartz) == {1, 2, 3, 4, 5}  # MON-FRI (1 = SUN)
    year = cli.json("next", "0 0 0 1 1 ? 2090", "--dialect", "quartz", "-n", "5")
    assert [r["fire_at"] for r in year] == ["2090-01-01T00:00:00.000Z"]  # the years run out
    assert cli("next", "0 0 12 ? * 2-6 2090").returncode == 2  # 7 fields need quartz


def test_next_name_from_config_and_from_registered_crons(
    cli: Cli, rs: Rsched, tmp_path: Path
) -> None:
    (tmp_path / "rsched.toml").write_text(
        '[cron.payroll]\nschedule = "0 0 12 ? * 2-6"\ntz = "Asia/Shanghai"\n'
        'dialect = "quartz"\ncommand = ["true"]\n'
    )
    rows = cli.json("next", "payroll", "-n", "14")
    assert weekdays(rows) == {1, 2, 3, 4, 5} and {r["offset"] for r in rows} == {"+08:00"}
    assert {datetime.fromisoformat(r["local"]).hour for r in rows} == {12}
    # --tz overrides the cron's zone
    other = cli.json("next", "payroll", "--tz", "UTC", "-n", "1")
    assert other[0]["offset"] == "+00:00"
    # a cron a runner registered (not in the config file)
    CronRunner(rs, make_spec("ledger", "0 0 12 ? * 2-6", ["true"], dialect="quartz")).register()
    assert weekdays(cli.json("next", "ledger", "-n", "14")) == {1, 2, 3, 4, 5}
    res = cli("next", "nosuch")
    assert res.returncode == 3 and "no cron named 'nosuch'" in res.stderr


def test_crons_json_dialect_and_local_next_fire(cli: Cli, rs: Rsched) -> None:
    CronRunner(
        rs, make_spec("a", "0 0 2 * * ?", ["true"], tz="Asia/Kathmandu")
    ).register()  # 6 fields: spring
    CronRunner(rs, make_spec("b", "0 2 * * *", ["true"])).register()  # 5 fields: cron
    CronRunner(
        rs, make_spec("c", "0 0 2 ? * MON", ["true"], tz="Pacific/Chatham", dialect="quartz")
    ).register()
    rows = {r["name"]: r for r in cli.json("crons")}
    assert {n: r["dialect"] for n, r in rows.items()} == {"a": "spring", "b": "cron", "c": "quartz"}
    nxt = datetime.fromtimestamp(rows["c"]["next_fire_ms"] / 1000, ZoneInfo("Pacific/Chatham"))
    assert nxt.isoweekday() == 1 and nxt.hour == 2  # quartz MON = Monday, 02:00 local
    table = cli("crons", env={"COLUMNS": "250"}, check=0).stdout
    a_line = next(ln for ln in table.splitlines() if ln.startswith("a "))
    assert " 02:00 +05:45" in a_line and "spring" in a_line, table
    c_line = next(ln for ln in table.splitlines() if ln.startswith("c "))
    assert "quartz" in c_line and (" 02:00 +13:45" in c_line or " 02:00 +12:45" in c_line)


def test_top_shows_next_fire_in_the_crons_zone(rs: Rsched) -> None:
    CronRunner(rs, make_spec("nightly", "0 3 * * *", ["true"], tz="Asia/Kathmandu")).register()
    snap = collect(rs)
    console = Console(width=140, height=30, record=True, file=io.StringIO(), color_system=None)
    console.print(render(snap, width=140, height=30))
    line = next(ln for ln in console.export_text().splitlines() if "nightly" in ln)
    assert " 03:00 +05:45" in line, line


def test_run_cron_dialect_flag_and_config_key(cli: Cli, tmp_path: Path) -> None:
    res = cli(
        "run",
        "cron",
        "job",
        "--schedule",
        "0 0 12 ? * 2-6 2090",
        "--dialect",
        "spring",
        "--",
        "true",
    )
    assert res.returncode == 2 and "dialect spring takes 6" in res.stderr
    res = cli("run", "cron", "job", "--schedule", "* * * * *", "--dialect", "julian", "--", "true")
    assert res.returncode == 2 and "--dialect" in res.stderr
    (tmp_path / "rsched.toml").write_text(
        '[cron.x]\nschedule = "0 0 12 * * ?"\ndialect = "vixie"\ncommand = ["true"]\n'
    )
    res = cli("run", "cron", "--all")
    assert res.returncode == 78 and "cron.x.dialect" in res.stderr, res.stderr
    (tmp_path / "rsched.toml").write_text(
        '[cron.x]\nschedule = "0 0 12 * * MON"\ndialect = "quartz"\ncommand = ["true"]\n'
    )
    res = cli("run", "cron", "--all")
    assert res.returncode == 78 and "day-of-month field" in res.stderr, res.stderr


def test_exec_once_per_dialect(cli: Cli) -> None:
    ok = cli(
        "exec", "--lock", "q", "--once-per", "0 0 12 ? * 2-6", "--dialect", "quartz", "--", "true"
    )
    assert ok.returncode == 0, ok.stderr
    bad = cli(
        "exec", "--lock", "q", "--once-per", "0 0 12 * * MON", "--dialect", "quartz", "--", "true"
    )
    assert bad.returncode == 2 and "--once-per" in bad.stderr and "day-of-month" in bad.stderr
    dur = cli("exec", "--lock", "q", "--once-per", "10m", "--dialect", "quartz", "--", "true")
    assert dur.returncode == 2 and "--dialect" in dur.stderr
    none = cli("exec", "--lock", "q", "--dialect", "quartz", "--", "true")
    assert none.returncode == 2 and "--dialect" in none.stderr
