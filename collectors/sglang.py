"""The SGLang adapter (0.5.x, and the late-2024 names): one `/metrics` page in, one EngineSample out.

SGLang runs prometheus_client in multiprocess mode (docs/engines.md "SGLang"): no `_created`,
and gauges registered without `multiprocess_mode` carry a `pid` label. Scheduler series carry
`model_name` (2024: `name`), `engine_type`, `tp_rank`, `pp_rank`, `moe_ep_rank` and, with data
parallelism, `dp_rank`; tokenizer-side series (TTFT, ITL, finish-time token counters) carry
`model_name` and `is_streaming` only.

Normalization:
- One EngineSeries per (model, rank); rank = `dp_rank` ("0" when absent).
- Tensor/pipeline ranks are replicas of one logical scheduler: by default only rank 0 reports, with
  `--enable-metrics-for-all-schedulers` every rank reports the same batch. The lowest
  (pp_rank, tp_rank, attn_cp_rank, moe_ep_rank) series is read and the others ignored, never
  summed. When several `tp_rank` values are seen, EngineInfo.tensor_parallel_size = max + 1;
  with one, TP is not knowable from the page (None).
- `pid` splits: gauges take the max over pids, counters the sum (as the vLLM adapter).
- running = `num_running_reqs`, waiting = `num_queue_reqs` (grammar and PD queues stay in extra);
- kv_usage_ratio = `token_usage` (the max over the full/SWA/mamba pools); kv_capacity_tokens =
  `max_total_num_tokens`; EngineInfo.kv_block_size_tokens = `page_size`;
- prompt_tokens_total = `realtime_tokens_total{mode="prefill_compute"}`, generation_tokens_total =
  `realtime_tokens_total{mode="decode"}`: updated per prefill batch and per decode log interval.
  Only where the page has no realtime counter (SGLang before 2025) the finish-time counters
  `prompt_tokens_total` / `generation_tokens_total` stand in; they step when a request ends, and
  the prompt one counts cache hits too (prompt_tokens_include_cache_hits: the physics takes the
  `cache_hit_rate` gauge's mean out of prefill work). extra["token_counters"] says which: 1 = realtime,
  0 = finish-time.
- steps_total = sum over `mode` of `cuda_graph_passes_total` (every forward pass, CUDA graph or
  not); absent in old versions (None).
- preemptions_total = `num_retracted_requests_total` (SGLang says "retraction"); None where only
  the per-batch gauge exists.
- ttft = `time_to_first_token_seconds`, itl = `inter_token_latency_seconds` (2024:
  `time_per_output_token_seconds`, the same per-token quantity), summed over `is_streaming`. These
  come from the one tokenizer process for the whole server: with DP they are attached to rank "0"
  and cover every rank.
- prefix cache: queries = `realtime_tokens_total` modes prefill_cache + prefill_compute, hits =
  prefill_cache (tokens, per prefill batch); where the page has no realtime counter, the
  `cache_hit_rate` gauge (the last prefill batch's ratio) stands in as prefix_cache_hit_ratio.
- queue_time = `queue_time_seconds` (scheduler side: the lowest replica's, per dp_rank);
  prompt_length / output_length = `prompt_tokens_histogram` / `generation_tokens_histogram`
  (tokenizer side, only with `--collect-tokens-histogram`; on rank "0", as TTFT).
- batch cap: not exported (`max_running_requests` is in `/server_info`, read by parse_info).
- extra: realtime prefill cache tokens, finish-time counters, retracted tokens, spec-decode gauges
  (last batch only: no counters to rate), context length.
- KV transfer (disaggregated prefill/decode), into extra: the gauges `kv_transfer_latency_ms`,
  `kv_transfer_speed_gb_s`, `kv_transfer_bootstrap_ms`, `kv_transfer_alloc_ms`, `kv_transfer_total_mb`
  (the last transfer's, as pages of early 2026 have them) under their own names; a value of 0 is the
  gauge never set (no transfer yet, or a `unified` engine) and is dropped. SGLang 0.5.23 makes
  latency and speed histograms: their `_sum` and `_count` (the lowest replica's, as queue time) go to
  extra as counters `<name>_sum_total` / `<name>_count_total`, so a window can take the mean per
  transfer.
Values that are NaN, infinite or negative are dropped (None).

Info endpoint: `/server_info` (older: `/get_server_info`), the server args flattened: `model_path`,
`tp_size`, `context_length`, `max_running_requests`. The last two are null when left to SGLang to
choose; the effective values are then read from `internal_states[0]`
(`effective_max_running_requests_per_dp`, `max_running_requests`, `context_length`). The memory
and scheduler settings named in INFO_SETTINGS (`chunked_prefill_size`, `max_prefill_tokens`,
`mem_fraction_static`, ...) are kept as settings, the effective value where the argument is null.
"""

