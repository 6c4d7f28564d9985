"""Every family the agent exports, declared once: its name, type, labels, unit and help, and where its value is
read from the Snapshot (agent/metrics/family.py says how a declaration reads).

Each line declares one family and gives its name, which rules, dashboards, docs and tests import, so a rename
breaks a test rather than a dashboard in production. The exposition (agent/metrics/exposition.py),
/api/v1/snapshot and /api/v1/status, the catalogue and docs/metrics.md's table (agent/metrics/catalog.py)
and the rules' and dashboards' name checks all read FAMILIES; the detectors' own series are declared with
each detector (agent/signals/detectors/) and the NVML collector's deeper readings by the collector
(collectors/nvml.py, GPU_EXTRA_METRICS). Declared in the order /metrics shows them: by scope, as the
exposition walks the Snapshot. Exposing a number the Snapshot already holds is one line here. The agreed
core is docs/metric-contract.md.
"""

from __future__ import annotations

import platform

from rooflight.agent import __version__
from rooflight.agent.metrics.family import (
    AGENT, GPU, HEALTH, MODEL, PROCESS, SERIES, SETTINGS, SIGNALS, TARGET, TARGET_GPU, WINDOW, Declarations, Family,
)
from rooflight.agent.signals.derive import MAX_UTILIZATION
from rooflight.agent.signals.detectors import detectors
from rooflight.collectors.common import MIN_PAGE_SAMPLES, SAMPLES_PER_SERIES
from rooflight.collectors.expfmt import MAX_HISTOGRAM_BUCKETS, MAX_LABEL_VALUE_CHARS
from rooflight.collectors.normalize import MAX_REQUESTS
from rooflight.collectors.nvml import GPU_EXTRA_METRICS
from rooflight.collectors.samples import MAX_SETTING_CHARS

PREFIX = "rooflight_"
PHASES = ("prefill", "decode")
RESOURCES = ("kv", "batch", "decode_bandwidth", "prefill_compute", "ttft_slo", "itl_slo")  # headroom's resource
ROLES = ("both", "prefill", "decode")  # saturation's role
# How every windowed percentile is read from the engine's histogram (help text of each).
AS_HISTOGRAM_QUANTILE = "interpolated as histogram_quantile does."

_ = Declarations()

# The agent itself.
BUILD_INFO = _(AGENT, "rooflight_build_info", "", "1; the agent's version.",
               lambda _: {(__version__, platform.python_version()): 1.0}, by=("version", "python"))

# Health of each source (a metrics.snapshot.Health).
SOURCE_UP = _(HEALTH, "rooflight_source_up", "", "1 if the last sample of this source succeeded, else 0.",
              lambda h: h.up, api="up", page="source_up")
SOURCE_STARTING = _(HEALTH, "rooflight_source_starting", "", "1 while the engine's port has refused every connection since the agent started (nothing listens yet: an engine loading its weights), else 0: a 503, a page that is not an engine's, a timeout, or an engine that answered once is down, not starting. Always 0 for the other sources.",
                    lambda h: h.starting, page="source_starting")
ENGINE_CANARY = _(HEALTH, "rooflight_engine_canary_requests_total", "", "1-token completion requests the agent sent an engine its stall detector called stalled (rooflight run --canary), by result: ok (answered), failed (no answer within the stall window, or an error). Exported from 0 where the canary runs.",
                  lambda h: h.canary, by=("result",), sort=True, counter=True)
SOURCE_LAST_SUCCESS = _(HEALTH, "rooflight_source_last_success_timestamp_seconds", "seconds", "Unix time of the last good sample of this source.",
                        lambda h: h.last_success, api="last_success", page="source_last_success")
SOURCE_SAMPLE_DURATION = _(HEALTH, "rooflight_source_sample_duration_seconds", "seconds", "How long the last sample of this source took.",
                           lambda h: h.duration, api="duration")
