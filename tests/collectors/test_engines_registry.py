"""Engines register themselves (collectors/registry.py): every adapter module of collectors/ is in the
registry without anyone naming it in a table, the order is the adapters' own, and no module outside
collectors/ names an engine's metric family (rules and dashboards ask the adapter)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from rooflight.collectors import engines, registry, vllm
from support import ROOT

COLLECTORS = ROOT / "collectors"


def _declared_engine(path: Path) -> str | None:
    """The module-level `ENGINE = "..."` of a collectors/ module, read from its source (not imported)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "ENGINE" for t in node.targets):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                return node.value.value
    return None


def _registered_in_a_fresh_interpreter(first_import: str) -> list[str]:
    code = f"import {first_import}\nfrom rooflight.collectors import engines\nprint(' '.join(engines.names()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.split()


def test_every_adapter_module_registers_itself() -> None:
    """A new collectors/ module that declares an ENGINE but is not imported by collectors/engines.py, or
    does not end with registry.register(__name__), is missing here."""
    declared = {engine for path in COLLECTORS.glob("*.py") if (engine := _declared_engine(path))}
    assert len(declared) >= 7, declared  # the AST scan itself works: dynamo, vllm, sglang, ... are found
    assert set(_registered_in_a_fresh_interpreter("rooflight.collectors.engines")) == declared


def test_detection_order_is_the_adapters_own_not_the_import_order() -> None:
    # dynamo imports vllm, sglang and trtllm: importing an adapter first registers it first.
    want = ["dynamo", "vllm", "sglang", "trtllm", "triton", "tgi", "llamacpp"]
    assert _registered_in_a_fresh_interpreter("rooflight.collectors.llamacpp") == want
    assert _registered_in_a_fresh_interpreter("rooflight.collectors.dynamo") == want
    assert list(engines.names()) == want


def test_an_engine_name_is_registered_once(monkeypatch: pytest.MonkeyPatch) -> None:
    impostor = types.ModuleType("rooflight.collectors.impostor")
    impostor.__dict__.update({k: v for k, v in vars(vllm).items() if not k.startswith("__")})
    monkeypatch.setitem(sys.modules, impostor.__name__, impostor)
    with pytest.raises(ValueError, match="'vllm' is already registered by rooflight.collectors.vllm"):
        registry.register(impostor.__name__)
    assert engines.adapter("vllm") is vllm
    registry.register("rooflight.collectors.vllm")  # the same module again (a reload) is no clash


# An engine's own family: its prefix followed by a name (`vllm:time_to_first_token_seconds`). A bare
# prefix (`"vllm:"`, a regex's `vllm:[a-z]+`) is no family.
_FAMILY = re.compile(
    r"(?<![A-Za-z0-9_])(vllm:|sglang:|llamacpp:|trtllm_|tgi_|nv_trt_llm_|nv_inference_|dynamo_frontend_|dynamo_component_)[a-z]"
)
# Where a family name outside collectors/ is the point, and why.
_ALLOWED = {
    # The demo impersonates a vLLM server: its HELP texts are vLLM's, verbatim (one names a family).
    "agent/demo/exposition.py": "vLLM's HELP text",
}


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """Every string literal of a module except docstrings (prose may name a family)."""
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_no_module_outside_collectors_names_an_engine_family() -> None:
    found = []
    for folder in ("agent", "rules", "dashboards", "deploy"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in _ALLOWED:
                continue
            found += [f"{rel}:{line}: {text[:80]!r}" for line, text in _code_strings(path) if _FAMILY.search(text)]
    assert not found, "engine families belong to their adapter (collectors/<engine>.py):\n" + "\n".join(found)


def test_the_family_scan_sees_a_family_and_skips_prose(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('"""Reads vllm:num_requests_running."""\nX = "vllm:"\nY = "sglang:num_queue_reqs"\n')
    assert [text for _, text in _code_strings(module) if _FAMILY.search(text)] == ["sglang:num_queue_reqs"]
