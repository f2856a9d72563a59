"""The architecture, checked: the import graph of ``rsched/`` has no cycle, and
each layer imports only the layers below it.

The graph is read from the source (``ast``): every import counts, at module
level, inside functions (lazy imports) and under ``TYPE_CHECKING`` alike.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "rsched"

#: A layer may import only itself and the layers listed after it.
LAYERS = {
    "core": set(),
    "lua": {"core"},
    "context": {"core", "lua"},
    "queue": {"core", "lua", "context"},
    "runtime": {"core", "lua", "context"},
    "locks": {"core", "lua", "context", "runtime", "queue"},
    "consumer": {"core", "lua", "context", "runtime", "queue", "locks"},
    "cron": {"core", "lua", "context", "runtime", "queue", "locks"},
    "expired": {"core", "lua", "context", "runtime", "queue"},
    "aio": {"core", "lua", "context", "queue"},
    "app": {"core", "lua", "context", "runtime", "queue", "locks", "consumer", "cron"},
}
#: Above the engine: the facade, the operator tools and the CLI may import the engine.
ENGINE = set(LAYERS)
#: The web console sits above the tools: the facade, the tools and the engine, never the CLI.
LAYERS["web"] = ENGINE | {"api", "tools"}


def modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = m.split(".") if p.name == "__init__.py" else m.split(".")[:-1]
                    base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for n in names:
                r = resolve(n) if n.split(".")[0] == "rsched" else None
                if r and r != m:
                    edges[m].add(r)
    return edges


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_no_import_cycle():
    # The package __init__ and its lazy re-exports import the facade: leave it out.
    g = {m: {t for t in e if t != "rsched"} for m, e in graph().items() if m != "rsched"}
    assert cycles(g) == []


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_each_layer_imports_only_the_layers_below():
    wrong = []
    for m, targets in graph().items():
        own = layer(m)
        if own not in LAYERS:
            continue
        for t in targets:
            to = layer(t)
            if to is not None and to != own and to not in LAYERS[own]:
                wrong.append(f"{m} -> {t}")
    assert wrong == []


def test_the_engine_never_imports_the_tools_the_cli_or_the_facade():
    wrong = [
        f"{m} -> {t}"
        for m, targets in graph().items()
        if layer(m) in ENGINE
        for t in targets
        if layer(t) in {"api", "tools", "cli", "web"}
    ]
    assert wrong == []


def test_no_cli_module_imports_a_private_name():
    wrong = []
    for p in (PKG / "cli").glob("*.py"):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rsched"):
                wrong += [
                    f"{p.name}: {a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    assert wrong == []


def test_no_module_outside_lua_calls_a_script():
    """KEYS/ARGV lists are built only where a script's call is defined
    (``rsched/lua/calls.py``, one typed function per script): nothing outside
    ``rsched/lua`` calls the Lua core by name."""
    call = re.compile(r"\.scripts\(|\bscript_and_wait\(|\bScripts\(")
    wrong = []
    for p in PKG.rglob("*.py"):
        if p.parent.name == "lua" or p.name == "context.py":
            continue
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            if call.search(line):
                wrong.append(f"{p.relative_to(PKG)}:{n}")
    assert wrong == []


def test_the_operator_tools_never_import_the_cli():
    """tools/ sits between the library and the CLI: the CLI renders what they return."""
    wrong = [
        f"{m} -> {t}"
        for m, targets in graph().items()
        if layer(m) == "tools"
        for t in targets
        if layer(t) == "cli"
    ]
    assert wrong == []