SOURCE_ERRORS = _(HEALTH, "rooflight_source_errors_total", "", "Failed samples by reason (timeout, refused, http_status, parse, too_large, nvml, process, other); counter_regress: a sample read, with a counter that keeps going backwards, its rates withheld.",
                  lambda h: h.errors, by=("reason",), sort=True, counter=True, api="errors")
SOURCE_SERIES_DROPPED = _(HEALTH, "rooflight_source_series_dropped", "series", "Engine series (model, rank) over the per-target cap (max_series) in the last sample, not tracked (of the samples read: see rooflight_source_samples_dropped).",
                          lambda h: h.series_dropped)
SOURCE_SAMPLES_DROPPED = _(HEALTH, "rooflight_source_samples_dropped", "samples", f"Exposition samples on the engine's last page past the per-page cap ({SAMPLES_PER_SERIES} x max_series, at least {MIN_PAGE_SAMPLES}), counted and not read.",
                           lambda h: h.samples_dropped)
SOURCE_LABELS_TRUNCATED = _(HEALTH, "rooflight_source_label_values_truncated", "labels", f"Label values on the engine's last page longer than {MAX_LABEL_VALUE_CHARS} characters, cut to that length and marked [truncated].",
                            lambda h: h.labels_truncated)
SOURCE_VALUES_DROPPED = _(HEALTH, "rooflight_source_values_dropped_total", "", f"Values withheld as physically impossible, by reason: mbu_out_of_range and mfu_out_of_range (above {MAX_UTILIZATION:g}, per window and phase, once each time the window is derived), kv_usage_out_of_range (KV occupancy outside 0..1), gauge_out_of_range (requests running or waiting below 0 or past {MAX_REQUESTS:,}, a prefix-cache hit ratio outside 0..1); what the engine's input made unusable: histogram_too_many_buckets (a histogram of over {MAX_HISTOGRAM_BUCKETS} buckets, not read), info_out_of_range (a KV pool, batch cap, context or TP past its plausible bound, or zero), derivation_failed (a series' windows or signals raised: exported without them).",
                          lambda h: h.values_dropped, by=("reason",), sort=True, counter=True)

# Engine state, normalized across engines (a signals.view.SeriesView).
REQUESTS_RUNNING = _(SERIES, "rooflight_requests_running", "requests", "Sequences in the running batch, as the engine reports.",
                     lambda v: v.series.running, api="running", page="running")
REQUESTS_WAITING = _(SERIES, "rooflight_requests_waiting", "requests", "Requests queued, as the engine reports.",
                     lambda v: v.series.waiting, api="waiting", page="waiting")
REQUESTS_WAITING_BY_REASON = _(SERIES, "rooflight_requests_waiting_by_reason", "requests", "Queued requests by the engine's reason (vLLM: capacity = KV, deferred = LoRA/transfer/other).",
                               lambda v: v.series.waiting_by_reason, by=("reason",), sort=True)
BATCH_MAX_REQUESTS = _(SERIES, "rooflight_batch_max_requests", "requests", "The engine's batch cap (max_num_seqs etc.), from its metrics or the agent's config.",
                       lambda v: v.batch_max, api="batch_max", page="batch_max")
BATCH_OCCUPANCY = _(SERIES, "rooflight_batch_occupancy_ratio", "ratio", "running / batch cap.",
                    lambda v: v.series.running / v.batch_max if v.batch_max and v.series.running is not None else None)
KV_USAGE = _(SERIES, "rooflight_kv_cache_usage_ratio", "ratio", "KV-cache occupancy, 0..1, as the engine reports (not NVML memory, which is preallocated).",
             lambda v: v.series.kv_usage_ratio, api="kv_usage_ratio", page="kv_usage_ratio")
KV_CAPACITY_TOKENS = _(SERIES, "rooflight_kv_cache_capacity_tokens", "tokens", "KV-cache capacity in tokens (vLLM: cache_config_info).",
                       lambda v: v.series.kv_capacity_tokens)
