"""Which metric names a dashboard may query, and how to find the names inside a PromQL string.

Owns four things: the list of extra NVML gauges the GPU dashboard reads (`rooflight_gpu_<key>`, kept here
in one place so the registry test can hold the exposition to it); the names a Rooflight process can export
(the agent's catalog and the proxy's, `rooflight_client_*`, histograms with their _bucket/_sum/_count
series); `metric_names()`, which pulls every metric name out of an expression so tests can check each one against
them and the recorded engine expositions; and `record_names()`, the recording rules an expression reads,
to check against the rules rules/ ships.
"""

from __future__ import annotations

import re

from rooflight.agent.metrics import names
from rooflight.collectors import engines

# Extra per-GPU gauges (labels: gpu, uuid) the GPU dashboard reads, by NVML key. The exposition names
# them rooflight_gpu_<key>; collectors/nvml.py declares them (GPU_EXTRA_METRICS); see pending_gpu_metrics.
GPU_EXTRA_KEYS: tuple[str, ...] = (
    "sm_active_ratio",  # GPM SM activity: share of SM cycles with a warp resident
    "tensor_active_ratio",  # GPM tensor-core activity: the hardware cousin of MFU
    "clock_sm_hertz",
    "clock_memory_hertz",
    "power_watts",
    "power_limit_watts",
    "clock_event_reasons",  # NVML clocksEventReasons bitmask; 0 = clocks free to run at max
    # health (the GPU health alerts' inputs, rules/health.py)
    "xid_errors_total",
    "ecc_uncorrected_errors_total",
    "remapped_rows_uncorrectable",
    "remapped_rows_pending",
    "remapped_rows_failure",
    "temperature_celsius",
)

GPU_EXTRA: dict[str, str] = {key: f"{names.PREFIX}gpu_{key}" for key in GPU_EXTRA_KEYS}

# Series Prometheus itself creates (rule evaluation; `up` for every scrape); not exported by anyone.
PROMETHEUS_BUILTINS: frozenset[str] = frozenset({"ALERTS", "ALERTS_FOR_STATE", "up"})

# The engines' own families a query may read directly: those of every adapter with ServiceFamilies (vllm:*,
# sglang:*), by the prefix its adapter declares (collectors/registry.py).
_ENGINE_FAMILIES = "".join(f"|{re.escape(a.SERVICE_FAMILIES.namespace)}[a-z0-9_:]+"
                           for a in engines.adapters() if a.SERVICE_FAMILIES is not None)
_NAME = re.compile(
    r"(?<![A-Za-z0-9_:\"'])"  # not inside another identifier or right after a quote
    rf"(rooflight_[a-z0-9_]+{_ENGINE_FAMILIES}|ALERTS(?:_FOR_STATE)?"
    r"|up(?=[{\[]))"  # Prometheus' `up`, only as a selector
    r"(?![A-Za-z0-9_:])"
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')


def metric_names(expr: str) -> set[str]:
    """Every metric name an expression selects (string literals, e.g. label values, are ignored)."""
    return set(_NAME.findall(_STRING.sub('""', expr)))


# A recording rule's level:metric:operations name (prometheus.io/docs/practices/rules), for one of ours.
_RECORD = re.compile(r"(?<![A-Za-z0-9_:\"'])([a-z][a-z0-9_]*:rooflight_[a-z0-9_]+:[a-z0-9_]+)(?![A-Za-z0-9_:])")


def record_names(expr: str) -> set[str]:
    """Every Rooflight recording rule an expression selects (`model:rooflight_mbu:ratio_rate5m`)."""
    return set(_RECORD.findall(_STRING.sub('""', expr)))


def declared_rooflight_metrics() -> set[str]:
    """Every `rooflight_*` name Rooflight can export: the agent's catalog (with the NVML collector's extra
    gauges) and the proxy's client-side series (`rooflight proxy`, or `rooflight run` with the proxy on)."""
    from rooflight.agent.metrics.catalog import all_defs

    return {d.name for d in all_defs()} | declared_client_metrics()


def declared_client_metrics() -> set[str]:
    """The proxy's `rooflight_client_*` series as PromQL selects them: a histogram by its _bucket, _sum
    and _count series, every other metric by its exposed name (counters with _total)."""
    from rooflight.agent.proxy.catalog import CATALOG

    out: set[str] = set()
    for d in CATALOG:
        suffixes = ("_bucket", "_sum", "_count") if d.type == "histogram" else ("",)
        out.update(d.name + suffix for suffix in suffixes)
    return out


def pending_gpu_metrics() -> set[str]:
    """GPU_EXTRA names the agent does not export."""
    return set(GPU_EXTRA.values()) - declared_rooflight_metrics()