from __future__ import annotations

import math
from typing import Any

from rooflight.collectors import expfmt, registry
from rooflight.collectors.common import (
    MAX_CONTEXT_TOKENS,
    MAX_TENSOR_PARALLEL,
    as_dict,
    combine_each,
    count,
    first_of,
    has_families,
    histogram_names,
    nonblank,
    read_page,
)
from rooflight.collectors.samples import (
    EngineInfo,
    EngineInfoHints,
    EngineSample,
    EngineSeries,
    Histogram,
    settings_from,
)

ENGINE = "sglang"
METRICS_PATHS = ("/metrics",)
DEFAULT_PATH_NOTE = None
INFO_PATH = "/server_info"
ORDER = 30  # its place in detection and in the coverage table (engines.adapters)
KV_POOL_GROUPED = False  # its pool's tokens hold every layer

# What each normalized field is read from, or why it is missing (EngineAdapter.COVERAGE).
COVERAGE: dict[str, str] = {
    "running": "`sglang:num_running_reqs`",
    "waiting": "`sglang:num_queue_reqs`",
    "batch_max_requests": "none: not on /metrics (`/server_info` max_running_requests)",
    "kv_usage_ratio": "`sglang:token_usage`",
    "kv_capacity_tokens": "`sglang:max_total_num_tokens`",
    "prompt_tokens_total": "`sglang:realtime_tokens_total{mode=\"prefill_compute\"}` (before 2025: `prompt_tokens_total`, at request end)",
    "generation_tokens_total": "`sglang:realtime_tokens_total{mode=\"decode\"}` (before 2025: `generation_tokens_total`)",
    "steps_total": "sum of `sglang:cuda_graph_passes_total` over `mode`",
    "preemptions_total": "`sglang:num_retracted_requests_total`",
    "kv_transfer_failures_total": "`sglang:num_transfer_failed_reqs_total`",
    "ttft": "`sglang:time_to_first_token_seconds`",
    "itl": "`sglang:inter_token_latency_seconds` (2024: `time_per_output_token_seconds`)",
    "tensor_parallel_size": "max `tp_rank` + 1 when every scheduler reports (else `/server_info` tp_size)",
    "prefix_cache_hits_total": "`sglang:realtime_tokens_total{mode=\"prefill_cache\"}` / (+ `prefill_compute`) (before 2025: the `cache_hit_rate` gauge, last batch)",
    "prompt_length": "`sglang:prompt_tokens_histogram` (with `--collect-tokens-histogram`)",
    "output_length": "`sglang:generation_tokens_histogram` (with `--collect-tokens-histogram`)",
    "queue_time": "`sglang:queue_time_seconds`",
}

# SGLang's default bucket edges of its latency histograms (its metrics collector upstream), as the
# recorded page tests/fixtures/engine-samples/dynamo-sglang-worker-1req.prom carries them.
TTFT_EDGES = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0,
)  # fmt: skip
ITL_EDGES = (
    0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2, 0.4,
    0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0,
)  # fmt: skip

_Key = tuple[str, str]  # (model, rank)
_REPLICA_LABELS = ("pp_rank", "tp_rank", "attn_cp_rank", "moe_ep_rank")

_P = "sglang:"
RUNNING = _P + "num_running_reqs"
WAITING = _P + "num_queue_reqs"
KV_USAGE = _P + "token_usage"
KV_CAPACITY = _P + "max_total_num_tokens"
PAGE_SIZE = _P + "page_size"
REALTIME = _P + "realtime_tokens_total"
PROMPT_FINISHED = _P + "prompt_tokens_total"
GENERATION_FINISHED = _P + "generation_tokens_total"
PASSES = _P + "cuda_graph_passes_total"
RETRACTED = _P + "num_retracted_requests_total"
TRANSFER_FAILED = _P + "num_transfer_failed_reqs_total"  # disaggregated: requests whose KV transfer failed
TTFT = _P + "time_to_first_token_seconds"
ITL = (_P + "inter_token_latency_seconds", _P + "time_per_output_token_seconds")
CACHE_HIT_RATE = _P + "cache_hit_rate"

