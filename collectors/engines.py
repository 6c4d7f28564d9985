"""The engine adapters the agent knows, the protocol each one satisfies, and auto-detection.

An adapter is a module of collectors/ that satisfies `EngineAdapter` with module-level names: it
owns every fact about its engine (where the page is, what each normalized field is read from, the
JSON info endpoint and its parser, the families the Prometheus rules and dashboards read directly).
Nothing outside the module knows them: the engine loop, the detection below, the coverage table of
docs/engines.md, the rules and the dashboards read them through the protocol. Each adapter adds
itself to the registry here (`register(__name__)` at the end of its module), as node_exporter's
collectors do; `_load` imports them all. Adding an engine is one new module and its name in
`_load`'s import (docs/engines.md "Adding an engine"); tests/collectors/test_engines_registry.py
fails when a module of collectors/ that declares an ENGINE is left out of either.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, runtime_checkable

from rooflight.collectors import expfmt
from rooflight.collectors.errors import ParseError
from rooflight.collectors.samples import EngineInfoHints, EngineSample

DEFAULT_METRICS_PATH = "/metrics"  # the Prometheus convention, where `--engine auto` looks first


@dataclass(frozen=True)
class Histogram:
    """One of the engine's own histograms as Prometheus stores it: the base name (the rules read
    `<name>_bucket` and `<name>_count`) and the bucket edges the engine exports by default."""

    name: str
    edges: tuple[float, ...]  # upstream's defaults, as the recorded pages carry them; () = unknown


@dataclass(frozen=True)
class ServiceFamilies:
    """The engine's own families that the Prometheus rules and the dashboards read directly, not
    through the agent: the latency histograms the SLOs judge, and the request counters the
    availability SLO divides (rules/availability.py)."""

    ttft: Histogram
    itl: Histogram
    requests_failed: str  # a selector: the finished requests that count as failures
    requests_finished: str  # every finished request (also the dashboards' request rate)
    prefill: Histogram | None = None  # time in prefill per request, where the engine exports it


@runtime_checkable
class EngineAdapter(Protocol):
    """What the agent needs from an engine's adapter; an adapter module satisfies it with module-level
    names (the facts are read-only, hence properties here and plain constants there)."""

    @property
    def ENGINE(self) -> str:  # noqa: N802 - a module constant in the adapter
        """The `--engine` name and the `engine` label value."""
        ...

    @property
    def METRICS_PATHS(self) -> tuple[str, ...]:  # noqa: N802
        """Where the engine serves its Prometheus text page, preferred first."""
        ...

    @property
    def DEFAULT_PATH_NOTE(self) -> str | None:  # noqa: N802
        """What to tell a user whose /metrics answered JSON, when this engine does that (trtllm-serve)."""
        ...

    @property
    def INFO_PATH(self) -> str | None:  # noqa: N802
        """The JSON route that states what /metrics does not (batch cap, model, context, TP), if any."""
        ...

    @property
    def COVERAGE(self) -> Mapping[str, str]:  # noqa: N802
        """Normalized field -> the wire metric it is read from, or "none: <why>" (docs/engines.md's table)."""
        ...

    @property
    def ORDER(self) -> int:  # noqa: N802
        """Its place in detection and in the coverage table's columns, lowest first."""
        ...

    @property
    def SERVICE_FAMILIES(self) -> ServiceFamilies | None:  # noqa: N802
        """What `rooflight rules --engine` and the dashboards read from the engine's own page; None
        where they read none of its families."""
        ...

    def recognises(self, text: str) -> bool:
        """True when the page carries this engine's families (cheap: a prefix check, no parse)."""
        ...

    def parse(self, text: str, *, target: str, timestamp: float, duration: float) -> EngineSample:
        """The page normalized; ParseError when it holds none of the families read."""
        ...

    def parse_info(self, data: Any) -> EngineInfoHints:
        """Hints from the decoded JSON of INFO_PATH; any odd document gives empty hints, never an error."""
        ...


# The registry: engine name -> its adapter, filled by register() as each adapter module is imported.
_REGISTRY: dict[str, EngineAdapter] = {}

MAX_PREFIX_CHARS = 64  # a family prefix in the "not a known engine" message: real ones are a word
_FAMILY = re.compile(r"^# (?:TYPE|HELP) ([a-zA-Z_:][a-zA-Z0-9_:]*)", re.MULTILINE)
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", re.MULTILINE)


def register(module_name: str) -> None:
    """Add the adapter module `module_name` (its `__name__`) to the registry: the last line of every
    adapter. TypeError when the module breaks the protocol, ValueError when its ENGINE is taken."""
    module = sys.modules[module_name]
    if not isinstance(module, EngineAdapter):
        missing = [n for n in _PROTOCOL_NAMES if not hasattr(module, n)]
        raise TypeError(f"{module_name} is not an EngineAdapter (missing: {', '.join(missing)})")
    known = _REGISTRY.get(module.ENGINE)
    if known is not None and known is not module:
        raise ValueError(f"{module_name}: engine {module.ENGINE!r} is already registered by {known.__name__}")
    _REGISTRY[module.ENGINE] = module


def _load() -> dict[str, EngineAdapter]:
    """The registry, once every adapter module has been imported (each registers itself on import).
    The order they are imported in does not matter: ORDER does."""
    from rooflight.collectors import dynamo, llamacpp, sglang, tgi, triton_trtllm, trtllm, vllm  # noqa: F401

    return _REGISTRY


def names() -> tuple[str, ...]:
    """Every known engine name, in detection order."""
    return tuple(a.ENGINE for a in adapters())


def adapter(engine: str) -> EngineAdapter:
    """The adapter for an engine name (`vllm`, `sglang`, ...); ValueError naming the known ones if none."""
    try:
        return _load()[engine]
    except KeyError:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(names())}, auto") from None


def adapters() -> tuple[EngineAdapter, ...]:
    """Every adapter, in detection order: by ORDER. A Dynamo worker passes an engine's metrics through,
    so Dynamo goes first; the others own disjoint prefixes (vllm:, sglang:, trtllm_, nv_trt_llm_ /
    nv_inference_, tgi_, llamacpp:), so their order only decides odd pages that mix engines."""
    return tuple(sorted(_load().values(), key=lambda a: (a.ORDER, a.ENGINE)))


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


_PROTOCOL_NAMES = tuple(n for n in EngineAdapter.__dict__ if n.isupper() or n in ("recognises", "parse", "parse_info"))
