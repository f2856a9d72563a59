"""Public test vectors, ported as data (tests/data/*_vectors.json, origins in each file):
cronsim's test suite (cron dialect), Spring's CronExpressionTests (spring), the Quartz
tutorial's examples (quartz). Each file also lists where rsched differs on purpose."""

from __future__ import annotations

import json
from datetime import datetime
from itertools import product
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from rsched.core import cronexpr
from rsched.core.errors import BadInput

DATA = Path(__file__).parent / "data"


def load(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def to_s(text: str, tz: str) -> int:
    d = datetime.fromisoformat(text)
    if d.tzinfo is None:
        d = d.replace(tzinfo=ZoneInfo(tz))
    return int(d.timestamp())


def run(expr: str, tz: str, start: str, n: int, dialect: str | None = None) -> list[int]:
    s = cronexpr.parse(expr, tz, dialect=dialect)
    t, out = to_s(start, tz) * 1000, []
    for _ in range(n):
        t = s.next_after(t)
        out.append(t // 1000)
    return out


CRONSIM = load("cronsim_vectors.json")
SPRING = load("spring_vectors.json")
QUARTZ = load("quartz_vectors.json")


def _id(c: dict) -> str:
    return f"{c.get('case') or c.get('meaning')}: {c['expr']}"


@pytest.mark.parametrize("c", CRONSIM["next"], ids=_id)
def test_cronsim_next(c: dict) -> None:
    want = [to_s(x, c["tz"]) for x in c["next"]]
    assert run(c["expr"], c["tz"], c["start"], len(want)) == want


@pytest.mark.parametrize("c", CRONSIM["differences"], ids=_id)
def test_cronsim_intentional_differences(c: dict) -> None:
    want = [to_s(x, c["tz"]) for x in c["rsched"]]
    got = run(c["expr"], c["tz"], c["start"], len(want))
    assert got == want
    assert got != [to_s(x, c["tz"]) for x in c["cronsim"]][: len(got)]


def _refusals() -> list[str]:
    r = CRONSIM["refused"]
    return [p % v for p, v in product(r["patterns"], r["values"])] + r["single"]


@pytest.mark.parametrize("expr", _refusals())
def test_cronsim_refused(expr: str) -> None:
    with pytest.raises(BadInput):
        cronexpr.parse(expr)


@pytest.mark.parametrize("expr", CRONSIM["refused"]["accepted_by_cronsim_refused_by_rsched"])
def test_cronsim_accepts_but_rsched_refuses(expr: str) -> None:
    with pytest.raises(BadInput, match="day-of-month field"):
        cronexpr.parse(expr)


@pytest.mark.parametrize(
    "sample,start",
    list(product(CRONSIM["reverse"]["samples"], CRONSIM["reverse"]["starts"])),
)
def test_cronsim_reverse(sample: str, start: list[str]) -> None:
    tz, at = start
    s = cronexpr.parse(sample, tz)
    fwd = [t * 1000 for t in run(sample, tz, at, 5)]
    back, t = [], fwd[-1]
    for _ in range(4):
        t = s.prev_at_or_before(t - 1)
        back.append(t)
    assert back == fwd[-2::-1]
    assert s.ticks_between(fwd[0] - 1, fwd[-1]) == fwd


@pytest.mark.parametrize("c", SPRING["next"], ids=_id)
def test_spring_next(c: dict) -> None:
    if c["next"] is None:
        with pytest.raises(BadInput, match="never fires"):
            cronexpr.parse(c["expr"], c["tz"], dialect="spring")
        return
    want = [to_s(x, c["tz"]) for x in c["next"]]
    assert run(c["expr"], c["tz"], c["start"], len(want), "spring") == want


@pytest.mark.parametrize("c", SPRING["differences"], ids=_id)
def test_spring_intentional_differences(c: dict) -> None:
    want = [to_s(x, c["tz"]) for x in c["rsched"]]
    assert run(c["expr"], c["tz"], c["start"], len(want), "spring") == want
    assert want[0] != to_s(c["spring"][0], c["tz"])


@pytest.mark.parametrize("expr", SPRING["refused"])
def test_spring_refused(expr: str) -> None:
    with pytest.raises(BadInput):
        cronexpr.parse(expr, dialect="spring")


@pytest.mark.parametrize("c", QUARTZ["next"], ids=_id)
def test_quartz_next(c: dict) -> None:
    want = [to_s(x, c["tz"]) for x in c["next"]]
    assert run(c["expr"], c["tz"], c["start"], len(want), "quartz") == want


@pytest.mark.parametrize("expr,why", QUARTZ["refused"])
def test_quartz_refused(expr: str, why: str) -> None:
    with pytest.raises(BadInput):
        cronexpr.parse(expr, dialect="quartz")


def test_vector_counts() -> None:
    """The suites keep their size (a file cut short by accident fails here)."""
    assert len(CRONSIM["next"]) >= 43 and len(CRONSIM["differences"]) == 3
    assert len(SPRING["next"]) >= 55 and len(SPRING["differences"]) == 1
    assert len(QUARTZ["next"]) >= 26