SERVICE_FAMILIES = registry.ServiceFamilies(
    ttft=registry.Histogram(TTFT, TTFT_EDGES),
    itl=registry.Histogram(ITL[0], ITL_EDGES),
    requests_failed=_P + "num_aborted_requests_total",  # read by the rules, not by parse()
    requests_finished=_P + "num_requests_total",
)
QUEUE_TIME = _P + "queue_time_seconds"
PROMPT_LENGTH = _P + "prompt_tokens_histogram"
OUTPUT_LENGTH = _P + "generation_tokens_histogram"
KV_TRANSFER_LATENCY = _P + "kv_transfer_latency_ms"
KV_TRANSFER_SPEED = _P + "kv_transfer_speed_gb_s"

# The server arguments `/server_info` states that are kept as settings: the scheduler's token
# budgets and policy (the head-of-line levers), the batch cap, and the KV pool's size and layout.
INFO_SETTINGS: tuple[str, ...] = (
    "chunked_prefill_size",
    "max_prefill_tokens",
    "max_running_requests",
    "schedule_policy",
    "schedule_conservativeness",
    "enable_mixed_chunk",
    "mem_fraction_static",
    "max_total_tokens",
    "max_total_num_tokens",
    "page_size",
    "kv_cache_dtype",
    "disable_radix_cache",
    "context_length",
    "cuda_graph_max_bs",
    "tp_size",
    "dp_size",
)

EXTRA_GAUGES: dict[str, str] = {
    "grammar_queue_requests": _P + "num_grammar_queue_reqs",
    "spec_accept_rate": _P + "spec_accept_rate",
    "spec_accept_length": _P + "spec_accept_length",
    "context_length_tokens": _P + "context_len",
    "kv_used_tokens": _P + "num_used_tokens",
}
# KV transfer gauges: 0 means never set, so only values above 0 are kept (module docstring).
EXTRA_TRANSFER_GAUGES: dict[str, str] = {
    "kv_transfer_latency_ms": KV_TRANSFER_LATENCY,
    "kv_transfer_speed_gb_s": KV_TRANSFER_SPEED,
    "kv_transfer_bootstrap_ms": _P + "kv_transfer_bootstrap_ms",
    "kv_transfer_alloc_ms": _P + "kv_transfer_alloc_ms",
    "kv_transfer_total_mb": _P + "kv_transfer_total_mb",
}
# The same two as histograms (SGLang 0.5.23): extra key prefix -> histogram base.
EXTRA_TRANSFER_HISTOGRAMS: dict[str, str] = {
    "kv_transfer_latency_ms": KV_TRANSFER_LATENCY,
    "kv_transfer_speed_gb_s": KV_TRANSFER_SPEED,
}
EXTRA_COUNTERS: dict[str, str] = {
    "prompt_tokens_finished_total": PROMPT_FINISHED,
    "generation_tokens_finished_total": GENERATION_FINISHED,
    "retracted_input_tokens_total": _P + "num_retracted_input_tokens_total",
    "retracted_output_tokens_total": _P + "num_retracted_output_tokens_total",
    "spec_verify_calls_total": _P + "spec_verify_calls_total",
}

NAMES: frozenset[str] = frozenset(
    {
        RUNNING,
        WAITING,
        KV_USAGE,
        KV_CAPACITY,
        PAGE_SIZE,
        REALTIME,
        PASSES,
        RETRACTED,
        TRANSFER_FAILED,
        CACHE_HIT_RATE,
        *EXTRA_GAUGES.values(),
        *EXTRA_TRANSFER_GAUGES.values(),
        *EXTRA_COUNTERS.values(),
        *histogram_names(TTFT, *ITL, QUEUE_TIME, PROMPT_LENGTH, OUTPUT_LENGTH),
        *histogram_names(*EXTRA_TRANSFER_HISTOGRAMS.values()),
    }
)


def recognises(text: str) -> bool:
    """True when the page carries SGLang's `sglang:` families."""
    return has_families(text, _P)


