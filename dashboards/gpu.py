"""GPU truth: what NVML's gauges say, next to what they are often mistaken for.

"GPU util" is kernel residency: the share of time any kernel ran, whatever it did. Batch-1 decode reads
~100% while the chip does ~0.3% of its arithmetic, so it is shown beside DRAM bandwidth utilization and
MBU. "Memory used" reads near full because engines preallocate the KV pool, so it is shown beside that pool.

GPU series carry `gpu`/`uuid` and the scrape's labels, not a target (docs/metrics.md, "Targets, pods and
GPUs"): they reach a pod through the agent that exports them, the pod's sidecar. The per-pod panels sum
the GPUs each pod's agent exports; joining a GPU to the target that uses it needs an info metric linking
`target` to `uuid`, which the agent does not export yet.
"""

from __future__ import annotations

from typing import Any

from rooflight.agent.metrics import names as n

from .metrics import GPU_EXTRA
from .panels import (
    BY_SCRAPE,
    BY_TARGET,
    GPU,
    MODEL,
    TARGET,
    WHO,
    WINDOWED,
    Grid,
    build,
    engine_variables,
    gpu_variable,
    kv_pool_bytes,
    query,
    sel,
    ts,
)

UID = "rooflight-gpu"

_GPU_WHO = "{{pod}} gpu{{gpu}}"


def _per_pod(metric: str) -> str:
    """A per-GPU gauge summed over the GPUs each selected agent (one per pod) exports."""
    return f"sum by ({BY_SCRAPE}) ({metric}{sel(GPU)})"


def _peak_bandwidth_per_pod() -> str:
    """Per-GPU HBM peak of each agent's GPUs (one profile per agent: a sidecar's GPUs are alike)."""
    return f"max by ({BY_SCRAPE}) ({n.GPU_PEAK_BANDWIDTH}{sel(TARGET)})"


def _model_bytes_per_second() -> str:
    """What MBU says the model streams: MBU x per-GPU peak x TP, summed over the pod's targets, models, ranks."""
    peak = f"max by ({BY_TARGET}) ({n.GPU_PEAK_BANDWIDTH}{sel(TARGET)})"
    tp = f"max by ({BY_TARGET}, model) ({n.TENSOR_PARALLEL_SIZE}{sel(MODEL)})"
    return (f"sum by ({BY_SCRAPE}) ({n.MBU}{sel(WINDOWED)} * on ({BY_TARGET}) group_left {peak}"
            f" * on ({BY_TARGET}, model) group_left {tp})")


