"""The Triton Inference Server adapter (TensorRT-LLM backend): one Triton `/metrics` page in.

Triton serves its metrics on their own port (default 8002). The TRT-LLM backend adds `nv_trt_llm_*`
gauges, one family per category with the category as a label (docs/engines.md "Triton"), next to
Triton core's per-model `nv_inference_*` counters. Labels: `model` (the Triton model name, e.g.
`tensorrt_llm`), `version`, and the category label.

Normalization (one EngineSeries per Triton model that has `nv_trt_llm_*` series; rank "0"):
- running = `nv_trt_llm_request_metrics{request_type="active"}` (requests in the in-flight batch;
  "scheduled" is the subset scheduled this iteration, kept in extra); waiting = `{…="waiting"}`;
  batch_max_requests = `{…="max"}`;
- kv_usage_ratio = `nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}`;
  kv_capacity_tokens = `max` blocks x `tokens_per` block;
- steps_total = `nv_trt_llm_general_metrics{general_type="iteration_counter"}`: declared a gauge,
  but it holds the executor's monotonically increasing iteration count;
- prompt/generation tokens = `nv_llm_input_token_len_sum` / `nv_llm_output_token_len_sum`
  (per-request histograms of newer backends; absent from 23.11-era pages). The V1 model's
  `total_generation_tokens` is a per-iteration gauge, not a counter: extra only.
- not supported, left None: preemptions (`paused_requests` is a gauge, in extra), TTFT and ITL (the
  backend has no latency histograms; Triton core's durations are cumulative microsecond counters).
- A page with Triton core metrics but no `nv_trt_llm_*` (another backend, or a core-only excerpt)
  gives one series per model with only extras (request and inference counters, pending requests),
  every engine field None: Triton core knows nothing of batches, tokens or KV.
Values that are NaN, infinite or negative are dropped (None). Several `version` labels of one
model: the highest version wins.

Info endpoint: none. Triton's model configuration is not an LLM info document; the page carries
the batch cap.
"""

from __future__ import annotations

from rooflight.collectors import expfmt, registry
from rooflight.collectors.common import good, has_samples, no_info, product, read_page
from rooflight.collectors.samples import EngineInfo, EngineSample, EngineSeries

ENGINE = "triton"
METRICS_PATHS = ("/metrics",)  # Triton's own metrics port, 8002 by default
DEFAULT_PATH_NOTE = None
INFO_PATH = None
parse_info = no_info
ORDER = 50  # its place in detection and in the coverage table (engines.adapters)
KV_POOL_GROUPED = False  # a pool token holds every layer
SERVICE_FAMILIES = None  # `rooflight rules --engine` and the dashboards read none of its families

# What each normalized field is read from, or why it is missing (EngineAdapter.COVERAGE).
COVERAGE: dict[str, str] = {
    "running": "`nv_trt_llm_request_metrics{request_type=\"active\"}`",
    "waiting": "`nv_trt_llm_request_metrics{request_type=\"waiting\"}`",
    "batch_max_requests": "`nv_trt_llm_request_metrics{request_type=\"max\"}`",
    "kv_usage_ratio": "`nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"fraction\"}`",
    "kv_capacity_tokens": "`…{kv_cache_block_type=\"max\"}` x `…{kv_cache_block_type=\"tokens_per\"}`",
    "prompt_tokens_total": "`nv_llm_input_token_len_sum` (newer backends, at request end)",
    "generation_tokens_total": "`nv_llm_output_token_len_sum` (newer backends, at request end)",
    "steps_total": "`nv_trt_llm_general_metrics{general_type=\"iteration_counter\"}`",
    "preemptions_total": "none: `paused_requests` is a gauge",
    "kv_transfer_failures_total": "none: not on Triton's page",
    "ttft": "none: the backend has no latency histograms",
    "itl": "none: the backend has no latency histograms",
    "tensor_parallel_size": "none: not exported",
    "prefix_cache_hits_total": "none: not read yet (`…{kv_cache_block_type=\"reused\"}` counts blocks)",
    "prompt_length": "none: not read yet (`nv_llm_input_token_len`)",
    "output_length": "none: not read yet (`nv_llm_output_token_len`)",
    "queue_time": "none: the backend has no latency histograms",
}

