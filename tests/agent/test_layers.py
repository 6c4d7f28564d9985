"""The package's layers import downwards only, and no module imports itself back through a cycle.

Read from the source with `ast` (nothing is imported), so a lazy import inside a function counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

from support import ROOT

# Folder of each part of the one installed package `rooflight` (pyproject.toml's package-dir).
PARTS = {"rooflight.agent": ROOT / "agent", "rooflight.collectors": ROOT / "collectors",
         "rooflight.rules": ROOT / "rules", "rooflight.dashboards": ROOT / "dashboards"}

# Lowest first. A module may import its own floor or a lower one, never a higher one.
FLOORS = ["rooflight.collectors", "rooflight.agent.errors", "rooflight.agent.roofline", "rooflight.agent.signals",
          "rooflight.agent.metrics", "rooflight.agent.config", "rooflight.agent.sampling", "rooflight.agent.proxy", "rooflight.agent.serve", "rooflight.agent.demo",
          "rooflight.rules", "rooflight.dashboards", "rooflight.agent.plan_cli", "rooflight.agent.cli"]


def _modules() -> dict[str, Path]:
    out = {}
    for package, folder in PARTS.items():
        for path in folder.rglob("*.py"):
            if "_root" in path.parts:
                continue
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


def _imports(name: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return {f for f in found if f.startswith("rooflight.")}


# The proxy's and the demo's configs sit on the floor of what they configure (agent/config/__init__.py).
SAME_FLOOR = {"rooflight.agent.config.proxy": "rooflight.agent.proxy", "rooflight.agent.config.demo": "rooflight.agent.demo"}


def _floor(module: str) -> int | None:
    module = SAME_FLOOR.get(module, module)
    best = None
    for i, prefix in enumerate(FLOORS):
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(FLOORS[best]):
                best = i
    return best


MODULES = _modules()
IMPORTS = {name: {i for i in _imports(name, path) if i in MODULES} for name, path in MODULES.items()}


def test_every_module_sits_on_a_floor() -> None:
    homeless = sorted(m for m in MODULES if _floor(m) is None and m != "rooflight.agent")
    assert not homeless, f"modules on no floor (add them to FLOORS): {homeless}"


def test_no_module_imports_a_higher_floor() -> None:
    upward = []
    for name, targets in IMPORTS.items():
        mine = _floor(name)
        for target in targets:
            theirs = _floor(target)
            if mine is not None and theirs is not None and theirs > mine:
                upward.append(f"{name} -> {target}")
    assert not upward, "upward imports:\n" + "\n".join(sorted(upward))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(trail[trail.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    return cycles


def test_no_import_cycle() -> None:
    graph = {n: {t for t in ts if t != n and not n.startswith(t + ".")} for n, ts in IMPORTS.items()}
    cycles = _cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_checks_see_what_they_guard() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    assert _floor("rooflight.agent.serve.server") > _floor("rooflight.agent.roofline.physics")
    assert _floor("rooflight.agent.demo.cli") < _floor("rooflight.agent.cli")