KV_LIVE_BYTES = _(SERIES, "rooflight_kv_cache_live_bytes", "bytes", "Live KV bytes = occupancy x capacity in tokens x K+V bytes per pool token (all layers; under vLLM's hybrid KV pool, one attention-type group of layers).",
                  lambda v: v.live_kv_bytes)
PROMPT_TOKENS = _(SERIES, "rooflight_prompt_tokens_total", "tokens", "Prompt tokens prefilled (computed ones where the engine separates prefix-cache hits).",
                  lambda v: v.series.prompt_tokens_total, counter=True)
GENERATION_TOKENS = _(SERIES, "rooflight_generation_tokens_total", "tokens", "Tokens generated by decode.",
                      lambda v: v.series.generation_tokens_total, counter=True)
ENGINE_STEPS = _(SERIES, "rooflight_engine_steps_total", "steps", "Engine iterations (forward passes over the batch).",
                 lambda v: v.series.steps_total, counter=True)
PREEMPTIONS = _(SERIES, "rooflight_preemptions_total", "preemptions", "Sequences preempted because the KV cache ran out.",
                lambda v: v.series.preemptions_total, counter=True)
KV_TRANSFER_FAILURES = _(SERIES, "rooflight_kv_transfer_failures_total", "transfers", "KV transfers between prefill and decode instances that failed (disaggregated serving: the prompt is prefilled again or the request fails); vLLM's NIXL connector and SGLang count them.",
                         lambda v: v.series.kv_transfer_failures_total, counter=True)
# The engine's work as MBU and MFU count it (the recording rules rate and sum them: MBU = rate / (peak
# bandwidth x TP), MFU = rate / (peak FLOP/s x TP)).
STREAMED_BYTES = _(SERIES, "rooflight_model_streamed_bytes_total", "bytes", "Bytes the engine's steps read, as rooflight_mbu_ratio counts them (weights a step touches, draft model included, plus live KV), summed since the agent began counting: rate() / (HBM peak x TP) is MBU, and it sums across replicas.",
                   lambda v: v.work.streamed_bytes if v.work is not None else None, counter=True)
FLOPS = _(SERIES, "rooflight_model_flops_total", "FLOPs", "FLOPs by phase, as rooflight_mfu_ratio counts them (matmuls without the embedding lookup, attention, prefix-cache hits left out), summed since the agent began counting: rate() / (peak FLOP/s x TP) is MFU, and it sums across replicas.",
          lambda v: v.work.flops if v.work is not None else None, by=("phase",), sort=True, counter=True)

# Windowed, derived by the agent (a signals.derive.WindowValues).
TOKENS_PER_SECOND = _(WINDOW, "rooflight_tokens_per_second", "tokens/s", "Tokens per second by phase over the window (prefill and decode, never one number).",
                      lambda w: w.tokens_per_second, by=("phase",), sort=True, api="tokens_per_second", page="tokens_per_second")
STEPS_PER_SECOND = _(WINDOW, "rooflight_steps_per_second", "steps/s", "Engine steps per second over the window.",
                     lambda w: w.steps_per_second, api="steps_per_second")
PREEMPTIONS_PER_SECOND = _(WINDOW, "rooflight_preemptions_per_second", "preemptions/s", "Preemptions per second over the window.",
                           lambda w: w.preemptions_per_second, api="preemptions_per_second", page="preemptions_per_second")
MBU = _(WINDOW, "rooflight_mbu_ratio", "ratio", "Model bandwidth utilization: (weight bytes one step reads + mean live KV bytes) x steps/s / (HBM peak x TP). Judge decode by it.",
        lambda w: w.mbu, api="mbu", page="mbu")
