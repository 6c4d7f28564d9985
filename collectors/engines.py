"""The engine adapters the agent knows, and auto-detection from the exposition itself.

Every adapter module has the same surface: ENGINE, METRICS_PATH, recognises(text) and
parse(text, *, target, timestamp, duration) -> EngineSample. Adding an engine is adding its module
name here.
"""

from __future__ import annotations

import importlib
import re
from types import ModuleType

from collectors.errors import ParseError

# Order matters for detection: a Dynamo worker passes an engine's metrics through, so it goes first.
ADAPTER_MODULES: dict[str, str] = {
    "vllm": "collectors.vllm",
}

_FAMILY = re.compile(r"^# (?:TYPE|HELP) ([a-zA-Z_:][a-zA-Z0-9_:]*)", re.MULTILINE)


def names() -> tuple[str, ...]:
    return tuple(ADAPTER_MODULES)


def adapter(engine: str) -> ModuleType:
    """The adapter module for an engine name (`vllm`, `sglang`, ...)."""
    try:
        return importlib.import_module(ADAPTER_MODULES[engine])
    except KeyError:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ADAPTER_MODULES)}, auto") from None


def detect(text: str) -> ModuleType:
    """The adapter whose engine produced this exposition, or ParseError naming what was found."""
    for engine in ADAPTER_MODULES:
        module = adapter(engine)
        if module.recognises(text):
            return module
    found = sorted({m.group(1).split(":")[0].split("_")[0] for m in _FAMILY.finditer(text)})
    seen = ", ".join(found[:8]) if found else "no metric families at all"
    raise ParseError(f"not a known engine's /metrics (families found start with: {seen})")
