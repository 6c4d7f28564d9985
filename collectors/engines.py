"""The engine adapters the agent knows, and auto-detection from the exposition itself.

Every adapter module has the same surface: ENGINE, METRICS_PATH, recognises(text) and
parse(text, *, target, timestamp, duration) -> EngineSample. Adding an engine is adding its module
name here.
"""

from __future__ import annotations

import importlib
import re
from types import ModuleType

from rooflight.collectors.errors import ParseError

# Order matters for detection: a Dynamo worker passes an engine's metrics through, so it goes first.
# The others own disjoint prefixes (vllm:, sglang:, trtllm_, nv_trt_llm_/nv_inference_, tgi_,
# llamacpp:), so their order only decides odd pages that mix engines.
ADAPTER_MODULES: dict[str, str] = {
    "dynamo": "rooflight.collectors.dynamo",
    "vllm": "rooflight.collectors.vllm",
    "sglang": "rooflight.collectors.sglang",
    "trtllm": "rooflight.collectors.trtllm",
    "triton": "rooflight.collectors.triton_trtllm",
    "tgi": "rooflight.collectors.tgi",
    "llamacpp": "rooflight.collectors.llamacpp",
}

_FAMILY = re.compile(r"^# (?:TYPE|HELP) ([a-zA-Z_:][a-zA-Z0-9_:]*)", re.MULTILINE)
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", re.MULTILINE)


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
    raise ParseError(f"not a known engine's /metrics: {describe(text)}")


def describe(text: str) -> str:
    """What an unrecognised page holds, in a few words, for the error a user reads."""
    head = text.lstrip()[:1]
    if head in ("{", "["):
        return (
            "found JSON, not the Prometheus text format (trtllm-serve answers JSON iteration stats "
            "at /metrics; its Prometheus metrics are at /prometheus/metrics: pass --metrics-path)"
        )
    if head == "<":
        return "found HTML or XML, not the Prometheus text format"
    found = sorted({_prefix(m.group(1)) for regex in (_FAMILY, _SAMPLE) for m in regex.finditer(text)})
    if not found:
        return "found no metric families at all" if text.strip() else "found an empty page"
    more = f" and {len(found) - 8} more" if len(found) > 8 else ""
    return f"families found start with: {', '.join(found[:8])}{more}; known engines: {', '.join(ADAPTER_MODULES)}"


def _prefix(name: str) -> str:
    """`vllm:x` -> `vllm:`; `python_gc_x` -> `python_`."""
    if ":" in name:
        return name.split(":", 1)[0] + ":"
    return name.split("_", 1)[0] + "_" if "_" in name else name