MBU_TO_DRAM = _(WINDOW, "rooflight_mbu_to_dram_bandwidth", "", "Derived MBU / measured GPM DRAM bandwidth utilization of the target's GPUs over the window: 1 = the model explains the traffic; below 1 = traffic the model does not explain; above 1 = constants overstate bytes (a factor around 1, not a _ratio in 0..1).",
                lambda w: w.mbu_to_dram)
MFU = _(WINDOW, "rooflight_mfu_ratio", "ratio", "Model FLOPs utilization: computed tokens/s x (2 x the active params a token multiplies + its attention FLOPs) / (dense peak FLOP/s x TP). Judge prefill by it.",
        lambda w: w.mfu, by=("phase",), sort=True, api="mfu", page="mfu")
DECODE_INTENSITY = _(WINDOW, "rooflight_decode_arithmetic_intensity_flops_per_byte", "FLOP/byte", "Decode arithmetic intensity at the mean batch: the decode step's FLOPs (2 x the parameters each token multiplies + its attention over its cache) / its bytes (weights read + live KV); compare with the ridge point.",
                     lambda w: w.decode_intensity, api="decode_intensity", page="decode_intensity")
SPEC_DECODE_ACCEPTANCE = _(WINDOW, "rooflight_spec_decode_acceptance_ratio", "ratio", "Speculative decoding: accepted / proposed draft tokens over the window (vLLM, TRT-LLM, llama.cpp). Under spec decode ITL counts per output event, which can carry several tokens.",
                           lambda w: w.spec_decode_acceptance)
TTFT = _(WINDOW, "rooflight_ttft_seconds", "seconds", "Time-to-first-token percentile over the window, from the engine histogram's deltas, " + AS_HISTOGRAM_QUANTILE,
         lambda w: w.ttft, by=("percentile",), api="ttft", page="ttft")
ITL = _(WINDOW, "rooflight_itl_seconds", "seconds", "Inter-token-latency percentile over the window, from the engine histogram's deltas, " + AS_HISTOGRAM_QUANTILE,
        lambda w: w.itl, by=("percentile",), api="itl", page="itl")
REQUESTS_PER_SECOND = _(WINDOW, "rooflight_requests_per_second", "requests/s", "Requests that got their first token, per second over the window: the TTFT histogram's observations (one per request).",
                        lambda w: w.requests_per_second)
KV_TRANSFER_TOKENS = _(WINDOW, "rooflight_kv_transfer_tokens_per_second", "tokens/s", "Prompt tokens per second whose KV cache arrived from another instance over a KV connector (vLLM prompt_tokens_by_source, source=external_kv_transfer): a disaggregated decode pool's intake.",
                       lambda w: w.kv_transfer_tokens_per_second)
KV_TRANSFER_BYTES = _(WINDOW, "rooflight_kv_transfer_bytes_per_second", "bytes/s", "Those tokens x K+V bytes per token (summed over the TP ranks): the KV bytes per second the connector delivered.",
                      lambda w: w.kv_transfer_bytes_per_second)
KV_TRANSFER_LATENCY = _(WINDOW, "rooflight_kv_transfer_latency_seconds", "seconds", "Mean time of one KV cache transfer between disaggregated prefill and decode instances over the window, as the engine measures it (SGLang kv_transfer_latency_ms: histogram sum/count, or the time-weighted mean of the last transfer's gauge). Absent where the engine reports none.",
                        lambda w: w.kv_transfer_latency_seconds)
KV_TRANSFER_SPEED = _(WINDOW, "rooflight_kv_transfer_speed_bytes_per_second", "bytes/s", "Mean speed of one KV cache transfer over the window, as the engine measures it (SGLang kv_transfer_speed_gb_s x 1e9: histogram sum/count, or the time-weighted mean of the last transfer's gauge). Absent where the engine reports none.",
                      lambda w: w.kv_transfer_speed_bytes_per_second)
