"""GPU truth: what NVML's gauges say, next to what they are often mistaken for.

"GPU util" is kernel residency: the share of time any kernel ran, whatever it did. Batch-1 decode reads
~100% while the chip does ~0.3% of its arithmetic, so it is shown beside DRAM bandwidth utilization and
MBU. "Memory used" reads near full because engines preallocate the KV pool, so it is shown beside that pool.
"""

from __future__ import annotations

from typing import Any

from rooflight.agent.metrics import names as n

from .metrics import GPU_EXTRA
from .panels import GPU, TARGET, WINDOWED, Grid, build, engine_variables, gpu_variable, query, sel, ts

UID = "rooflight-gpu"


def dashboard() -> dict[str, Any]:
    g = Grid()
    g.row("Busy is not the same as useful")
    g.add(ts(
        "Kernel residency vs DRAM bandwidth vs MBU",
        "Kernel residency (what nvidia-smi calls GPU util) only says some kernel was resident; it reads ~100% "
        "for batch-1 decode. DRAM bandwidth utilization (NVML GPM, Hopper+) is the hardware's share of peak HBM "
        "bandwidth; MBU is the model's. High residency with low MBU: add batch, not GPUs.",
        "percentunit", [
            query(f"{n.GPU_KERNEL_RESIDENCY}{sel(GPU)}", "kernel residency gpu{{gpu}}", "A"),
            query(f"{n.GPU_DRAM_BANDWIDTH_UTILIZATION}{sel(GPU)}", "DRAM bandwidth gpu{{gpu}}", "B"),
            query(f"{n.MBU}{sel(WINDOWED)}", "MBU {{model}} r{{rank}}", "C"),
        ], max_val=1,
    ), 12, 9)
    g.add(ts(
        "SM and tensor-core activity",
        "SM active: share of SM cycles with work resident; tensor active: share of cycles the tensor cores ran "
        "(the hardware cousin of MFU). Decode should read low tensor activity with high DRAM bandwidth: that is "
        "the roofline confirmed, not a problem to fix.",
        "percentunit", [
            query(f"{GPU_EXTRA['sm_active_ratio']}{sel(GPU)}", "SM active gpu{{gpu}}", "A"),
            query(f"{GPU_EXTRA['tensor_active_ratio']}{sel(GPU)}", "tensor active gpu{{gpu}}", "B"),
        ], max_val=1,
    ), 12, 9)

    g.row("Memory")
    g.add(ts(
        "Memory used vs KV preallocation",
        "NVML memory used reads near full whether the KV cache holds one sequence or hundreds, because the "
        "engine preallocates its KV pool at start-up. Compare it with the pool (capacity x bytes per token) and "
        "the live KV bytes; use KV occupancy, not memory used, to judge headroom.",
        "bytes", [
            query(f"sum({n.GPU_MEMORY_USED}{sel(GPU)})", "memory used (all GPUs)", "A"),
            query(f"sum({n.GPU_MEMORY_TOTAL}{sel(GPU)})", "memory total (all GPUs)", "B"),
            query(f"sum({n.KV_CAPACITY_TOKENS}{sel(TARGET)} * on (target, model) group_left "
                  f"max by (target, model) ({n.MODEL_KV_BYTES_PER_TOKEN}))", "KV pool", "C"),
            query(f"sum({n.KV_LIVE_BYTES}{sel(TARGET)})", "KV live", "D"),
            query(f"sum(max by (target) ({n.MODEL_WEIGHT_BYTES}{sel(TARGET)}))", "weights", "E"),
        ],
    ), 24, 8)

    g.row("Clocks and power")
    g.add(ts(
        "SM and memory clocks",
        "Peaks assume full clocks; an SM clock held low lowers the compute roof and every MFU denominator "
        "assumption with it. Check the clock event reasons when it dips.",
        "hertz", [
            query(f"{GPU_EXTRA['clock_sm_hertz']}{sel(GPU)}", "SM gpu{{gpu}}", "A"),
            query(f"{GPU_EXTRA['clock_memory_hertz']}{sel(GPU)}", "memory gpu{{gpu}}", "B"),
        ],
    ), 8, 8)
    g.add(ts(
        "Power vs limit",
        "Board power against its enforced limit. Prefill (compute-bound) runs near the limit; decode "
        "(bandwidth-bound) draws less. Sitting at the limit with clocks falling is power throttling.",
        "watt", [
            query(f"{GPU_EXTRA['power_watts']}{sel(GPU)}", "power gpu{{gpu}}", "A"),
            query(f"{GPU_EXTRA['power_limit_watts']}{sel(GPU)}", "limit gpu{{gpu}}", "B"),
        ],
    ), 8, 8)
    g.add(ts(
        "Clock event reasons (throttle)",
        "NVML's clock event reasons bitmask: 0 means clocks are free to run at max; nonzero means something "
        "(power cap, thermal, sync boost, idle) holds them down. Throttled clocks move both roofs down.",
        "none", [query(f"{GPU_EXTRA['clock_event_reasons']}{sel(GPU)}", "gpu{{gpu}}", "A")],
    ), 8, 8)
    return build(UID, "Rooflight / GPU truth",
                 "Kernel residency beside DRAM bandwidth and MBU; memory used beside the KV pool; clocks and power.",
                 engine_variables() + [gpu_variable()], g)