def parse(text: str, *, target: str, timestamp: float, duration: float) -> EngineSample:
    """Normalize one SGLang exposition. ParseError when it holds no `sglang:` family read here."""
    exp = read_page(text, (_P,), NAMES)
    gauges = {n: _read(exp, n, gauge=True) for n in (RUNNING, WAITING, KV_USAGE, KV_CAPACITY, PAGE_SIZE, CACHE_HIT_RATE)}
    realtime = _read(exp, REALTIME, gauge=False, split="mode")
    passes = _read(exp, PASSES, gauge=False, split="mode")
    retracted = _read(exp, RETRACTED, gauge=False)
    transfer_failed = _read(exp, TRANSFER_FAILED, gauge=False)
    extras = {k: _read(exp, n, gauge=True) for k, n in EXTRA_GAUGES.items()}
    extras.update({k: _read(exp, n, gauge=False) for k, n in EXTRA_COUNTERS.items()})
    extras.update({k: _positive(_read(exp, n, gauge=True)) for k, n in EXTRA_TRANSFER_GAUGES.items()})
    extras.update(_transfer_histograms(exp))
    ttft = _histograms(exp, TTFT)
    itl = _histograms(exp, ITL[0]) or _histograms(exp, ITL[1])
    lengths = {base: _histograms(exp, base) for base in (PROMPT_LENGTH, OUTPUT_LENGTH)}
    queue = _scheduler_histograms(exp, QUEUE_TIME)

    keys: set[_Key] = set()
    for table in (*gauges.values(), realtime, passes, retracted, transfer_failed, *extras.values(), queue):
        keys.update(table)
    keys.update((model, "0") for model in (*ttft, *itl, *lengths[PROMPT_LENGTH], *lengths[OUTPUT_LENGTH]))

    series = []
    for key in sorted(keys):
        model, rank = key
        modes = {m: v for m, v in realtime.get(key, {}).items() if m is not None}
        extra = {k: table[key][None] for k, table in extras.items() if None in table.get(key, {})}
        if "prefill_cache" in modes:
            extra["prompt_tokens_cached_total"] = modes["prefill_cache"]
        if modes:
            prompt, generation = modes.get("prefill_compute"), modes.get("decode")
            extra["token_counters"] = 1.0
        else:
            prompt = extra.get("prompt_tokens_finished_total")
            generation = extra.get("generation_tokens_finished_total")
            if prompt is not None or generation is not None:
                extra["token_counters"] = 0.0
        steps = passes.get(key, {})
        tokenizer_side = rank == "0"
        hits, computed = modes.get("prefill_cache"), modes.get("prefill_compute")
        queries = hits + computed if hits is not None and computed is not None else None
        series.append(
            EngineSeries(
                model=model,
                rank=rank,
                running=_one(gauges[RUNNING], key),
                waiting=_one(gauges[WAITING], key),
                kv_usage_ratio=_one(gauges[KV_USAGE], key),
                kv_capacity_tokens=_one(gauges[KV_CAPACITY], key),
                prompt_tokens_total=prompt,
                prompt_tokens_include_cache_hits=prompt is not None and not modes,  # the finish-time counter
                generation_tokens_total=generation,
                steps_total=math.fsum(steps.values()) if steps else None,
                preemptions_total=_one(retracted, key),
                kv_transfer_failures_total=_one(transfer_failed, key),
                ttft=ttft.get(model) if tokenizer_side else None,
                itl=itl.get(model) if tokenizer_side else None,
                prefix_cache_queries_total=queries,
                prefix_cache_hits_total=hits if queries is not None else None,
                prefix_cache_hit_ratio=_ratio(_one(gauges[CACHE_HIT_RATE], key)),
                prompt_length=lengths[PROMPT_LENGTH].get(model) if tokenizer_side else None,
                output_length=lengths[OUTPUT_LENGTH].get(model) if tokenizer_side else None,
                queue_time=queue.get(key),
                extra=extra,
            )
        )
    page = [v for t in gauges[PAGE_SIZE].values() for v in t.values()]
    tp_ranks = {s.labels["tp_rank"] for s in exp.get(RUNNING) if "tp_rank" in s.labels}
    highest = max((int(r) for r in tp_ranks if r.isdecimal()), default=None) if len(tp_ranks) > 1 else None
    tp = highest + 1 if highest is not None else None
    return EngineSample(
        target=target,
        engine=ENGINE,
        timestamp=timestamp,
        duration=duration,
        series=tuple(series),
        info=EngineInfo(kv_block_size_tokens=page[0] if page else None, tensor_parallel_size=tp),
    )


def _model(labels: dict[str, str]) -> str:
    return labels.get("model_name", labels.get("name", ""))


def _replica(labels: dict[str, str]) -> tuple[int, ...]:
    return tuple(int(v) if (v := labels.get(n, "0")).isdecimal() else 1 << 30 for n in _REPLICA_LABELS)


