"""The table renderer against tabulate's "simple" format (which it replaced, to
spare one-shot commands tabulate's import): the same text for random tables of
ASCII, spaces, East Asian wide characters, combining marks and emoji."""

from __future__ import annotations

import random

import pytest

from rsched.cli.render import simple_table

_tabulate = pytest.importorskip("tabulate")
tabulate = _tabulate.tabulate
# tabulate measures East Asian and combining characters only with wcwidth (a test
# dependency); without it, it counts code points, as the terminal does not.
pytestmark = pytest.mark.skipif(
    not getattr(_tabulate, "WIDE_CHARS_MODE", False), reason="tabulate without wcwidth"
)

ALPHABET = ["a", "b", "Z", "0", "-", " ", "中", "文", "é", "\u0301", "😀", "ｱ", "Ａ", ".", "/"]


def _text(rnd: random.Random) -> str:
    return "".join(rnd.choice(ALPHABET) for _ in range(rnd.randint(0, 8)))


def test_same_text_as_tabulate_simple_on_random_tables() -> None:
    rnd = random.Random(20261201)
    for _ in range(2000):
        ncols = rnd.randint(1, 5)
        headers = [_text(rnd).strip() or "H" for _ in range(ncols)]
        rows = [[_text(rnd) for _ in range(ncols)] for _ in range(rnd.randint(0, 6))]
        want = tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)
        assert simple_table(headers, rows) == want, (headers, rows)


def test_a_table_of_queues() -> None:
    text = simple_table(["QUEUE", "DUE"], [["default", "3"], ["订单", "12"]])
    assert text.splitlines() == ["QUEUE    DUE", "-------  -----", "default  3", "订单     12"]
