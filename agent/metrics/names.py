"""Every exported metric name, in one place.

Rules, dashboards, docs and the exposition import these constants, so a rename breaks a test rather
than a dashboard in production. The agreed core is docs/metric-contract.md.
"""

from __future__ import annotations

PREFIX = "rooflight_"

# Health of each source (label: source, target; errors also reason).
SOURCE_UP = "rooflight_source_up"
SOURCE_STARTING = "rooflight_source_starting"  # 1 while nothing has ever listened on the engine's port
ENGINE_CANARY = "rooflight_engine_canary_requests_total"  # counter; result: ok, failed (rooflight run --canary)
SOURCE_LAST_SUCCESS = "rooflight_source_last_success_timestamp_seconds"
SOURCE_SAMPLE_DURATION = "rooflight_source_sample_duration_seconds"
SOURCE_ERRORS = "rooflight_source_errors_total"  # counter; exposed name carries _total
SOURCE_SERIES_DROPPED = "rooflight_source_series_dropped"
SOURCE_SAMPLES_DROPPED = "rooflight_source_samples_dropped"  # exposition samples past the per-page cap
SOURCE_LABELS_TRUNCATED = "rooflight_source_label_values_truncated"  # label values cut on the last page
SOURCE_VALUES_DROPPED = "rooflight_source_values_dropped_total"  # counter; reason: impossible or unusable input

# Engine state, normalized across engines (labels: target, engine, model, rank).
REQUESTS_RUNNING = "rooflight_requests_running"
REQUESTS_WAITING = "rooflight_requests_waiting"
REQUESTS_WAITING_BY_REASON = "rooflight_requests_waiting_by_reason"
BATCH_MAX_REQUESTS = "rooflight_batch_max_requests"
BATCH_OCCUPANCY = "rooflight_batch_occupancy_ratio"
KV_USAGE = "rooflight_kv_cache_usage_ratio"
KV_CAPACITY_TOKENS = "rooflight_kv_cache_capacity_tokens"
KV_LIVE_BYTES = "rooflight_kv_cache_live_bytes"
PROMPT_TOKENS = "rooflight_prompt_tokens_total"
GENERATION_TOKENS = "rooflight_generation_tokens_total"
ENGINE_STEPS = "rooflight_engine_steps_total"
PREEMPTIONS = "rooflight_preemptions_total"
KV_TRANSFER_FAILURES = "rooflight_kv_transfer_failures_total"  # KV transfers between P and D instances that failed
# The engine's work as MBU and MFU count it (counters: the recording rules rate and sum them; MBU = rate /
# (peak bandwidth x TP), MFU = rate / (peak FLOP/s x TP)).
STREAMED_BYTES = "rooflight_model_streamed_bytes_total"
FLOPS = "rooflight_model_flops_total"  # by phase

# Windowed, derived by the agent (label: window; plus phase / percentile where named).
TOKENS_PER_SECOND = "rooflight_tokens_per_second"
STEPS_PER_SECOND = "rooflight_steps_per_second"
PREEMPTIONS_PER_SECOND = "rooflight_preemptions_per_second"
MBU = "rooflight_mbu_ratio"
MFU = "rooflight_mfu_ratio"
MBU_TO_DRAM = "rooflight_mbu_to_dram_bandwidth_ratio"  # derived MBU / measured DRAM bandwidth utilization
SPEC_DECODE_ACCEPTANCE = "rooflight_spec_decode_acceptance_ratio"
DECODE_INTENSITY = "rooflight_decode_arithmetic_intensity_flops_per_byte"
TTFT = "rooflight_ttft_seconds"
ITL = "rooflight_itl_seconds"
REQUESTS_PER_SECOND = "rooflight_requests_per_second"  # TTFT observations: requests that got a first token
KV_TRANSFER_TOKENS = "rooflight_kv_transfer_tokens_per_second"  # prompt tokens whose KV came over a connector
KV_TRANSFER_BYTES = "rooflight_kv_transfer_bytes_per_second"  # those tokens x K+V bytes per token
KV_TRANSFER_LATENCY = "rooflight_kv_transfer_latency_seconds"  # mean time of one KV transfer (SGLang)
KV_TRANSFER_SPEED = "rooflight_kv_transfer_speed_bytes_per_second"  # mean speed of one KV transfer (SGLang)
PREFIX_CACHE_HIT_RATIO = "rooflight_prefix_cache_hit_ratio"  # prompt tokens found in the prefix cache / looked up
PREFILL_TOKENS_BASIS = "rooflight_prefill_tokens_basis_info"  # 1; basis = what prefill MFU counts as work
REQUEST_PROMPT_TOKENS = "rooflight_request_prompt_tokens"  # by percentile: prompt length per request
REQUEST_OUTPUT_TOKENS = "rooflight_request_output_tokens"  # by percentile: output length per request
REQUEST_QUEUE_TIME = "rooflight_request_queue_time_seconds"  # by percentile: arrival to first scheduling