REQUESTS = "nv_trt_llm_request_metrics"
KV_BLOCKS = "nv_trt_llm_kv_cache_block_metrics"
GENERAL = "nv_trt_llm_general_metrics"
IFB = "nv_trt_llm_inflight_batcher_metrics"
V1 = "nv_trt_llm_v1_metrics"
MEMORY = "nv_trt_llm_runtime_memory_metrics"
INPUT_LEN_SUM = "nv_llm_input_token_len_sum"
OUTPUT_LEN_SUM = "nv_llm_output_token_len_sum"
CORE_COUNTERS: dict[str, str] = {
    "requests_success_total": "nv_inference_request_success",
    "requests_failure_total": "nv_inference_request_failure",
    "inferences_total": "nv_inference_count",
    "executions_total": "nv_inference_exec_count",
    "request_duration_microseconds_total": "nv_inference_request_duration_us",
    "queue_duration_microseconds_total": "nv_inference_queue_duration_us",
}
CORE_GAUGES: dict[str, str] = {"pending_requests": "nv_inference_pending_request_count"}
# (family, category label) -> extra key prefix for every category value not normalized above.
_CATEGORIES = {
    REQUESTS: "request_type",
    KV_BLOCKS: "kv_cache_block_type",
    GENERAL: "general_type",
    IFB: "inflight_batcher_specific_metric",
    V1: "v1_specific_metric",
    MEMORY: "memory_type",
}

NAMES: frozenset[str] = frozenset(
    {*_CATEGORIES, INPUT_LEN_SUM, OUTPUT_LEN_SUM, *CORE_COUNTERS.values(), *CORE_GAUGES.values()}
)


def recognises(text: str) -> bool:
    """True for a Triton page: TRT-LLM backend families, or Triton core's `nv_inference_` ones."""
    return has_samples(text, "nv_trt_llm_", "nv_inference_")


def parse(text: str, *, target: str, timestamp: float, duration: float) -> EngineSample:
    """Normalize one Triton exposition. ParseError when it holds no family read here."""
    exp = read_page(text, ("nv_",), NAMES, what="nv_trt_llm_ or nv_inference_")
    cats = {fam: _by_category(exp, fam, label) for fam, label in _CATEGORIES.items()}
    trt_models = {m for table in cats.values() for m in table}
    core = {k: _by_model(exp, n) for k, n in (*CORE_COUNTERS.items(), *CORE_GAUGES.items())}
    tokens_in, tokens_out = _by_model(exp, INPUT_LEN_SUM), _by_model(exp, OUTPUT_LEN_SUM)
    models = trt_models or {m for table in core.values() for m in table}

    series = []
    for model in sorted(models):
        req = cats[REQUESTS].get(model, {})
        kv = cats[KV_BLOCKS].get(model, {})
        extra = {k: table[model] for k, table in core.items() if model in table}
        for fam, label in _CATEGORIES.items():
            for part, value in cats[fam].get(model, {}).items():
                extra[f"{label}_{part}"] = value
        blocks, per_block = kv.get("max"), kv.get("tokens_per")
        series.append(
            EngineSeries(
                model=model,
                running=req.get("active"),
                waiting=req.get("waiting"),
                batch_max_requests=req.get("max"),
                kv_usage_ratio=kv.get("fraction"),
                kv_capacity_tokens=product(blocks, per_block),
                prompt_tokens_total=tokens_in.get(model),
                generation_tokens_total=tokens_out.get(model),
                steps_total=cats[GENERAL].get(model, {}).get("iteration_counter"),
                extra=extra,
            )
        )
    per_block = [kv["tokens_per"] for kv in cats[KV_BLOCKS].values() if "tokens_per" in kv]
    return EngineSample(
        target=target, engine=ENGINE, timestamp=timestamp, duration=duration, series=tuple(series),
        info=EngineInfo(kv_block_size_tokens=per_block[0] if per_block else None),
    )


def _version(labels: dict[str, str]) -> int:
    v = labels.get("version", "")
    return int(v) if v.isdecimal() else -1


def _by_category(exp: expfmt.Selection, name: str, label: str) -> dict[str, dict[str, float]]:
    """model -> category value -> value (highest model version)."""
    best: dict[tuple[str, str], tuple[int, float]] = {}
    for s in exp.get(name):
        part = s.labels.get(label)
        if part is None:
            continue
        key = (s.labels.get("model", ""), part)
        v = _version(s.labels)
        if key not in best or v >= best[key][0]:
            best[key] = (v, s.value)
    out: dict[str, dict[str, float]] = {}
    for (model, part), (_, value) in best.items():
        if good(value):
            out.setdefault(model, {})[part] = value
    return out


def _by_model(exp: expfmt.Selection, name: str) -> dict[str, float]:
    """model -> value of the highest version, summed over any other label (e.g. response_metric_type)."""
    per: dict[str, dict[int, float]] = {}
    for s in exp.get(name):
        versions = per.setdefault(s.labels.get("model", ""), {})
        v = _version(s.labels)
        versions[v] = versions.get(v, 0.0) + s.value
    return {m: vs[max(vs)] for m, vs in per.items() if good(vs[max(vs)])}


registry.register(__name__)