PREFIX_CACHE_HIT_RATIO = _(WINDOW, "rooflight_prefix_cache_hit_ratio", "ratio", "Prompt tokens found in the engine's prefix cache / prompt tokens looked up, over the window (vLLM prefix_cache_hits/queries, SGLang realtime prefill_cache/compute tokens, llama.cpp cached prompt tokens); SGLang before 2025: the time-weighted mean of its cache_hit_rate gauge (the last prefill batch's). Absent for a window without lookups.",
                           lambda w: w.prefix_cache_hit_ratio)
PREFILL_TOKENS_BASIS = _(WINDOW, "rooflight_prefill_tokens_basis_info", "", "1; basis = what prefill MFU counts as prefill work: computed (the engine counts computed prompt tokens), hits_subtracted (all prompt tokens x (1 - the window's prefix-cache hit ratio)), includes_cache_hits (all prompt tokens, the engine telling nothing of its cache hits: MFU may count them as work).",
                         lambda w: {w.prefill_tokens_basis: 1.0} if w.prefill_tokens_basis is not None and "prefill" in w.mfu else None,
                         by=("basis",))
REQUEST_PROMPT_TOKENS = _(WINDOW, "rooflight_request_prompt_tokens", "tokens", "Prompt length per request: the percentile over the requests the engine's prompt-length histogram observed in the window, " + AS_HISTOGRAM_QUANTILE,
                          lambda w: w.prompt_length, by=("percentile",))
REQUEST_OUTPUT_TOKENS = _(WINDOW, "rooflight_request_output_tokens", "tokens", "Output (generated) length per request: the percentile over the requests the engine's output-length histogram observed in the window, " + AS_HISTOGRAM_QUANTILE,
                          lambda w: w.output_length, by=("percentile",))
REQUEST_QUEUE_TIME = _(WINDOW, "rooflight_request_queue_time_seconds", "seconds", "Queue time per request, arrival to first scheduling: the percentile over the engine's queue-time histogram's observations in the window, " + AS_HISTOGRAM_QUANTILE,
                       lambda w: w.queue_time, by=("percentile",))

# The engine's memory and scheduler settings of a series, as labels, engine spelling (a SeriesView).
ENGINE_CONFIG_INFO = _(SETTINGS, "rooflight_engine_config_info", "", f"1; plus one label per memory or scheduler setting the engine tells, in its own spelling, from each adapter's fixed list (docs/engines.md, section Engine settings): vLLM cache_config_info (block_size, gpu_memory_utilization, num_gpu_blocks, ...) and /v1/models max_model_len, SGLang /server_info (chunked_prefill_size, max_prefill_tokens, ...), TGI /info, llama.cpp /props. Values cut at {MAX_SETTING_CHARS} characters.",
                       lambda v: v.settings or None, info=True)

# Capacity, cost and energy of each window (a signals.headroom.WindowSignals; docs/metrics.md, section
# Capacity, cost and energy).
HEADROOM = _(SIGNALS, "rooflight_headroom_ratio", "ratio", "Room left before a wall, 1 idle, 0 at the wall; resource: kv (1 - mean KV occupancy, 0 if the window preempted), batch (1 - mean running / batch cap), decode_bandwidth (1 - decode tokens/s / what the batch at the first wall decodes; where one engine does both phases, minus the prefill load too), prefill_compute (1 - prefill MFU / the MFU a real prefill reaches; where one engine does both phases, minus the decode load too), ttft_slo and itl_slo (1 - p99 / the SLO, where set).",
             lambda s: s.headroom, by=("resource",))
SATURATION = _(SIGNALS, "rooflight_saturation_ratio", "ratio", "1 - the smallest headroom among the resources of the target's role (both: all; prefill: prefill_compute, ttft_slo; decode: kv, batch, decode_bandwidth, itl_slo): 1 at the first wall. Scale on it.",
               lambda s: {s.role: s.saturation}, by=("role",))