def dashboard() -> dict[str, Any]:
    g = Grid()
    g.row("Busy is not the same as useful")
    g.add(ts(
        "Kernel residency vs DRAM bandwidth vs MBU",
        "Kernel residency (what nvidia-smi calls GPU util) only says some kernel was resident; it reads ~100% "
        "for batch-1 decode. DRAM bandwidth utilization (NVML GPM, Hopper+) is the hardware's share of peak HBM "
        "bandwidth; MBU is the model's. Per GPU and pod. High residency with low MBU: add batch, not GPUs.",
        "percentunit", [
            query(f"{n.GPU_KERNEL_RESIDENCY}{sel(GPU)}", f"{_GPU_WHO} kernel residency", "A"),
            query(f"{n.GPU_DRAM_BANDWIDTH_UTILIZATION}{sel(GPU)}", f"{_GPU_WHO} DRAM bandwidth", "B"),
            query(f"{n.MBU}{sel(WINDOWED)}", f"{WHO} MBU", "C"),
        ], max_val=1,
    ), 12, 9)
    g.add(ts(
        "SM and tensor-core activity",
        "SM active: share of SM cycles with work resident; tensor active: share of cycles the tensor cores ran "
        "(the hardware cousin of MFU), per GPU and pod. Decode should read low tensor activity with high DRAM "
        "bandwidth: that is the roofline confirmed, not a problem to fix.",
        "percentunit", [
            query(f"{GPU_EXTRA['sm_active_ratio']}{sel(GPU)}", f"{_GPU_WHO} SM active", "A"),
            query(f"{GPU_EXTRA['tensor_active_ratio']}{sel(GPU)}", f"{_GPU_WHO} tensor active", "B"),
        ], max_val=1,
    ), 12, 9)

    g.row("Per pod: memory and DRAM bandwidth")
    g.add(ts(
        "GPU memory per pod vs KV preallocation",
        "NVML memory used and total, summed over the GPUs each pod's agent exports, beside that pod's KV pool "
        "(capacity x bytes per token), live KV bytes and weights. Memory used reads near full whether the KV "
        "cache holds one sequence or hundreds, because the engine preallocates its KV pool at start-up: judge "
        "headroom by KV occupancy, not memory used. A pod whose memory used exceeds pool + weights by far runs "
        "something else on its GPUs, or its agent exports GPUs its engine does not use (an agent run with "
        "--gpus all, or whose engine's processes NVML cannot map, counts every GPU of the node in its pod).",
        "bytes", [
            query(_per_pod(n.GPU_MEMORY_USED), "{{pod}} memory used", "A"),
            query(_per_pod(n.GPU_MEMORY_TOTAL), "{{pod}} memory total", "B"),
            query(f"sum by ({BY_SCRAPE}) ({kv_pool_bytes(TARGET, TARGET)})", "{{pod}} KV pool", "C"),
            query(f"sum by ({BY_SCRAPE}) ({n.KV_LIVE_BYTES}{sel(TARGET)})", "{{pod}} KV live", "D"),
            query(f"sum by ({BY_SCRAPE}) (max by ({BY_TARGET}) ({n.MODEL_WEIGHT_BYTES}{sel(TARGET)}))",
                  "{{pod}} weights", "E"),
        ],
    ), 12, 8)
    g.add(ts(
        "DRAM bandwidth per pod: measured vs model",
        "Measured: GPM DRAM bandwidth utilization x per-GPU HBM peak, summed over the pod's GPUs (bytes/s the "
        "hardware moved). Model: MBU x peak x TP over $window, summed over the pod's targets and ranks (bytes/s "
        "decode must stream: weights + live KV every step). Close together: the model explains the traffic "
        "(rooflight_mbu_to_dram_bandwidth near 1). Measured far above the model: traffic the model does "
        "not account for (another tenant, activations); far below: constants that overstate bytes.",
        "Bps", [
            query(f"{_per_pod(n.GPU_DRAM_BANDWIDTH_UTILIZATION)} * on ({BY_SCRAPE}) {_peak_bandwidth_per_pod()}",
                  "{{pod}} measured", "A"),
            query(_model_bytes_per_second(), "{{pod}} model (MBU)", "B"),
        ],
    ), 12, 8)

    g.row("Clocks and power")
    g.add(ts(
        "SM and memory clocks",
        "Peaks assume full clocks; an SM clock held low lowers the compute roof and every MFU denominator "
        "assumption with it. Per GPU and pod. Check the clock event reasons when it dips.",
        "hertz", [
            query(f"{GPU_EXTRA['clock_sm_hertz']}{sel(GPU)}", f"{_GPU_WHO} SM", "A"),
            query(f"{GPU_EXTRA['clock_memory_hertz']}{sel(GPU)}", f"{_GPU_WHO} memory", "B"),
        ],
    ), 8, 8)
    g.add(ts(
        "Power vs limit",
        "Board power against its enforced limit, per GPU and pod. Prefill (compute-bound) runs near the limit; "
        "decode (bandwidth-bound) draws less. Sitting at the limit with clocks falling is power throttling.",
        "watt", [
            query(f"{GPU_EXTRA['power_watts']}{sel(GPU)}", f"{_GPU_WHO} power", "A"),
            query(f"{GPU_EXTRA['power_limit_watts']}{sel(GPU)}", f"{_GPU_WHO} limit", "B"),
        ],
    ), 8, 8)
    g.add(ts(
        "Clock event reasons (throttle)",
        "NVML's clock event reasons bitmask, per GPU and pod: 0 means clocks are free to run at max; nonzero "
        "means something (power cap, thermal, sync boost, idle) holds them down. Throttled clocks move both "
        "roofs down.",
        "none", [query(f"{GPU_EXTRA['clock_event_reasons']}{sel(GPU)}", _GPU_WHO, "A")],
    ), 8, 8)
    _health(g)
    return build(UID, "Rooflight / GPU truth",
                 "Kernel residency beside DRAM bandwidth and MBU; per-pod GPU memory beside the KV pool and "
                 "measured DRAM bandwidth beside what MBU implies; clocks and power; GPU health.",
                 engine_variables() + [gpu_variable()], g)


def _health(g: Grid) -> None:
    """What the GPU health alerts read (rules/health.py), per GPU and pod: errors, remapping, heat."""
    g.row("Health")
    g.add(ts(
        "XID and uncorrectable ECC errors",
        "XID critical-error events and uncorrectable (double-bit) ECC errors per 10 minutes, per GPU and pod "
        "(the last XID code is rooflight_gpu_xid_last_code, quoted by the alert). A hardware-class XID (48, 64, 74, 79, 94, 95, 119, 120, 140) or "
        "any uncorrectable ECC error pages (RooflightGPUHardwareXid, RooflightGPUUncorrectableECC); "
        "application XIDs (13, 31, 43, 45) show here only.",
        "short", [
            query(f"increase({GPU_EXTRA['xid_errors_total']}{sel(GPU)}[10m])", f"{_GPU_WHO} XIDs", "A"),
            query(f"increase({GPU_EXTRA['ecc_uncorrected_errors_total']}{sel(GPU)}[10m])",
                  f"{_GPU_WHO} uncorrectable ECC", "B"),
        ],
    ), 8, 8)
    g.add(ts(
        "Row remapping",
        "Rows of HBM remapped for uncorrectable errors, and whether a remap is pending (1: takes effect at "
        "the next GPU reset) or failed (1: the GPU has no spare rows left; replace it).",
        "short", [
            query(f"{GPU_EXTRA['remapped_rows_uncorrectable']}{sel(GPU)}", f"{_GPU_WHO} remapped", "A"),
            query(f"{GPU_EXTRA['remapped_rows_pending']}{sel(GPU)}", f"{_GPU_WHO} pending", "B"),
            query(f"{GPU_EXTRA['remapped_rows_failure']}{sel(GPU)}", f"{_GPU_WHO} failed", "C"),
        ],
    ), 8, 8)
    g.add(ts(
        "GPU temperature",
        "Core temperature per GPU and pod. Held above the alert's line (85 C by default) for 10 minutes pages "
        "a warning (RooflightGPUHot); thermal slowdown shows in the clock event reasons.",
        "celsius", [query(f"{GPU_EXTRA['temperature_celsius']}{sel(GPU)}", _GPU_WHO, "A")],
    ), 8, 8)
