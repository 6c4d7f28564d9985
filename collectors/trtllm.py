"""The TensorRT-LLM `trtllm-serve` adapter: one `/prometheus/metrics` page in, one EngineSample out.

trtllm-serve has two "metrics" routes (docs/engines.md "trtllm-serve"): `/metrics` answers JSON
iteration stats, the Prometheus text is at `/prometheus/metrics` (only with
`return_perf_metrics: true`; the iteration gauges also need `enable_iter_perf_stats: true`). The
same `trtllm_*` families appear inside a Dynamo TRT-LLM worker's page. Every family is optional:
the 2026 in-tree collector has dozens, a Dynamo worker of January 2026 has five.

Normalization:
- One EngineSeries per `model_name` (rank "0"; trtllm-serve reports no DP rank). `engine_type` and
  the other labels are ignored; `pid` splits (multiprocess mode) take the max for gauges and the
  sum for counters.
- running = `num_requests_running`, waiting = `num_requests_waiting`;
- batch_max_requests = `max_num_active_requests` (else `max_batch_size_runtime`, else `_static`);
- kv_usage_ratio = `kv_cache_utilization`; kv_capacity_tokens = `kv_cache_max_blocks` x
  `kv_cache_tokens_per_block`;
- prompt_tokens_total = `prompt_tokens_total` minus `prompt_cached_tokens_total` where both exist
  (the tokens actually prefilled), else `prompt_tokens_total`; generation_tokens_total =
  `generation_tokens_total`. Both are recorded when a request finishes, so they step per request.
- ttft = `time_to_first_token_seconds`.
- not supported, left None: steps (trtllm-serve has only the last iteration's latency, a gauge kept
  in extra), preemptions (`num_paused_requests` is a gauge of paused requests, in extra), and ITL:
  `time_per_output_token_seconds` is observed once per *request* (its mean decode time per token),
  so its percentiles are over requests, not over tokens; it is not passed off as ITL.
- EngineInfo: tensor_parallel_size from `parallel_config_info`, block size and cache dtype from
  `kv_cache_config_info` / `kv_cache_tokens_per_block`, labels = `model_config_info` and
  `parallel_config_info` labels (model, dtype, quantization, max_model_len, gpu_type, ...).
Values that are NaN, infinite or negative are dropped (None).

Info endpoint: OpenAI `/v1/models` (`data[0].id`); the page itself carries the batch cap and TP.
"""

from __future__ import annotations

from rooflight.collectors import expfmt, registry
from rooflight.collectors.common import (
    MAX_TENSOR_PARALLEL,
    combine_each,
    has_families,
    histogram_names,
    number,
    openai_models_info,
    product,
    read_page,
    within,
)
from rooflight.collectors.samples import EngineInfo, EngineSample, EngineSeries

ENGINE = "trtllm"
METRICS_PATHS = ("/prometheus/metrics",)
DEFAULT_PATH_NOTE = (
    "trtllm-serve answers JSON iteration stats at /metrics; "
    "its Prometheus metrics are at /prometheus/metrics: pass --metrics-path"
)
INFO_PATH = "/v1/models"
parse_info = openai_models_info  # data[0].id
ORDER = 40  # its place in detection and in the coverage table (engines.adapters)
KV_POOL_GROUPED = False  # a pool token holds every layer
SERVICE_FAMILIES = None  # `rooflight rules --engine` and the dashboards read none of its families

# What each normalized field is read from, or why it is missing (EngineAdapter.COVERAGE).
COVERAGE: dict[str, str] = {
    "running": "`trtllm_num_requests_running`",
    "waiting": "`trtllm_num_requests_waiting`",
    "batch_max_requests": "`trtllm_max_num_active_requests`",
    "kv_usage_ratio": "`trtllm_kv_cache_utilization`",
    "kv_capacity_tokens": "`trtllm_kv_cache_max_blocks` x `trtllm_kv_cache_tokens_per_block`",
    "prompt_tokens_total": "`trtllm_prompt_tokens_total` - `trtllm_prompt_cached_tokens_total` (at request end)",
    "generation_tokens_total": "`trtllm_generation_tokens_total` (at request end)",
    "steps_total": "none: only the last iteration's latency (a gauge)",
    "preemptions_total": "none: `trtllm_num_paused_requests` is a gauge",
    "kv_transfer_failures_total": "none: not on trtllm-serve's page",
    "ttft": "`trtllm_time_to_first_token_seconds`",
    "itl": "none: `time_per_output_token_seconds` is per request, not per token",
    "tensor_parallel_size": "`trtllm_parallel_config_info{tensor_parallel_size}`",
    "prefix_cache_hits_total": "none: not read yet (`trtllm_prompt_cached_tokens_total`)",
    "prompt_length": "none: no length histogram (only `trtllm_prompt_cached_tokens_per_request`)",
    "output_length": "none: no length histogram",
    "queue_time": "none: not read yet (`trtllm_request_queue_time_seconds`)",
}

_P = "trtllm_"
RUNNING = _P + "num_requests_running"
WAITING = _P + "num_requests_waiting"
BATCH_MAX = (_P + "max_num_active_requests", _P + "max_batch_size_runtime", _P + "max_batch_size_static")
KV_USAGE = _P + "kv_cache_utilization"
KV_BLOCKS = _P + "kv_cache_max_blocks"
KV_TOKENS_PER_BLOCK = _P + "kv_cache_tokens_per_block"
PROMPT = _P + "prompt_tokens_total"
PROMPT_CACHED = _P + "prompt_cached_tokens_total"
GENERATION = _P + "generation_tokens_total"
TTFT = _P + "time_to_first_token_seconds"
MODEL_CONFIG = _P + "model_config_info"
PARALLEL_CONFIG = _P + "parallel_config_info"
KV_CONFIG = _P + "kv_cache_config_info"

