"""Renders the current Snapshot as Prometheus metrics at scrape time.

`collect()` only reads a frozen Snapshot and formats numbers: no I/O, no NVML, no math beyond a
division, so a scrape costs the same whatever the sources are doing. Series for a GPU, model or
target that vanished simply stop appearing. A value that is missing, negative or not finite is not
exported: absent means "cannot be derived here", never a made-up zero. The families and the Collector
are agent/metrics/families.py's, shared with the proxy's /metrics.
"""

from __future__ import annotations

import platform
from typing import Callable

from prometheus_client.core import Metric
from prometheus_client.registry import CollectorRegistry

from rooflight.agent import __version__
from rooflight.agent.metrics import names as n
from rooflight.agent.metrics.catalog import BY_NAME, MetricDef, all_defs, gpu_extra_defs
from rooflight.agent.metrics.families import Families, SnapshotCollector, nonneg, registry_of
from rooflight.agent.metrics.snapshot import SeriesView, Snapshot, TargetView
from rooflight.agent.metrics import registry
from rooflight.agent.signals.headroom import WindowSignals
from rooflight.collectors.samples import GpuSample


def _defs() -> dict[str, MetricDef]:
    """The catalog by name, the NVML collector's deeper readings and the registry's detectors included."""
    return {d.name: d for d in all_defs()}


def render_health(f: Families, snap: Snapshot) -> None:
    for h in snap.health:
        key = (h.source, h.target)
        f.add(n.SOURCE_UP, key, 1.0 if h.up else 0.0)
        f.add(n.SOURCE_STARTING, key, 1.0 if h.starting else 0.0)
        f.add(n.SOURCE_LAST_SUCCESS, key, h.last_success)
        f.add(n.SOURCE_SAMPLE_DURATION, key, h.duration)
        for reason, count in sorted(h.errors.items()):
            f.add(n.SOURCE_ERRORS, (*key, reason), float(count))
        if h.series_dropped is not None:
            f.add(n.SOURCE_SERIES_DROPPED, key, float(h.series_dropped))
        if h.samples_dropped is not None:
            f.add(n.SOURCE_SAMPLES_DROPPED, key, float(h.samples_dropped))
        if h.labels_truncated is not None:
            f.add(n.SOURCE_LABELS_TRUNCATED, key, float(h.labels_truncated))
        for reason, count in sorted(h.values_dropped.items()):
            f.add(n.SOURCE_VALUES_DROPPED, (*key, reason), float(count))
        for result, count in sorted((h.canary or {}).items()):
            f.add(n.ENGINE_CANARY, (h.target, result), float(count))