SATURATION_DEMAND = _(SIGNALS, "rooflight_saturation_demand", "", "rooflight_saturation_ratio x (mean running + mean waiting) / mean running: what the binding wall would read if the queued requests ran too. Equals the saturation without a queue and keeps growing past 1 with it (unbounded, so not a _ratio): a pool's sum of it / a target is the pods it needs, in one step (docs/deploy.md, section Autoscaling).",
                      lambda s: {s.role: s.demand}, by=("role",))
SATURATION_BINDING = _(SIGNALS, "rooflight_saturation_binding_info", "", "1; resource = the one whose headroom sets rooflight_saturation_ratio.",
                       lambda s: {(s.role, s.binding): 1.0} if s.binding is not None and s.saturation is not None else None,
                       by=("role", "resource"))
CAPACITY_REQUESTS = _(SIGNALS, "rooflight_capacity_requests_per_second", "requests/s", "Requests/s the roofline sustains at the window's prompt/output mix before the first wall (KV or batch cap): 1 / (output x decode step at that batch / batch + a prompt's prefill FLOPs / (peak x prefill MFU)), each the step model's.",
                      lambda s: s.capacity.requests_per_second if s.capacity is not None else None)
CAPACITY_DECODE_TOKENS = _(SIGNALS, "rooflight_capacity_decode_tokens_per_second", "tokens/s", "Decode tokens/s at that capacity: capacity requests/s x mean output tokens per request.",
                           lambda s: s.capacity.decode_tokens_per_second if s.capacity is not None else None)
CAPACITY_PHASE_TOKENS = _(SIGNALS, "rooflight_capacity_phase_tokens_per_second", "tokens/s", "Tokens/s of one phase alone (what one pool group of that phase carries): prefill = peak x prefill MFU / a computed prompt token's FLOPs (2P + its attention); decode = the first wall's batch / its decode step.",
                          lambda s: s.capacity.phase_tokens_per_second if s.capacity is not None else None, by=("phase",))
CAPACITY_DECODE_BATCH = _(SIGNALS, "rooflight_capacity_decode_batch_requests", "requests", "The decode batch at the first wall (KV or batch cap) the capacity assumes: the sequences one engine holds at once, each advancing a token every decode step; the decode phase's tokens/s is this batch / its step.",
                          lambda s: s.capacity.batch if s.capacity is not None and "decode" in s.capacity.phase_tokens_per_second else None)
GPU_TIME_SHARE = _(SIGNALS, "rooflight_gpu_time_share_ratio", "ratio", "The phase's share of the GPU time the window's work took (the roofline time of its tokens at the capacity efficiencies; 1 for a phase that ran alone); the phases add up to 1.",
                   lambda s: s.gpu_time_share, by=("phase",))
COST_PER_MILLION_TOKENS = _(SIGNALS, "rooflight_cost_per_million_tokens", "currency/1M tokens", "GPU price per hour x GPUs (TP) x the phase's share of GPU time / (the phase's tokens/s x 3600 / 1e6), where gpu_hour_cost is set; the phases' bills add up to the GPU-hour.",
                            lambda s: s.cost_per_million_tokens, by=("phase",))
BLENDED_COST_PER_MILLION_TOKENS = _(SIGNALS, "rooflight_blended_cost_per_million_tokens", "currency/1M tokens", "GPU price per hour x GPUs (TP) / (prompt + output tokens/s x 3600 / 1e6): a million tokens of the current mix, where gpu_hour_cost is set.",
                                    lambda s: s.blended_cost_per_million_tokens)
TOKENS_PER_JOULE = _(SIGNALS, "rooflight_tokens_per_joule", "tokens/J", "The phase's tokens/s / (the mean power of the target's GPUs over the window (NVML's energy counter) x the phase's share of GPU time); absent where a GPU does not report energy.",
                     lambda s: s.tokens_per_joule, by=("phase",))

# (Here each detector's series, as it declares them: agent/signals/detectors/.)