EXTRA_GAUGES: dict[str, str] = {
    "iteration_latency_seconds": _P + "iteration_latency_seconds",
    "paused_requests": _P + "num_paused_requests",
    "gpu_memory_usage_bytes": _P + "gpu_memory_usage_bytes",
    "max_num_tokens_runtime": _P + "max_num_tokens_runtime",
    "spec_decode_acceptance_length": _P + "spec_decode_acceptance_length",
}
EXTRA_COUNTERS: dict[str, str] = {
    "prompt_tokens_all_total": PROMPT,
    "prompt_tokens_cached_total": PROMPT_CACHED,
    "requests_success_total": _P + "request_success_total",
    "spec_decode_num_draft_tokens_total": _P + "spec_decode_num_draft_tokens_total",
    "spec_decode_num_accepted_tokens_total": _P + "spec_decode_num_accepted_tokens_total",
}
_INFOS = (MODEL_CONFIG, PARALLEL_CONFIG, KV_CONFIG)

NAMES: frozenset[str] = frozenset(
    {
        RUNNING,
        WAITING,
        *BATCH_MAX,
        KV_USAGE,
        KV_BLOCKS,
        KV_TOKENS_PER_BLOCK,
        GENERATION,
        *_INFOS,
        *EXTRA_GAUGES.values(),
        *EXTRA_COUNTERS.values(),
        *histogram_names(TTFT),
    }
)


def recognises(text: str) -> bool:
    """True when the page carries `trtllm_` families (trtllm-serve, or passed through by Dynamo)."""
    return has_families(text, _P)


def parse(text: str, *, target: str, timestamp: float, duration: float) -> EngineSample:
    """Normalize one trtllm-serve exposition. ParseError when it holds no `trtllm_` family read here."""
    exp = read_page(text, (_P,), NAMES)
    g = {n: _values(exp, n, gauge=True) for n in (RUNNING, WAITING, *BATCH_MAX, KV_USAGE, KV_BLOCKS, KV_TOKENS_PER_BLOCK)}
    generation = _values(exp, GENERATION, gauge=False)
    extras = {k: _values(exp, n, gauge=True) for k, n in EXTRA_GAUGES.items()}
    extras.update({k: _values(exp, n, gauge=False) for k, n in EXTRA_COUNTERS.items()})
    ttft = expfmt.histograms(exp, TTFT, lambda labels: labels.get("model_name", ""))

    models: set[str] = set(ttft)
    for table in (*g.values(), generation, *extras.values()):
        models.update(table)
    series = []
    for model in sorted(models):
        extra = {k: table[model] for k, table in extras.items() if model in table}
        prompt = extra.get("prompt_tokens_all_total")
        cached = extra.get("prompt_tokens_cached_total")
        if prompt is not None and cached is not None and cached <= prompt:
            prompt -= cached
        blocks, per_block = g[KV_BLOCKS].get(model), g[KV_TOKENS_PER_BLOCK].get(model)
        batch_max = next((g[n][model] for n in BATCH_MAX if model in g[n]), None)
        series.append(
            EngineSeries(
                model=model,
                running=g[RUNNING].get(model),
                waiting=g[WAITING].get(model),
                batch_max_requests=batch_max,
                kv_usage_ratio=g[KV_USAGE].get(model),
                kv_capacity_tokens=product(blocks, per_block),
                prompt_tokens_total=prompt,
                generation_tokens_total=generation.get(model),
                ttft=ttft.get(model),
                extra=extra,
            )
        )
    per_block = [v for v in g[KV_TOKENS_PER_BLOCK].values()]
    return EngineSample(
        target=target, engine=ENGINE, timestamp=timestamp, duration=duration, series=tuple(series),
        info=engine_info(exp, per_block[0] if per_block else None),
    )


def engine_info(exp: expfmt.Selection, tokens_per_block: float | None) -> EngineInfo:
    """TP size, KV block size and dtype, and the config-info labels (first series of each)."""
    labels: dict[str, str] = {}
    for name in (MODEL_CONFIG, PARALLEL_CONFIG):
        for s in exp.get(name)[:1]:
            labels.update({k: v for k, v in s.labels.items() if k not in ("pid", "engine_type", "model_name")})
    kv = exp.get(KV_CONFIG)[:1]
    kv_labels = kv[0].labels if kv else {}
    dtype = kv_labels.get("cache_dtype")
    return EngineInfo(
        kv_block_size_tokens=tokens_per_block if tokens_per_block is not None else number(kv_labels.get("page_size")),
        kv_cache_dtype=dtype if dtype not in (None, "", "None", "auto") else None,
        tensor_parallel_size=int(tp) if (tp := within(number(labels.get("tensor_parallel_size")),
                                                      MAX_TENSOR_PARALLEL)) else None,
        labels=labels,
    )


def _values(exp: expfmt.Selection, name: str, *, gauge: bool) -> dict[str, float]:
    """One value per model. Counters are summed over their other labels (`finished_reason`, `pid`);
    gauges take the max over them (a `pid` split mirrors one engine state)."""
    per: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for s in exp.get(name):
        rest = tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model_name", "engine_type")))
        per.setdefault(s.labels.get("model_name", ""), {})[rest] = s.value
    return combine_each(per, gauge=gauge)


registry.register(__name__)
