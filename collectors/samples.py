"""The normalized, immutable samples every collector produces.

An adapter's whole job is to turn its source's native format into one of these. `None` always means
"this source does not say", never zero: the agent exports nothing for a value it was not given.
Counters are raw cumulative values as the source reported them; reset handling lives in the
windows, not here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

# A setting's value as exported (a label value of rooflight_engine_config_info): cut to this length.
MAX_SETTING_CHARS = 64


@dataclass(frozen=True, slots=True)
class Histogram:
    """A cumulative histogram as Prometheus exposes it.

    `buckets` holds (upper bound, cumulative count) pairs sorted by bound; the last bound is +Inf.
    """

    buckets: tuple[tuple[float, float], ...]
    count: float
    sum: float


@dataclass(frozen=True, slots=True)
class EngineSeries:
    """One model on one data-parallel rank of one engine endpoint."""

    model: str
    rank: str = "0"
    running: float | None = None
    waiting: float | None = None
    waiting_by_reason: Mapping[str, float] = field(default_factory=dict)
    batch_max_requests: float | None = None
    kv_usage_ratio: float | None = None
    kv_capacity_tokens: float | None = None
    prompt_tokens_total: float | None = None  # computed prefill tokens (cache hits excluded where known)
    # True where prompt_tokens_total counts prefix-cache hits as prompt tokens (the engine has no counter
    # of computed ones): the physics takes the hit ratio out, or marks prefill MFU as overstated.
    prompt_tokens_include_cache_hits: bool = False
    generation_tokens_total: float | None = None
    steps_total: float | None = None
    preemptions_total: float | None = None
    # KV transfers between prefill and decode instances that failed (disaggregated serving): the engine
    # recomputes the prompt or fails the request; vLLM's NIXL connector and SGLang count them.
    kv_transfer_failures_total: float | None = None
    ttft: Histogram | None = None
    itl: Histogram | None = None
    # Tokens each engine step ran, one observation per step (vLLM's iteration_tokens_total): the
    # head-of-line detector's largest step since the previous sample (docs/physics.md).
    step_tokens: Histogram | None = None
    # Prefix cache, in prompt tokens: looked up, and found (hits). Where an engine keeps no counters,
    # its own ratio gauge (SGLang's cache_hit_rate: the last prefill batch only) stands in.
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None
    prefix_cache_hit_ratio: float | None = None
    # Per-request distributions, one observation per finished request: prompt and output lengths
    # (tokens) and the time from arrival to first scheduling (seconds).
    prompt_length: Histogram | None = None
    output_length: Histogram | None = None
    queue_time: Histogram | None = None
    # The memory and scheduler settings this rank's page tells (engine spelling, see settings_from).
    settings: Mapping[str, str] = field(default_factory=dict)
    # Engine-specific counters and gauges the physics may use (e.g. vLLM's estimated_flops_per_gpu).
    extra: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """What the exposition says about the engine's configuration (all optional)."""

    kv_block_size_tokens: float | None = None
    kv_cache_dtype: str | None = None
    tensor_parallel_size: int | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    # A disaggregated pool's part where the page itself says ("prefill" or "decode"; e.g. a Dynamo worker
    # whose component is `prefill`); the agent takes it where neither the setting nor the info endpoint says.
    role: str | None = None


@dataclass(frozen=True, slots=True)
class EngineInfoHints:
    """What an engine's JSON info endpoint says (batch cap, model, context, TP); None for whatever it does not.

    No engine but TRT-LLM and Dynamo exports its batch cap or model on /metrics, so the agent reads
    the adapter's INFO_PATH once at start and every few minutes (docs/engines.md "Model and batch
    cap: info endpoints").
    """

    batch_max_requests: int | None = None
    model_id: str | None = None
    max_model_len: int | None = None
    tensor_parallel_size: int | None = None
    # A disaggregated pool's part where the engine's config says: "prefill", "decode" or "both" (e.g.
    # SGLang's /server_info disaggregation_mode, vLLM's kv_transfer_config kv_role where exposed).
    role: str | None = None
    # The memory and scheduler settings the endpoint tells (engine spelling, see settings_from).
    settings: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EngineSample:
    """One scrape of one engine endpoint.

    `timestamp` is unix seconds at the moment the engine answered (the midpoint of the request),
    so rates use real times even when `/metrics` takes seconds under load.
    """

    target: str
    engine: str
    timestamp: float
    duration: float
    series: tuple[EngineSeries, ...]
    info: EngineInfo = field(default_factory=EngineInfo)


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One GPU (or MIG instance) as NVML reports it; None where the call is unsupported or failed."""

    index: int
    uuid: str
    name: str
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    memory_reserved_bytes: float | None = None
    kernel_residency_ratio: float | None = None
    dram_bandwidth_utilization_ratio: float | None = None
    # Further per-device readings by metric suffix (sm_active_ratio, power_watts, ...); the NVML
    # collector documents each key. Keeps this type stable as the GPU side deepens.
    extra: Mapping[str, float] = field(default_factory=dict)
    info: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GpuSample:
    timestamp: float
    duration: float
    devices: tuple[GpuDevice, ...]
    driver_version: str | None = None


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """The engine's process tree, as psutil sees it."""

    timestamp: float
    pid: int
    cpu_seconds_total: float
    rss_bytes: float
    num_threads: int
    gpu_pids: tuple[int, ...] = ()


def setting_value(value: Any) -> str | None:
    """One setting as a label value: booleans as true/false (vLLM writes "True", JSON true), whole
    numbers without ".0", other finite numbers as Python prints them, strings as written, all cut to
    MAX_SETTING_CHARS (1e308 as a whole number is 309 digits). None for what says nothing: null, "None",
    blanks, NaN, lists and objects."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)[:MAX_SETTING_CHARS]
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return (str(int(value)) if value.is_integer() else repr(value))[:MAX_SETTING_CHARS]
    if not isinstance(value, str):
        return None
    text = value.strip()
    if text in ("True", "False"):
        return text.lower()
    if not text or text in ("None", "null", "none"):
        return None
    return text[:MAX_SETTING_CHARS]


def settings_from(values: Mapping[str, Any], keys: Iterable[str]) -> dict[str, str]:
    """The settings among `keys` (an adapter's fixed allowlist, which keeps the info metric's labels
    few and known) that `values` states, normalized by setting_value."""
    out = {}
    for key in keys:
        value = setting_value(values.get(key))
        if value is not None:
            out[key] = value
    return out
