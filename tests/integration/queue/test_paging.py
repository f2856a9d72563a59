"""queue.paging: a page of tasks from a cursor (what `rsched web` shows), on a real
server: every task once, in the CLI's order, across partitions and parked lanes,
and a cursor whose task went away meanwhile."""

from __future__ import annotations

import pytest

from rsched.api import Rsched
from rsched.core.errors import BadInput
from rsched.queue import paging
from rsched.queue.specs import make_spec, task_query
from tests.support import Cli


def _walk(rs: Rsched, limit: int, **kw: object) -> tuple[list[str], int]:
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        got = paging.page(rs, task_query(limit=limit, **kw), cursor)  # type: ignore[arg-type]
        seen += [f"{t.type} {t.id}" for t in got.tasks]
        pages += 1
        if got.cursor is None:
            return seen, pages
        cursor = got.cursor


def test_every_task_once_in_the_lists_order(rs: Rsched) -> None:
    rs.add_many([make_spec("j", f"{i:03d}", delay=f"{1 + i % 7}m") for i in range(95)])
    rs.add("j", "now")
    seen, pages = _walk(rs, 10)
    assert pages == 10 and len(seen) == 96 == len(set(seen))
    assert seen == [f"{t.type} {t.id}" for t in rs.list(limit=1000)]


def test_a_cursor_whose_task_went_away_goes_on_after_it(rs: Rsched) -> None:
    rs.add_many([make_spec("j", f"{i:03d}", delay=f"{10 + i}s") for i in range(30)])
    first = paging.page(rs, task_query(limit=10), None)
    assert first.cursor is not None
    rs.cancel("j", "009")  # the last task of the page
    rest = paging.page(rs, task_query(limit=100), first.cursor)
    assert [t.id for t in rest.tasks] == [f"{i:03d}" for i in range(10, 30)]
    assert rest.cursor is None


def test_partitions_and_parked_lanes(cli: Cli, rs: Rsched) -> None:
    rs.add_many(
        [make_spec("p", f"{i:02d}", queue="big", delay="1h") for i in range(40)], partitions=4
    )
    seen, _ = _walk(rs, 7, queue="big")
    assert sorted(seen) == [f"p {i:02d}" for i in range(40)]
    # a due task no consumer could run is parked in its type's lane: still listed due
    rs.add("a.x", "1")
    cli("run", "consumer", "--handler", "b.y=true", "--burst")
    assert rs.redis.hlen(rs.keys.queue("default").lanes) >= 1
    rs.add("c.z", "1")
    due, _ = _walk(rs, 1, state="due")
    assert sorted(due) == ["a.x 1", "c.z 1"]
    assert _walk(rs, 5, state="due", task_type="a.x")[0] == ["a.x 1"]


def test_a_partitioned_queue_is_paged_in_due_order_across_partitions(rs: Rsched) -> None:
    specs = [make_spec("p", f"{i:02d}", queue="tri", delay=f"{10 + i}s") for i in range(30)]
    rs.add_many(specs, partitions=3)
    rs.add_many([make_spec("p", f"d{i}", queue="tri") for i in range(4)], partitions=3)
    stored = [rs.keys.queue(f"tri#{i}").sched for i in range(3)]
    assert all(rs.redis.zcard(k) >= 3 for k in stored)  # every partition holds some
    want = [f"p d{i}" for i in range(4)] + [f"p {i:02d}" for i in range(30)]
    rows = rs.redis.zrange(stored[0], 0, -1, withscores=True)
    due = {m for m, sc in rows if sc <= rs.now_ms()}
    assert due and due < set(want[:4])
    for limit in (1, 4, 7):
        seen, pages = _walk(rs, limit, queue="tri")
        # the due ones (same due time: by member), then scheduled by due time
        assert sorted(seen[:4]) == want[:4] and seen[4:] == want[4:], limit
        assert pages == -(-34 // limit), limit  # no empty last page
    # the merge resumes where each partition stopped: a page of the middle
    first = paging.page(rs, task_query(queue="tri", state="scheduled", limit=10), None)
    assert first.cursor is not None
    nxt = paging.page(rs, task_query(queue="tri", state="scheduled", limit=10), first.cursor)
    assert [t.id for t in first.tasks + nxt.tasks] == [f"{i:02d}" for i in range(20)]
    assert all(t.queue == "tri" for t in nxt.tasks)
    # the last task of a page went away meanwhile: its partition goes on after its score
    rs.cancel("p", "19", queue="tri")
    rest = paging.page(rs, task_query(queue="tri", state="scheduled", limit=100), nxt.cursor)
    assert [t.id for t in rest.tasks] == [f"{i:02d}" for i in range(20, 30)]


def test_a_type_filter_reads_a_bounded_share_per_page(
    rs: Rsched, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(paging, "SCAN_BUDGET", 300)
    rs.add_many([make_spec("a", f"{i:04d}", delay="1h") for i in range(1000)])
    rs.add("b", "last", delay="2h")
    got = paging.page(rs, task_query(task_type="b", limit=10), None)
    assert got.tasks == [] and got.cursor is not None  # a short page, and a next one
    seen, pages = _walk(rs, 10, task_type="b")
    assert seen == ["b last"] and pages >= 3


def test_a_foreign_cursor_is_refused(rs: Rsched) -> None:
    for bad in ("x", "e30", paging.encode_cursor(("due", ""), {"q": (1.0, "m")})[:-3]):
        with pytest.raises(BadInput, match="^cursor"):
            paging.page(rs, task_query(), bad)
