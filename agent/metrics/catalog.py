"""What every exported metric is: type, labels, unit and meaning, in one table.

The exposition renders from it, docs/metrics.md is checked against it, and rules and dashboards are
checked to name only what it (or a supported engine) exports.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterable

from rooflight.agent.metrics import names as n
from rooflight.agent.metrics import registry
from rooflight.agent.signals.derive import MAX_UTILIZATION
from rooflight.collectors.common import MIN_PAGE_SAMPLES, SAMPLES_PER_SERIES
from rooflight.collectors.expfmt import MAX_HISTOGRAM_BUCKETS, MAX_LABEL_VALUE_CHARS
from rooflight.collectors.samples import MAX_SETTING_CHARS

SERIES = ("target", "engine", "model", "rank")
WINDOWED = SERIES + ("window",)
PHASED = WINDOWED + ("phase",)
PERCENTILES = WINDOWED + ("percentile",)
HEALTH = ("source", "target")
HEALTH_REASONS = HEALTH + ("reason",)
TARGET = ("target",)
MODEL = ("target", "model")
GPU = ("gpu", "uuid")
# How every windowed percentile is read from the engine's histogram (help text of each).
AS_HISTOGRAM_QUANTILE = "interpolated as histogram_quantile does."


@dataclass(frozen=True, slots=True)
class MetricDef:
    name: str  # as exposed (counters include _total; histograms without _bucket/_sum/_count)
    type: str  # gauge, counter or histogram (the proxy's)
    labels: tuple[str, ...]
    unit: str
    help: str


def gauge(name: str, labels: tuple[str, ...], unit: str, help_: str) -> MetricDef:
    return MetricDef(name, "gauge", labels, unit, help_)


def counter(name: str, labels: tuple[str, ...], unit: str, help_: str) -> MetricDef:
    return MetricDef(name, "counter", labels, unit, help_)


_BEFORE_DETECTORS: tuple[MetricDef, ...] = (
    # Health of each source.
    gauge(n.SOURCE_UP, HEALTH, "", "1 if the last sample of this source succeeded, else 0."),
    gauge(n.SOURCE_STARTING, HEALTH, "", "1 while the engine's port has refused every connection since the agent started (nothing listens yet: an engine loading its weights), else 0: a 503, a page that is not an engine's, a timeout, or an engine that answered once is down, not starting. Always 0 for the other sources."),
    counter(n.ENGINE_CANARY, TARGET + ("result",), "", "1-token completion requests the agent sent an engine its stall detector called stalled (rooflight run --canary), by result: ok (answered), failed (no answer within the stall window, or an error). Exported from 0 where the canary runs."),
    gauge(n.SOURCE_LAST_SUCCESS, HEALTH, "seconds", "Unix time of the last good sample of this source."),
    gauge(n.SOURCE_SAMPLE_DURATION, HEALTH, "seconds", "How long the last sample of this source took."),
    counter(n.SOURCE_ERRORS, HEALTH_REASONS, "", "Failed samples by reason (timeout, refused, http_status, parse, too_large, nvml, process, other); counter_regress: a sample read, with a counter that keeps going backwards, its rates withheld."),
    gauge(n.SOURCE_SERIES_DROPPED, HEALTH, "series", "Engine series (model, rank) over the per-target cap (max_series) in the last sample, not tracked (of the samples read: see rooflight_source_samples_dropped)."),
    gauge(n.SOURCE_SAMPLES_DROPPED, HEALTH, "samples", f"Exposition samples on the engine's last page past the per-page cap ({SAMPLES_PER_SERIES} x max_series, at least {MIN_PAGE_SAMPLES}), counted and not read."),
    gauge(n.SOURCE_LABELS_TRUNCATED, HEALTH, "labels", f"Label values on the engine's last page longer than {MAX_LABEL_VALUE_CHARS} characters, cut to that length and marked [truncated]."),
    counter(n.SOURCE_VALUES_DROPPED, HEALTH_REASONS, "", f"Values withheld as physically impossible, by reason: mbu_out_of_range and mfu_out_of_range (above {MAX_UTILIZATION:g}, per window and phase, once each time the window is derived), kv_usage_out_of_range (KV occupancy outside 0..1); what the engine's input made unusable: histogram_too_many_buckets (a histogram of over {MAX_HISTOGRAM_BUCKETS} buckets, not read), info_out_of_range (a KV pool, batch cap, context or TP past its plausible bound, or zero), derivation_failed (a series' windows or signals raised: exported without them)."),
    gauge(n.BUILD_INFO, ("version", "python"), "", "1; the agent's version."),
    # Engine state.
    gauge(n.REQUESTS_RUNNING, SERIES, "requests", "Sequences in the running batch, as the engine reports."),
    gauge(n.REQUESTS_WAITING, SERIES, "requests", "Requests queued, as the engine reports."),
    gauge(n.REQUESTS_WAITING_BY_REASON, SERIES + ("reason",), "requests", "Queued requests by the engine's reason (vLLM: capacity = KV, deferred = LoRA/transfer/other)."),
    gauge(n.BATCH_MAX_REQUESTS, SERIES, "requests", "The engine's batch cap (max_num_seqs etc.), from its metrics or the agent's config."),
    gauge(n.BATCH_OCCUPANCY, SERIES, "ratio", "running / batch cap."),
    gauge(n.KV_USAGE, SERIES, "ratio", "KV-cache occupancy, 0..1, as the engine reports (not NVML memory, which is preallocated)."),
    gauge(n.KV_CAPACITY_TOKENS, SERIES, "tokens", "KV-cache capacity in tokens (vLLM: cache_config_info)."),
    gauge(n.KV_LIVE_BYTES, SERIES, "bytes", "Live KV bytes = occupancy x capacity in tokens x K+V bytes per pool token (all layers; under vLLM's hybrid KV pool, one attention-type group of layers)."),
    counter(n.PROMPT_TOKENS, SERIES, "tokens", "Prompt tokens prefilled (computed ones where the engine separates prefix-cache hits)."),
    counter(n.GENERATION_TOKENS, SERIES, "tokens", "Tokens generated by decode."),
    counter(n.ENGINE_STEPS, SERIES, "steps", "Engine iterations (forward passes over the batch)."),
    counter(n.PREEMPTIONS, SERIES, "preemptions", "Sequences preempted because the KV cache ran out."),
    counter(n.KV_TRANSFER_FAILURES, SERIES, "transfers", "KV transfers between prefill and decode instances that "
            "failed (disaggregated serving: the prompt is prefilled again or the request fails); vLLM's NIXL "
            "connector and SGLang count them."),
    counter(n.STREAMED_BYTES, SERIES, "bytes", "Bytes the engine's steps read, as rooflight_mbu_ratio counts them (weights a step touches, draft model included, plus live KV), summed since the agent began counting: rate() / (HBM peak x TP) is MBU, and it sums across replicas."),
    counter(n.FLOPS, SERIES + ("phase",), "FLOPs", "FLOPs by phase, as rooflight_mfu_ratio counts them (matmuls without the embedding lookup, attention, prefix-cache hits left out), summed since the agent began counting: rate() / (peak FLOP/s x TP) is MFU, and it sums across replicas."),
    # Windowed.
    gauge(n.TOKENS_PER_SECOND, PHASED, "tokens/s", "Tokens per second by phase over the window (prefill and decode, never one number)."),
    gauge(n.STEPS_PER_SECOND, WINDOWED, "steps/s", "Engine steps per second over the window."),
    gauge(n.PREEMPTIONS_PER_SECOND, WINDOWED, "preemptions/s", "Preemptions per second over the window."),
    gauge(n.MBU, WINDOWED, "ratio", "Model bandwidth utilization: (weight bytes one step reads + mean live KV bytes) x steps/s / (HBM peak x TP). Judge decode by it."),
    gauge(n.MFU, PHASED, "ratio", "Model FLOPs utilization: computed tokens/s x (2 x the active params a token multiplies + its attention FLOPs) / (dense peak FLOP/s x TP). Judge prefill by it."),
    gauge(n.MBU_TO_DRAM, WINDOWED, "ratio", "Derived MBU / measured GPM DRAM bandwidth utilization of the target's GPUs over the window: 1 = the model explains the traffic; below 1 = traffic the model does not explain; above 1 = constants overstate bytes."),
    gauge(n.SPEC_DECODE_ACCEPTANCE, WINDOWED, "ratio", "Speculative decoding: accepted / proposed draft tokens over the window (vLLM, TRT-LLM, llama.cpp). Under spec decode ITL counts per output event, which can carry several tokens."),
    gauge(n.DECODE_INTENSITY, WINDOWED, "FLOP/byte", "Decode arithmetic intensity at the mean batch B: B x 2P / (weight bytes + live KV bytes); compare with the ridge point."),
    gauge(n.TTFT, PERCENTILES, "seconds", "Time-to-first-token percentile over the window, from the engine histogram's deltas, " + AS_HISTOGRAM_QUANTILE),
    gauge(n.ITL, PERCENTILES, "seconds", "Inter-token-latency percentile over the window, from the engine histogram's deltas, " + AS_HISTOGRAM_QUANTILE),
    gauge(n.REQUESTS_PER_SECOND, WINDOWED, "requests/s", "Requests that got their first token, per second over the window: the TTFT histogram's observations (one per request)."),
    gauge(n.KV_TRANSFER_TOKENS, WINDOWED, "tokens/s", "Prompt tokens per second whose KV cache arrived from another instance over a KV connector (vLLM prompt_tokens_by_source, source=external_kv_transfer): a disaggregated decode pool's intake."),
    gauge(n.KV_TRANSFER_BYTES, WINDOWED, "bytes/s", "Those tokens x K+V bytes per token (summed over the TP ranks): the KV bytes per second the connector delivered."),
    gauge(n.KV_TRANSFER_LATENCY, WINDOWED, "seconds", "Mean time of one KV cache transfer between disaggregated prefill and decode instances over the window, as the engine measures it (SGLang kv_transfer_latency_ms: histogram sum/count, or the time-weighted mean of the last transfer's gauge). Absent where the engine reports none."),
    gauge(n.KV_TRANSFER_SPEED, WINDOWED, "bytes/s", "Mean speed of one KV cache transfer over the window, as the engine measures it (SGLang kv_transfer_speed_gb_s x 1e9: histogram sum/count, or the time-weighted mean of the last transfer's gauge). Absent where the engine reports none."),
    gauge(n.PREFIX_CACHE_HIT_RATIO, WINDOWED, "ratio", "Prompt tokens found in the engine's prefix cache / prompt tokens looked up, over the window (vLLM prefix_cache_hits/queries, SGLang realtime prefill_cache/compute tokens, llama.cpp cached prompt tokens); SGLang before 2025: the time-weighted mean of its cache_hit_rate gauge (the last prefill batch's). Absent for a window without lookups."),
    gauge(n.PREFILL_TOKENS_BASIS, WINDOWED + ("basis",), "", "1; basis = what prefill MFU counts as prefill work: computed (the engine counts computed prompt tokens), hits_subtracted (all prompt tokens x (1 - the window's prefix-cache hit ratio)), includes_cache_hits (all prompt tokens, the engine telling nothing of its cache hits: MFU may count them as work)."),
    gauge(n.REQUEST_PROMPT_TOKENS, PERCENTILES, "tokens", "Prompt length per request: the percentile over the requests the engine's prompt-length histogram observed in the window, " + AS_HISTOGRAM_QUANTILE),
    gauge(n.REQUEST_OUTPUT_TOKENS, PERCENTILES, "tokens", "Output (generated) length per request: the percentile over the requests the engine's output-length histogram observed in the window, " + AS_HISTOGRAM_QUANTILE),
    gauge(n.REQUEST_QUEUE_TIME, PERCENTILES, "seconds", "Queue time per request, arrival to first scheduling: the percentile over the engine's queue-time histogram's observations in the window, " + AS_HISTOGRAM_QUANTILE),
    # Capacity, cost and energy (docs/metrics.md, section Capacity, cost and energy).
    gauge(n.HEADROOM, WINDOWED + ("resource",), "ratio", "Room left before a wall, 1 idle, 0 at the wall; resource: kv (1 - mean KV occupancy, 0 if the window preempted), batch (1 - mean running / batch cap), decode_bandwidth (1 - decode tokens/s / what the batch at the first wall decodes; where one engine does both phases, minus the prefill load too), prefill_compute (1 - prefill MFU / the MFU a real prefill reaches; where one engine does both phases, minus the decode load too), ttft_slo and itl_slo (1 - p99 / the SLO, where set)."),
    gauge(n.SATURATION, WINDOWED + ("role",), "ratio", "1 - the smallest headroom among the resources of the target's role (both: all; prefill: prefill_compute, ttft_slo; decode: kv, batch, decode_bandwidth, itl_slo): 1 at the first wall. Scale on it."),
    gauge(n.SATURATION_BINDING, WINDOWED + ("role", "resource"), "", "1; resource = the one whose headroom sets rooflight_saturation_ratio."),
    gauge(n.SATURATION_DEMAND, WINDOWED + ("role",), "", "rooflight_saturation_ratio x (mean running + mean waiting) / mean running: what the binding wall would read if the queued requests ran too. Equals the saturation without a queue and keeps growing past 1 with it (unbounded, so not a _ratio): a pool's sum of it / a target is the pods it needs, in one step (docs/deploy.md, section Autoscaling)."),
    gauge(n.CAPACITY_REQUESTS, WINDOWED, "requests/s", "Requests/s the roofline sustains at the window's prompt/output mix before the first wall (KV or batch cap): 1 / (output x decode step at that batch / batch + prompt x 2P / (peak x prefill MFU))."),
    gauge(n.CAPACITY_DECODE_TOKENS, WINDOWED, "tokens/s", "Decode tokens/s at that capacity: capacity requests/s x mean output tokens per request."),
    gauge(n.CAPACITY_PHASE_TOKENS, PHASED, "tokens/s", "Tokens/s of one phase alone (what one pool group of that phase carries): prefill = peak x prefill MFU / 2P; decode = the first wall's batch / its decode step."),
    gauge(n.GPU_TIME_SHARE, PHASED, "ratio", "The phase's share of the GPU time the window's work took (the roofline time of its tokens at the capacity efficiencies; 1 for a phase that ran alone); the phases add up to 1."),
    gauge(n.COST_PER_MILLION_TOKENS, PHASED, "currency/1M tokens", "GPU price per hour x GPUs (TP) x the phase's share of GPU time / (the phase's tokens/s x 3600 / 1e6), where gpu_hour_cost is set; the phases' bills add up to the GPU-hour."),
    gauge(n.BLENDED_COST_PER_MILLION_TOKENS, WINDOWED, "currency/1M tokens", "GPU price per hour x GPUs (TP) / (prompt + output tokens/s x 3600 / 1e6): a million tokens of the current mix, where gpu_hour_cost is set."),
    gauge(n.TOKENS_PER_JOULE, PHASED, "tokens/J", "The phase's tokens/s / (the mean power of the target's GPUs over the window (NVML's energy counter) x the phase's share of GPU time); absent where a GPU does not report energy."),
)
# Then the detectors' rows (detector_defs), then:
_AFTER_DETECTORS: tuple[MetricDef, ...] = (
    # Constants.
    gauge(n.GPU_INFO, ("gpu", "uuid", "name", "profile", "source", "reason"), "", "1 per GPU; profile = the constants profile its NVML name matches, or unknown (no constants on file: the MBU and MFU of a target on it are absent, never another GPU's peaks); source = nvml, flag or default; reason = why a GPU is unknown, empty otherwise."),
    gauge(n.TARGET_GPU_INFO, ("target", "gpu", "uuid", "rule"), "", "1 per GPU a target's engine uses: join GPU series to a target on uuid. rule = how they were found: nvml_pids (NVML's compute processes include the engine's process tree), cuda_visible_devices (the engine's CUDA_VISIBLE_DEVICES), all_visible (no engine PID maps to a GPU: every GPU the agent sees)."),
    gauge(n.GPU_PEAK_FLOPS, ("target", "dtype"), "FLOP/s", "Per-GPU dense peak FLOP/s the target's MFU used (no 2:4 sparsity); absent for a GPU with no constants on file."),
    gauge(n.GPU_PEAK_BANDWIDTH, TARGET, "bytes/s", "Per-GPU HBM peak bandwidth the target's MBU used; absent for a GPU with no constants on file."),
    gauge(n.MODEL_INFO, ("target", "model", "spec", "config_source", "weight_dtype", "kv_dtype"), "", "1; the model constants used; spec = preset or config name."),
    gauge(n.MODEL_PARAMETERS, ("target", "model", "kind"), "parameters", "Parameters: total, and active per token (MoE)."),
    gauge(n.MODEL_WEIGHT_BYTES, MODEL, "bytes", "Weight bytes streamed per decode step (whole model, all GPUs)."),
    gauge(n.MODEL_KV_BYTES_PER_TOKEN, MODEL, "bytes", "K+V bytes per token, all layers."),
    gauge(n.TENSOR_PARALLEL_SIZE, MODEL, "GPUs", "GPUs one model copy spans: what the engine says (its info endpoint or page), else --tp, else the GPUs NVML shows its processes on / the data-parallel ranks on its page, else 1."),
    gauge(n.ENGINE_CONFIG_INFO, SERIES, "", f"1; plus one label per memory or scheduler setting the engine tells, in its own spelling, from each adapter's fixed list (docs/engines.md, section Engine settings): vLLM cache_config_info (block_size, gpu_memory_utilization, num_gpu_blocks, ...) and /v1/models max_model_len, SGLang /server_info (chunked_prefill_size, max_prefill_tokens, ...), TGI /info, llama.cpp /props. Values cut at {MAX_SETTING_CHARS} characters."),
    gauge(n.GPU_HOUR_COST, TARGET, "currency/h", "Price of one of the target's GPUs per hour, as configured (gpu_hour_cost): the cost metrics' input."),
    # GPU (NVML).
    gauge(n.GPU_MEMORY_USED, GPU, "bytes", "NVML v2 memory used (engines preallocate the KV pool: near-full says nothing of occupancy)."),
    gauge(n.GPU_MEMORY_TOTAL, GPU, "bytes", "NVML v2 memory total."),
    gauge(n.GPU_MEMORY_RESERVED, GPU, "bytes", "NVML v2 memory reserved by the driver."),
    gauge(n.GPU_KERNEL_RESIDENCY, GPU, "ratio", "What nvidia-smi calls GPU util: the share of time any kernel ran, not how much of the GPU it used."),
    gauge(n.GPU_DRAM_BANDWIDTH_UTILIZATION, GPU, "ratio", "GPM DRAM bandwidth utilization (Hopper and newer): measured bytes over peak."),
    # The engine's process.
    counter("rooflight_engine_process_cpu_seconds_total", TARGET, "seconds", "CPU time (user + system) of the engine's process tree."),
    gauge("rooflight_engine_process_resident_memory_bytes", TARGET, "bytes", "Resident memory (RSS) of the engine's process tree, shared pages counted once per process."),
    gauge("rooflight_engine_process_threads", TARGET, "threads", "Threads in the engine's process tree."),
)


def detector_defs() -> tuple[MetricDef, ...]:
    """Each detector's series, as the detector registry declares them (agent/metrics/registry.py)."""
    return tuple(gauge(s.metric, SERIES + s.labels, s.unit, s.help)
                 for d in registry.detectors() for s in d.exported())