# Capacity, cost and energy (signals/headroom.py; label: window; plus resource / role / phase where named).
HEADROOM = "rooflight_headroom_ratio"  # by resource: 0 at the wall, 1 idle
SATURATION = "rooflight_saturation_ratio"  # by role: 1 - the role's smallest headroom
SATURATION_BINDING = "rooflight_saturation_binding_info"  # 1; resource = the one that binds
SATURATION_DEMAND = "rooflight_saturation_demand"  # by role: saturation x (running + waiting) / running, past 1
CAPACITY_REQUESTS = "rooflight_capacity_requests_per_second"  # sustainable at the current mix
CAPACITY_DECODE_TOKENS = "rooflight_capacity_decode_tokens_per_second"  # requests/s capacity x mean output
CAPACITY_PHASE_TOKENS = "rooflight_capacity_phase_tokens_per_second"  # by phase: one phase alone
COST_PER_MILLION_TOKENS = "rooflight_cost_per_million_tokens"  # by phase, its share of the GPU-hour
BLENDED_COST_PER_MILLION_TOKENS = "rooflight_blended_cost_per_million_tokens"  # all tokens of the mix
GPU_TIME_SHARE = "rooflight_gpu_time_share_ratio"  # by phase: its share of the GPU time, adds up to 1
TOKENS_PER_JOULE = "rooflight_tokens_per_joule"  # by phase

# Constants the derivations used, so PromQL can recompute them.
GPU_INFO = "rooflight_gpu_info"  # 1 per GPU; profile "unknown" and a reason where no constants are on file
TARGET_GPU_INFO = "rooflight_target_gpu_info"  # 1 per (target, GPU it uses); rule = how they were matched
GPU_PEAK_FLOPS = "rooflight_gpu_peak_flops"
GPU_PEAK_BANDWIDTH = "rooflight_gpu_peak_memory_bandwidth_bytes_per_second"
MODEL_INFO = "rooflight_model_info"
MODEL_PARAMETERS = "rooflight_model_parameters"
MODEL_WEIGHT_BYTES = "rooflight_model_weight_bytes"
MODEL_KV_BYTES_PER_TOKEN = "rooflight_model_kv_cache_bytes_per_token"
TENSOR_PARALLEL_SIZE = "rooflight_tensor_parallel_size"
# 1; the engine's memory and scheduler settings as labels, engine spelling (labels: target, engine, model, rank).
ENGINE_CONFIG_INFO = "rooflight_engine_config_info"
GPU_HOUR_COST = "rooflight_gpu_hour_cost"  # per GPU, as configured (label: target)

# GPU (NVML).
GPU_MEMORY_USED = "rooflight_gpu_memory_used_bytes"
GPU_MEMORY_TOTAL = "rooflight_gpu_memory_total_bytes"
GPU_MEMORY_RESERVED = "rooflight_gpu_memory_reserved_bytes"
GPU_KERNEL_RESIDENCY = "rooflight_gpu_kernel_residency_ratio"
GPU_DRAM_BANDWIDTH_UTILIZATION = "rooflight_gpu_dram_bandwidth_utilization_ratio"

# The agent itself.
BUILD_INFO = "rooflight_build_info"

# Alerts (names the rules must use).
ALERTS = (
    "RooflightHeadOfLineBlocking",
    "RooflightBatchCapacityCapped",
    "RooflightBatchAdmissionBound",
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
    "RooflightEngineStalled",
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

PHASES = ("prefill", "decode")
RESOURCES = ("kv", "batch", "decode_bandwidth", "prefill_compute", "ttft_slo", "itl_slo")  # headroom's resource
ROLES = ("both", "prefill", "decode")  # saturation's role

# Detectors, evaluated by the agent at its sampling resolution (labels: target, engine, model, rank).
HEAD_OF_LINE_BLOCKING = "rooflight_head_of_line_blocking"  # 0/1
ITL_INFLATION = "rooflight_itl_tail_inflation_ratio"  # worst ITL since the last sample / its recent median
HEAD_OF_LINE_SOURCE = "rooflight_head_of_line_source"  # 1 for the ITL source that judged (engine, proxy), 0 for the other
BATCH_CAPACITY_CAPPED = "rooflight_batch_capacity_capped"  # 0/1: the KV wall
BATCH_ADMISSION_BOUND = "rooflight_batch_admission_bound"  # 0/1: waiting, batch below cap, KV has room
BATCH_AT_CONFIGURED_MAX = "rooflight_batch_at_configured_max"  # 0/1: running = cap, KV has room
ENGINE_STALLED = "rooflight_engine_stalled"  # 0/1: requests held, no step and no token for stall_seconds