def render_series(f: Families, target: TargetView, view: SeriesView) -> None:
    s = view.series
    key = (target.name, target.engine or "unknown", s.model, s.rank)
    f.add(n.REQUESTS_RUNNING, key, nonneg(s.running))
    f.add(n.REQUESTS_WAITING, key, nonneg(s.waiting))
    for reason, value in sorted(s.waiting_by_reason.items()):
        f.add(n.REQUESTS_WAITING_BY_REASON, (*key, reason), nonneg(value))
    f.add(n.BATCH_MAX_REQUESTS, key, nonneg(view.batch_max))
    if view.batch_max and s.running is not None:
        f.add(n.BATCH_OCCUPANCY, key, nonneg(s.running / view.batch_max))
    f.add(n.KV_USAGE, key, nonneg(s.kv_usage_ratio))
    f.add(n.KV_CAPACITY_TOKENS, key, nonneg(s.kv_capacity_tokens))
    f.add(n.KV_LIVE_BYTES, key, nonneg(view.live_kv_bytes))
    f.add(n.PROMPT_TOKENS, key, nonneg(s.prompt_tokens_total))
    f.add(n.GENERATION_TOKENS, key, nonneg(s.generation_tokens_total))
    f.add(n.ENGINE_STEPS, key, nonneg(s.steps_total))
    f.add(n.PREEMPTIONS, key, nonneg(s.preemptions_total))
    f.add(n.KV_TRANSFER_FAILURES, key, nonneg(s.kv_transfer_failures_total))
    if view.work is not None:
        f.add(n.STREAMED_BYTES, key, nonneg(view.work.streamed_bytes))
        for phase, value in sorted(view.work.flops.items()):
            f.add(n.FLOPS, (*key, phase), nonneg(value))
    for w in view.windows:
        wk = (*key, w.window)
        for phase, value in sorted(w.tokens_per_second.items()):
            f.add(n.TOKENS_PER_SECOND, (*wk, phase), nonneg(value))
        f.add(n.STEPS_PER_SECOND, wk, nonneg(w.steps_per_second))
        f.add(n.PREEMPTIONS_PER_SECOND, wk, nonneg(w.preemptions_per_second))
        f.add(n.MBU, wk, nonneg(w.mbu))
        f.add(n.MBU_TO_DRAM, wk, nonneg(w.mbu_to_dram))
        for phase, value in sorted(w.mfu.items()):
            f.add(n.MFU, (*wk, phase), nonneg(value))
        f.add(n.DECODE_INTENSITY, wk, nonneg(w.decode_intensity))
        f.add(n.SPEC_DECODE_ACCEPTANCE, wk, nonneg(w.spec_decode_acceptance))
        for p, value in w.ttft.items():
            f.add(n.TTFT, (*wk, p), nonneg(value))
        for p, value in w.itl.items():
            f.add(n.ITL, (*wk, p), nonneg(value))
        f.add(n.REQUESTS_PER_SECOND, wk, nonneg(w.requests_per_second))
        f.add(n.KV_TRANSFER_TOKENS, wk, nonneg(w.kv_transfer_tokens_per_second))
        f.add(n.KV_TRANSFER_BYTES, wk, nonneg(w.kv_transfer_bytes_per_second))
        f.add(n.KV_TRANSFER_LATENCY, wk, nonneg(w.kv_transfer_latency_seconds))
        f.add(n.KV_TRANSFER_SPEED, wk, nonneg(w.kv_transfer_speed_bytes_per_second))
        f.add(n.PREFIX_CACHE_HIT_RATIO, wk, nonneg(w.prefix_cache_hit_ratio))
        if w.prefill_tokens_basis is not None and "prefill" in w.mfu:
            f.add(n.PREFILL_TOKENS_BASIS, (*wk, w.prefill_tokens_basis), 1.0)
        for name, by_percentile in ((n.REQUEST_PROMPT_TOKENS, w.prompt_length),
                                    (n.REQUEST_OUTPUT_TOKENS, w.output_length),
                                    (n.REQUEST_QUEUE_TIME, w.queue_time)):
            for p, value in by_percentile.items():
                f.add(name, (*wk, p), nonneg(value))
    if view.settings:
        f.add_info(n.ENGINE_CONFIG_INFO, {**view.settings, **dict(zip(BY_NAME[n.ENGINE_CONFIG_INFO].labels, key))})
    for sig in view.signals:
        render_signals(f, (*key, sig.window), sig)
    render_verdicts(f, key, view.verdicts)


def render_signals(f: Families, wk: tuple[str, ...], sig: WindowSignals) -> None:
    """Headroom, saturation, capacity, cost and energy of one window (signals/headroom.py)."""
    for resource, value in sig.headroom.items():
        f.add(n.HEADROOM, (*wk, resource), nonneg(value))
    f.add(n.SATURATION, (*wk, sig.role), nonneg(sig.saturation))
    f.add(n.SATURATION_DEMAND, (*wk, sig.role), nonneg(sig.demand))
    if sig.binding is not None and sig.saturation is not None:
        f.add(n.SATURATION_BINDING, (*wk, sig.role, sig.binding), 1.0)
    if sig.capacity is not None:
        f.add(n.CAPACITY_REQUESTS, wk, nonneg(sig.capacity.requests_per_second))
        f.add(n.CAPACITY_DECODE_TOKENS, wk, nonneg(sig.capacity.decode_tokens_per_second))
        for phase, value in sig.capacity.phase_tokens_per_second.items():
            f.add(n.CAPACITY_PHASE_TOKENS, (*wk, phase), nonneg(value))
    for phase, value in sig.gpu_time_share.items():
        f.add(n.GPU_TIME_SHARE, (*wk, phase), nonneg(value))
    for phase, value in sig.cost_per_million_tokens.items():
        f.add(n.COST_PER_MILLION_TOKENS, (*wk, phase), nonneg(value))
    if sig.blended_cost_per_million_tokens is not None:
        f.add(n.BLENDED_COST_PER_MILLION_TOKENS, wk, nonneg(sig.blended_cost_per_million_tokens))
    for phase, value in sig.tokens_per_joule.items():
        f.add(n.TOKENS_PER_JOULE, (*wk, phase), nonneg(value))


def render_verdicts(f: Families, key: tuple[str, ...], verdicts: object) -> None:
    """Every registered detector's flags, then their values, then their choices (agent/metrics/registry.py)."""
    if verdicts is None:
        return
    detectors = registry.detectors()
    for d in detectors:
        value = getattr(verdicts, d.key, None)
        f.add(d.flag.metric, key, None if value is None else float(value))
    for d in detectors:
        for v in d.values:
            f.add(v.series.metric, key, nonneg(getattr(verdicts, v.attr, None)))
    for d in detectors:
        if d.choice is not None:
            chosen = getattr(verdicts, d.choice.attr, None) or d.choice.default
            for choice in d.choice.choices:
                f.add(d.choice.series.metric, (*key, choice), float(choice == chosen))