# Constants the derivations used, so PromQL can recompute them: of a target (a TargetView with constants) ...
GPU_PEAK_FLOPS = _(TARGET, "rooflight_gpu_peak_flops", "FLOP/s", "Per-GPU dense peak FLOP/s the target's MFU used (no 2:4 sparsity); absent for a GPU with no constants on file.",
                   lambda t: {t.constants.compute_dtype: t.constants.peak_flops_per_gpu} if t.constants.gpu else None,
                   by=("dtype",))
GPU_PEAK_BANDWIDTH = _(TARGET, "rooflight_gpu_peak_memory_bandwidth_bytes_per_second", "bytes/s", "Per-GPU HBM peak bandwidth the target's MBU used; absent for a GPU with no constants on file.",
                       lambda t: t.constants.gpu.memory_bandwidth_bytes_per_second if t.constants.gpu else None)
GPU_HOUR_COST = _(TARGET, "rooflight_gpu_hour_cost", "currency/h", "Price of one of the target's GPUs per hour, as configured (gpu_hour_cost): the cost metrics' input.",
                  lambda t: t.signal_settings.gpu_hour_cost)
# ... and of each model it serves (a ModelRow).
MODEL_INFO = _(MODEL, "rooflight_model_info", "", "1; the model constants used; spec = preset or config name.",
               lambda r: {(r.spec.name, r.source, r.spec.weight_dtype, r.spec.kv_dtype): 1.0},
               by=("spec", "config_source", "weight_dtype", "kv_dtype"))
MODEL_PARAMETERS = _(MODEL, "rooflight_model_parameters", "parameters", "Parameters: total, and active per token (MoE).",
                     lambda r: {"total": r.spec.params_total, "active": r.spec.params_active}, by=("kind",))
MODEL_WEIGHT_BYTES = _(MODEL, "rooflight_model_weight_bytes", "bytes", "Weight bytes streamed per decode step (whole model, all GPUs).",
                       lambda r: r.spec.weight_bytes)
MODEL_KV_BYTES_PER_TOKEN = _(MODEL, "rooflight_model_kv_cache_bytes_per_token", "bytes", "K+V bytes per token, all layers.",
                             lambda r: r.spec.kv_bytes_per_token)
TENSOR_PARALLEL_SIZE = _(MODEL, "rooflight_tensor_parallel_size", "GPUs", "GPUs one model copy spans: what the engine says (its info endpoint or page), else --tp, else the GPUs NVML shows its processes on / the data-parallel ranks on its page, else 1.",
                         lambda r: r.tensor_parallel_size)

# GPU (NVML; a GpuRow: one per GPU exported, or one saying which constants stand in when none was detected).
GPU_INFO = _(GPU, "rooflight_gpu_info", "", "1 per GPU; profile = the constants profile its NVML name matches, or unknown (no constants on file: the MBU and MFU of a target on it are absent, never another GPU's peaks); source = nvml, flag or default; reason = why a GPU is unknown, empty otherwise.",
             lambda g: {g.info: 1.0}, by=("name", "profile", "source", "reason"))
GPU_MEMORY_USED = _(GPU, "rooflight_gpu_memory_used_bytes", "bytes", "NVML v2 memory used (engines preallocate the KV pool: near-full says nothing of occupancy).",
                    lambda g: g.device.memory_used_bytes if g.device else None, nonneg=True, api="memory_used_bytes")
GPU_MEMORY_TOTAL = _(GPU, "rooflight_gpu_memory_total_bytes", "bytes", "NVML v2 memory total.",
                     lambda g: g.device.memory_total_bytes if g.device else None, nonneg=True, api="memory_total_bytes")
GPU_MEMORY_RESERVED = _(GPU, "rooflight_gpu_memory_reserved_bytes", "bytes", "NVML v2 memory reserved by the driver.",
                        lambda g: g.device.memory_reserved_bytes if g.device else None, nonneg=True)
