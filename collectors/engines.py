"""The engine adapters the agent knows, and auto-detection.

Each adapter (a module of collectors/) satisfies `EngineAdapter` and adds itself to the registry
(collectors/registry.py) when imported; this module imports them all, below, and serves them to the
engine loop, the CLI, the coverage table of docs/engines.md, the rules and the dashboards. Nothing
outside an adapter knows its engine's facts. Adding an engine is one new module and its name in the
import below (docs/engines.md "Adding an engine"); tests/collectors/test_engines_registry.py fails
when a module of collectors/ that declares an ENGINE is left out of either.
"""

from __future__ import annotations

import re

# Every adapter module, imported for its registry.register() call; the order here does not matter (ORDER does).
from rooflight.collectors import dynamo, llamacpp, sglang, tgi, triton_trtllm, trtllm, vllm  # noqa: F401
from rooflight.collectors import expfmt, registry
from rooflight.collectors.errors import ParseError
from rooflight.collectors.registry import EngineAdapter, Histogram, ServiceFamilies  # noqa: F401 - the API

DEFAULT_METRICS_PATH = "/metrics"  # the Prometheus convention, where `--engine auto` looks first
# The engine whose own families the checked-in rules and dashboards read (`rooflight rules --engine` picks
# another with SERVICE_FAMILIES): the most deployed one.
SERVICE_DEFAULT = vllm.ENGINE

MAX_PREFIX_CHARS = 64  # a family prefix in the "not a known engine" message: real ones are a word
_FAMILY = re.compile(r"^# (?:TYPE|HELP) ([a-zA-Z_:][a-zA-Z0-9_:]*)", re.MULTILINE)
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", re.MULTILINE)


def names() -> tuple[str, ...]:
    """Every known engine name, in detection order."""
    return tuple(a.ENGINE for a in adapters())


def adapter(engine: str) -> EngineAdapter:
    """The adapter for an engine name (`vllm`, `sglang`, ...); ValueError naming the known ones if none."""
    found = next((a for a in registry.registered() if a.ENGINE == engine), None)
    if found is None:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(names())}, auto")
    return found


def adapters() -> tuple[EngineAdapter, ...]:
    """Every adapter, in detection order: by ORDER. A Dynamo worker passes an engine's metrics through,
    so Dynamo goes first; the others own disjoint prefixes (vllm:, sglang:, trtllm_, nv_trt_llm_ /
    nv_inference_, tgi_, llamacpp:), so their order only decides odd pages that mix engines."""
    return registry.registered()


def detect(text: str) -> EngineAdapter:
    """The adapter whose engine produced this exposition, or ParseError naming what was found."""
    for candidate in adapters():
        if candidate.recognises(text):
            return candidate
    raise ParseError(f"not a known engine's /metrics: {describe(text)}")


def probe_paths() -> tuple[str, ...]:
    """Where `--engine auto` looks for a page: /metrics, then, while the answer is JSON, every other
    path an adapter declares (trtllm-serve answers JSON at /metrics)."""
    paths = [DEFAULT_METRICS_PATH]
    for a in adapters():
        paths.extend(p for p in a.METRICS_PATHS if p not in paths)
    return tuple(paths)


def is_json(text: str) -> bool:
    """True when an answer is JSON rather than the Prometheus text format."""
    return text.lstrip()[:1] in ("{", "[")


def describe(text: str) -> str:
    """What an unrecognised page holds, in a few words, for the error a user reads."""
    if is_json(text):
        notes = [a.DEFAULT_PATH_NOTE for a in adapters() if a.DEFAULT_PATH_NOTE]
        return "found JSON, not the Prometheus text format" + (f" ({'; '.join(notes)})" if notes else "")
    if text.lstrip()[:1] == "<":
        return "found HTML or XML, not the Prometheus text format"
    found = sorted({_prefix(m.group(1)) for regex in (_FAMILY, _SAMPLE) for m in regex.finditer(text)})
    if not found:
        return "found no metric families at all" if text.strip() else "found an empty page"
    more = f" and {len(found) - 8} more" if len(found) > 8 else ""
    return f"families found start with: {', '.join(found[:8])}{more}; known engines: {', '.join(names())}"


def _prefix(name: str) -> str:
    """`vllm:x` -> `vllm:`; `python_gc_x` -> `python_`; cut to MAX_PREFIX_CHARS (a 3 MB name was a 3 MB log line)."""
    if ":" in name:
        prefix = name.split(":", 1)[0] + ":"
    else:
        prefix = name.split("_", 1)[0] + "_" if "_" in name else name
    return prefix if len(prefix) <= MAX_PREFIX_CHARS else prefix[:MAX_PREFIX_CHARS] + expfmt.TRUNCATED_MARK