def _read(
    exp: expfmt.Selection, name: str, *, gauge: bool, split: str | None = None
) -> dict[_Key, dict[str | None, float]]:
    """Per (model, rank) and per value of `split` (None without): the lowest replica's value,
    combined over pids (max for gauges, sum for counters). See the module docstring."""
    per: dict[_Key, dict[str | None, dict[tuple[int, ...], dict[str | None, float]]]] = {}
    for s in exp.get(name):
        labels = s.labels
        key = (_model(labels), labels.get("dp_rank", "0"))
        part = labels.get(split) if split else None
        if split and part is None:
            continue
        per.setdefault(key, {}).setdefault(part, {}).setdefault(_replica(labels), {})[labels.get("pid")] = s.value
    out: dict[_Key, dict[str | None, float]] = {}
    for key, parts in per.items():
        lowest = {part: replicas[min(replicas)] for part, replicas in parts.items()}
        if values := combine_each(lowest, gauge=gauge):
            out[key] = values
    return out


def _one(table: dict[_Key, dict[str | None, float]], key: _Key) -> float | None:
    return table.get(key, {}).get(None)


def _histograms(exp: expfmt.Selection, base: str) -> dict[str, Histogram]:
    """Tokenizer-side histograms by model, summed over `is_streaming` (and pids)."""
    return expfmt.histograms(exp, base, _model)


def _scheduler_histograms(exp: expfmt.Selection, base: str) -> dict[_Key, Histogram]:
    """Scheduler-side histograms per (model, rank): the lowest replica's, never summed over replicas."""
    per_replica = expfmt.histograms(
        exp, base, lambda labels: (_model(labels), labels.get("dp_rank", "0"), _replica(labels))
    )
    out: dict[_Key, tuple[tuple[int, ...], Histogram]] = {}
    for (model, rank, replica), hist in per_replica.items():
        kept = out.get((model, rank))
        if kept is None or replica < kept[0]:
            out[(model, rank)] = (replica, hist)
    return {key: hist for key, (_, hist) in out.items()}


def _positive(table: dict[_Key, dict[str | None, float]]) -> dict[_Key, dict[str | None, float]]:
    """The values above 0 only: a KV transfer gauge at 0 was never set (module docstring)."""
    kept = {key: {part: v for part, v in parts.items() if v > 0} for key, parts in table.items()}
    return {key: parts for key, parts in kept.items() if parts}


def _transfer_histograms(exp: expfmt.Selection) -> dict[str, dict[_Key, dict[str | None, float]]]:
    """SGLang 0.5.23's KV transfer histograms as extra counters: `<name>_sum_total` and
    `<name>_count_total` per (model, rank), the lowest replica's."""
    out: dict[str, dict[_Key, dict[str | None, float]]] = {}
    for name, base in EXTRA_TRANSFER_HISTOGRAMS.items():
        hists = _scheduler_histograms(exp, base)
        out[name + "_sum_total"] = {key: {None: h.sum} for key, h in hists.items()}
        out[name + "_count_total"] = {key: {None: h.count} for key, h in hists.items()}
    return out


def _ratio(value: float | None) -> float | None:
    """A ratio the engine reports, if it is one (0..1)."""
    return value if value is not None and value <= 1.0 else None


def parse_info(data: Any) -> EngineInfoHints:
    """Batch cap, model, context and TP from `/server_info`; see the module docstring."""
    top = as_dict(data)
    state = first_of(top.get("internal_states"))
    batch = count(top.get("max_running_requests"))
    for key in ("effective_max_running_requests_per_dp", "max_running_requests"):
        batch = batch or count(state.get(key))
    return EngineInfoHints(
        batch_max_requests=batch,
        model_id=nonblank(top.get("model_path")) or nonblank(state.get("model_path")),
        max_model_len=count(top.get("context_length"), MAX_CONTEXT_TOKENS)
        or count(state.get("context_length"), MAX_CONTEXT_TOKENS),
        tensor_parallel_size=count(top.get("tp_size"), MAX_TENSOR_PARALLEL),
        settings=info_settings(top, state),
        role=_disaggregation_role(top.get("disaggregation_mode")),
    )


def _disaggregation_role(mode: Any) -> str | None:
    """SGLang's --disaggregation-mode: `prefill` or `decode` in a disaggregated pool; `null` serves both."""
    value = str(mode).strip().lower() if isinstance(mode, str) else ""
    return value if value in ("prefill", "decode") else None


def info_settings(top: dict, state: dict) -> dict[str, str]:
    """INFO_SETTINGS from the server arguments; an argument left null (SGLang chooses) takes the
    effective value the first DP rank's internal state reports, where it reports one."""
    effective = {**state, "max_running_requests": state.get("effective_max_running_requests_per_dp",
                                                            state.get("max_running_requests"))}
    merged = {key: top.get(key) if top.get(key) is not None else effective.get(key) for key in INFO_SETTINGS}
    return settings_from(merged, INFO_SETTINGS)


registry.register(__name__)