def render_constants(f: Families, target: TargetView) -> None:
    c = target.constants
    if c is None:
        return
    if c.gpu is not None:  # a GPU with no constants on file has no peaks to show (rooflight_gpu_info says why)
        f.add(n.GPU_PEAK_FLOPS, (target.name, c.compute_dtype), c.peak_flops_per_gpu)
        f.add(n.GPU_PEAK_BANDWIDTH, (target.name,), c.gpu.memory_bandwidth_bytes_per_second)
    f.add(n.GPU_HOUR_COST, (target.name,), target.signal_settings.gpu_hour_cost)
    if c.model is None:
        return
    m = c.model
    for model in sorted({v.series.model for v in target.series}):
        key = (target.name, model)
        f.add(n.MODEL_INFO, (*key, m.name, target.model_source or m.source, m.weight_dtype, m.kv_dtype), 1.0)
        f.add(n.MODEL_PARAMETERS, (*key, "total"), m.params_total)
        f.add(n.MODEL_PARAMETERS, (*key, "active"), m.params_active)
        f.add(n.MODEL_WEIGHT_BYTES, key, m.weight_bytes)
        f.add(n.MODEL_KV_BYTES_PER_TOKEN, key, m.kv_bytes_per_token)
        f.add(n.TENSOR_PARALLEL_SIZE, key, float(c.tensor_parallel_size))


def render_gpus(f: Families, snap: Snapshot) -> None:
    gpu: GpuSample | None = snap.gpu
    if gpu is None or not gpu.devices:
        for target in snap.targets[:1]:  # say which constants stand in when nothing was detected
            if target.constants is not None:
                c = target.constants
                f.add(n.GPU_INFO, ("none", "", "not detected", c.gpu_key, c.gpu_source, c.gpu_note), 1.0)
        return
    extra_names = {d.name for d in gpu_extra_defs()}
    for d in gpu.devices:
        key = (str(d.index), d.uuid)
        profile = snap.gpu_profiles.get(d.index, "unknown")
        f.add(n.GPU_INFO, (str(d.index), d.uuid, d.name, profile, "nvml", snap.gpu_notes.get(d.index, "")), 1.0)
        f.add(n.GPU_MEMORY_USED, key, nonneg(d.memory_used_bytes))
        f.add(n.GPU_MEMORY_TOTAL, key, nonneg(d.memory_total_bytes))
        f.add(n.GPU_MEMORY_RESERVED, key, nonneg(d.memory_reserved_bytes))
        f.add(n.GPU_KERNEL_RESIDENCY, key, nonneg(d.kernel_residency_ratio))
        f.add(n.GPU_DRAM_BANDWIDTH_UTILIZATION, key, nonneg(d.dram_bandwidth_utilization_ratio))
        for extra, value in sorted(d.extra.items()):
            if f"rooflight_gpu_{extra}" in extra_names:
                f.add(f"rooflight_gpu_{extra}", key, value)


def render_target_gpus(f: Families, snap: Snapshot) -> None:
    """rooflight_target_gpu_info: each target's GPUs by NVML index and UUID, and the rule that found them."""
    index = {d.uuid: d.index for d in snap.gpu.devices} if snap.gpu is not None else {}
    for target, assignment in sorted(snap.target_gpus.items()):
        for uuid in assignment.uuids:
            if uuid in index:
                f.add(n.TARGET_GPU_INFO, (target, str(index[uuid]), uuid, assignment.source), 1.0)


def render_processes(f: Families, snap: Snapshot) -> None:
    for target, p in sorted(snap.processes.items()):
        f.add("rooflight_engine_process_cpu_seconds_total", (target,), p.cpu_seconds_total)
        f.add("rooflight_engine_process_resident_memory_bytes", (target,), p.rss_bytes)
        f.add("rooflight_engine_process_threads", (target,), float(p.num_threads))


def render(snap: Snapshot) -> list[Metric]:
    f = Families(_defs())
    f.add(n.BUILD_INFO, (__version__, platform.python_version()), 1.0)
    render_health(f, snap)
    for target in snap.targets:
        for view in target.series:
            render_series(f, target, view)
        render_constants(f, target)
    render_gpus(f, snap)
    render_target_gpus(f, snap)
    render_processes(f, snap)
    return list(f)


def registry_for(current: Callable[[], Snapshot]) -> CollectorRegistry:
    """A registry whose one collector renders whatever Snapshot `current()` returns."""
    return registry_of(SnapshotCollector(current, render))