GPU_KERNEL_RESIDENCY = _(GPU, "rooflight_gpu_kernel_residency_ratio", "ratio", "What nvidia-smi calls GPU util: the share of time any kernel ran, not how much of the GPU it used.",
                         lambda g: g.device.kernel_residency_ratio if g.device else None, nonneg=True,
                         api="kernel_residency_ratio")
GPU_DRAM_BANDWIDTH_UTILIZATION = _(GPU, "rooflight_gpu_dram_bandwidth_utilization_ratio", "ratio", "GPM DRAM bandwidth utilization (Hopper and newer): measured bytes over peak.",
                                   lambda g: g.device.dram_bandwidth_utilization_ratio if g.device else None,
                                   nonneg=True, api="dram_bandwidth_utilization_ratio")
# The NVML collector's deeper readings, as it declares them (collectors/nvml.py): rooflight_gpu_<key>.
for _key, (_kind, _help) in sorted(GPU_EXTRA_METRICS.items()):
    _(GPU, f"{PREFIX}gpu_{_key}", "", _help, lambda g, key=_key: g.device.extra.get(key) if g.device else None,
      counter=_kind == "counter")
del _key, _kind, _help

# Each target's GPUs (a TargetGpuRow).
TARGET_GPU_INFO = _(TARGET_GPU, "rooflight_target_gpu_info", "", "1 per GPU a target's engine uses: join GPU series to a target on uuid. rule = how they were found: nvml_pids (NVML's compute processes include the engine's process tree), cuda_visible_devices (the engine's CUDA_VISIBLE_DEVICES), all_visible (no engine PID maps to a GPU: every GPU the agent sees).",
                    lambda r: {(str(r.index[u]), u, r.assignment.source): 1.0 for u in r.assignment.uuids if u in r.index},
                    by=("gpu", "uuid", "rule"))

# The engine's process tree (a collectors.samples.ProcessSample).
ENGINE_PROCESS_CPU = _(PROCESS, "rooflight_engine_process_cpu_seconds_total", "seconds", "CPU time (user + system) of the engine's process tree.",
                       lambda p: p.cpu_seconds_total, counter=True)
ENGINE_PROCESS_RSS = _(PROCESS, "rooflight_engine_process_resident_memory_bytes", "bytes", "Resident memory (RSS) of the engine's process tree, shared pages counted once per process.",
                       lambda p: p.rss_bytes)
ENGINE_PROCESS_THREADS = _(PROCESS, "rooflight_engine_process_threads", "threads", "Threads in the engine's process tree.",
                           lambda p: p.num_threads)

FAMILIES: tuple[Family, ...] = tuple(_.families)  # every family but the detectors' (catalog.families() adds them)

# Alerts (names the rules must use): each detector's (as it declares it), then the rules' own.
RULE_ALERTS = (
    "RooflightTTFTBudgetBurn",
    "RooflightITLBudgetBurn",
    "RooflightLowDecodeMBU",
    "RooflightEngineDown",
    "RooflightModelDown",
    "RooflightGPUDown",
    "RooflightGPULost",
    "RooflightSourceDown",
    "RooflightAgentDown",
    "RooflightAgentAbsent",
    "RooflightGoodputBudgetBurn",
    "RooflightSLOBucketMissing",
    "RooflightSLOHistogramMissing",
    "RooflightRequestErrorBudgetBurn",
    "RooflightClientErrorBudgetBurn",
    "RooflightEngineStartTimeout",
    "RooflightGPUHardwareXid",
    "RooflightGPUUncorrectableECC",
    "RooflightGPURowRemapFailed",
    "RooflightGPURowRemapPending",
    "RooflightGPUThrottled",
    "RooflightGPUHot",
)


def alerts() -> tuple[str, ...]:
    """Every alert the rules ship, each once: every detector's, then the rules' own (docs/metric-contract.md)."""
    return tuple(dict.fromkeys((*(d.alert for d in detectors()), *RULE_ALERTS)))


ALERTS = alerts()  # as the detectors stand at import (alerts() reads them again)
