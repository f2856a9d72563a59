"""What the events tests share: a command sink that appends each event it gets
to a file, and reading that file back."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def appender(out: Path) -> str:
    """An ``--alert-command`` that appends the event JSON on its stdin to ``out``."""
    return f'{sys.executable} -c \'import sys; open("{out}", "a").write(sys.stdin.read() + "\\n")\''


def lines(p: Path) -> list[dict[str, Any]]:
    """The events an :func:`appender` wrote, in order."""
    if not p.exists():
        return []
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