CATALOG: tuple[MetricDef, ...] = _BEFORE_DETECTORS + detector_defs() + _AFTER_DETECTORS
BY_NAME = {m.name: m for m in CATALOG}


@functools.cache
def gpu_extra_defs() -> tuple[MetricDef, ...]:
    """The deeper NVML readings, as the NVML collector declares them (built once: every scrape asks)."""
    from rooflight.collectors.nvml import GPU_EXTRA_METRICS

    return tuple(
        MetricDef(f"rooflight_gpu_{key}", kind, GPU, "", help_)
        for key, (kind, help_) in sorted(GPU_EXTRA_METRICS.items())
    )


def all_defs() -> tuple[MetricDef, ...]:
    """Every metric the agent exports, in docs/metrics.md's order, the registry's detectors as it holds them now."""
    return _BEFORE_DETECTORS + detector_defs() + _AFTER_DETECTORS + gpu_extra_defs()


def table_of(defs: Iterable[MetricDef]) -> str:
    """A reference table of docs/metrics.md: one row per metric."""
    rows = ["| name | type | labels | unit | meaning |", "|---|---|---|---|---|"]
    for d in defs:
        labels = ", ".join(f"`{label}`" for label in d.labels)
        rows.append(f"| `{d.name}` | {d.type} | {labels} | {d.unit or '-'} | {d.help} |")
    return "\n".join(rows) + "\n"


def markdown_table() -> str:
    """The reference table in docs/metrics.md (generated: `python -m rooflight.agent.metrics.catalog`)."""
    return table_of(all_defs())


if __name__ == "__main__":
    print(markdown_table(), end="")
