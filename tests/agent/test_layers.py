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
FLOORS = ["rooflight.collectors", "rooflight.agent.errors", "rooflight.agent.roofline", "rooflight.agent.model_files", "rooflight.agent.signals",
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


def _floor(module: str) -> int | None:
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


# The floors below the sampling loop: what it calls into, and what must never call back into it.
BELOW_SAMPLING = ("rooflight.collectors", "rooflight.agent.errors", "rooflight.agent.roofline",
                  "rooflight.agent.signals", "rooflight.agent.metrics")


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_nothing_below_the_sampling_loop_imports_it() -> None:
    """The derive step, the physics, the snapshot and the collectors take what the loop gives them; an
    import back (even a lazy one inside a function) would let them reach into its state."""
    found = sorted(f"{name} -> {target}" for name, targets in IMPORTS.items() if _within(name, BELOW_SAMPLING)
                   for target in targets if _within(target, ("rooflight.agent.sampling",)))
    assert not found, "imports of agent.sampling from below it:\n" + "\n".join(found)


# agent/roofline is pure: no network, no command line, no printing, no file written or read by name.
IO_MODULES = ("socket", "ssl", "aiohttp", "urllib", "http", "requests", "argparse", "subprocess")
IO_CALLS = ("open", "print", "input")  # builtins
IO_METHODS = ("read_text", "read_bytes", "write_text", "write_bytes", "open")  # a Path's (p.open(...))



def _io_in(path: Path) -> list[tuple[str, str]]:
    """(enclosing top-level function or '', what) for every I/O import or call in the module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for top in tree.body:
        where = top.name if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else ""
        for node in ast.walk(top):
            if isinstance(node, ast.Import):
                found += [(where, f"import {a.name}") for a in node.names if a.name.split(".")[0] in IO_MODULES]
            elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in IO_MODULES:
                found.append((where, f"from {node.module} import ..."))
            elif isinstance(node, ast.Call):
                fn = node.func
                if isinstance(fn, ast.Name) and fn.id in IO_CALLS:
                    found.append((where, f"{fn.id}() at line {node.lineno}"))
                elif isinstance(fn, ast.Attribute) and fn.attr in IO_METHODS:
                    found.append((where, f".{fn.attr}() at line {node.lineno}"))
    return found


ROOFLINE_IO = {name: _io_in(path) for name, path in MODULES.items() if _within(name, ("rooflight.agent.roofline",))}


def test_roofline_does_no_io() -> None:
    """Not one exception: plan's command lives in agent/plan_cli.py, a model's config.json is read by
    agent/model_files.py."""
    assert len(ROOFLINE_IO) >= 6  # every module of agent/roofline was read
    found = sorted(f"{name}: {what}" + (f" (in {where})" if where else "")
                   for name, hits in ROOFLINE_IO.items() for where, what in hits)
    assert not found, "I/O in agent/roofline (it is pure: move it to the CLI layer):\n" + "\n".join(found)


def test_the_io_check_sees_io() -> None:
    sample = ROOT / "agent" / "roofline" / "physics.py"
    assert _io_in(sample) == []
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        bad = Path(scratch) / "bad.py"
        bad.write_text("import socket\nfrom urllib.parse import urlsplit\nimport argparse as a\n"
                       "def f(p):\n    print(open(p).read())\n    return p.read_text()\n")
        assert sorted(what.split(" at ")[0] for _, what in _io_in(bad)) == sorted([
            "import socket", "from urllib.parse import ...", "import argparse", "print()", "open()", ".read_text()"])
    assert _within("rooflight.agent.signals.series", BELOW_SAMPLING)
    assert not _within("rooflight.agent.sampling.engine_loop", BELOW_SAMPLING)


# The engine loop only fetches and schedules: checks of what a page says are collectors/normalize.py's, the
# histories and the derive step target_series.py's, GPUs and TP gpu_assignment.py's, malloc memory.py's.
ENGINE_LOOP_MAX_LINES = 250


def test_the_engine_loop_stays_a_loop() -> None:
    lines = len((ROOT / "agent" / "sampling" / "engine_loop.py").read_text().splitlines())
    assert lines < ENGINE_LOOP_MAX_LINES, f"agent/sampling/engine_loop.py has {lines} lines"


def _engine_names_compared(path: Path) -> list[str]:
    """`x.ENGINE == "vllm"` (or !=, in) and a bare engine name as a default: facts of an engine outside its
    adapter, at line N."""
    from rooflight.collectors import engines

    known = set(engines.names())
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "ENGINE" for s in sides) and any(
                    isinstance(s, ast.Constant) and s.value in known for s in sides):
                found.append(f"line {node.lineno}: an ENGINE compared with an engine's name")
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and node.value.value in known:
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if any("ENGINE" in n for n in names):
                found.append(f"line {node.lineno}: {names[0]} = {node.value.value!r}")
    return found


def test_no_engine_is_named_outside_its_adapter() -> None:
    """vLLM's KV grouping is its adapter's KV_POOL_GROUPED, the rules' default engine collectors/engines.py's
    SERVICE_DEFAULT, the dashboards' engine families each adapter's ServiceFamilies.namespace."""
    found = sorted(f"{name}: {what}" for name, path in MODULES.items() if not _within(name, ("rooflight.collectors",))
                   for what in _engine_names_compared(path))
    assert not found, "an engine named outside collectors/:\n" + "\n".join(found)
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        bad = Path(scratch) / "bad.py"
        bad.write_text('DEFAULT_ENGINE = "vllm"\ndef f(a):\n    return a.ENGINE == "sglang"\n')
        assert len(_engine_names_compared(bad)) == 2
