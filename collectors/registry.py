"""The protocol every engine adapter satisfies, and the registry each one adds itself to.

An adapter is a module of collectors/ that satisfies `EngineAdapter` with module-level names: it
owns every fact about its engine (where the page is, what each normalized field is read from, the
JSON info endpoint and its parser, the families the Prometheus rules and dashboards read directly).
Its last line is `registry.register(__name__)`, as node_exporter's collectors register themselves;
collectors/engines.py imports every adapter module and serves them from here. This module imports
no adapter, so an adapter can import it without a cycle.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, runtime_checkable

from rooflight.collectors.samples import EngineInfoHints, EngineSample


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
    # The API server's HTTP responses to inference routes, by `status` class ("5xx"), where it counts them:
    # the clients' availability SLO reads them where no proxy of Rooflight's stands in front (rules/availability.py).
    http_requests: str = ""

    @property
    def namespace(self) -> str:
        """The prefix of the engine's family names (`vllm:`), as its TTFT histogram spells it: what tells a
        query's engine families from its other names (dashboards/metrics.py)."""
        name = self.ttft.name
        return name[: name.index(":") + 1] if ":" in name else name.split("_", 1)[0] + "_"


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
    def KV_POOL_GROUPED(self) -> bool:  # noqa: N802
        """Whether a KV pool token holds one attention-type group of a hybrid model's layers rather than
        every layer (vLLM's hybrid KV-cache manager): the live KV bytes and MBU count one group."""
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
_PROTOCOL_NAMES = tuple(n for n in EngineAdapter.__dict__ if n.isupper() or n in ("recognises", "parse", "parse_info"))


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


def registered() -> tuple[EngineAdapter, ...]:
    """Every adapter registered so far, in detection order: by ORDER, then name (not import order)."""
    return tuple(sorted(_REGISTRY.values(), key=lambda a: (a.ORDER, a.ENGINE)))
