"""The simulated GPU: keeps a FakeGpu (collectors/nvml_fake.py) in step with the simulated engine.

What NVML would show for a vLLM process on this GPU: memory used is near-full whatever the KV
occupancy (vLLM preallocates gpu_memory_utilization of HBM at start-up); "GPU util" (kernel
residency) is the share of the interval a step was running, ~100% whenever the engine is busy;
DRAM bandwidth utilization is the bytes the steps streamed over peak bandwidth x interval; the
tensor pipe's share is FLOP/s over peak. Readings are computed over the last `interval` simulated
seconds, like NVML's sampling window.
"""

from __future__ import annotations

from dataclasses import dataclass

from rooflight.agent.demo.plant import Plant
from rooflight.agent.demo.state import History, rates

MIB = 1024 * 1024
NON_TORCH_BYTES = 512 * MIB  # CUDA context and NCCL buffers outside vLLM's budget
IDLE_POWER_MW = 120_000
MAX_POWER_MW = 700_000


@dataclass(frozen=True, slots=True)
class GpuReading:
    memory_used: int
    gpu_util_percent: float
    dram_bw_util_percent: float
    tensor_util_percent: float
    power_mw: int


def gpu_reading(plant: Plant, history: History, memory_total: int, interval: float = 1.0) -> GpuReading:
    r = rates(history, interval)
    busy = r.get("busy_ratio", 0.0)
    dram = min(1.0, r.get("read_bytes_per_second", 0.0) / plant.peak_bandwidth)
    tensor = min(1.0, r.get("flops_per_second", 0.0) / plant.peak_flops)
    used = int(memory_total * plant.gpu_memory_utilization) + NON_TORCH_BYTES
    power = IDLE_POWER_MW + int((MAX_POWER_MW - IDLE_POWER_MW) * max(dram, tensor))
    return GpuReading(min(used, memory_total), 100.0 * busy, 100.0 * dram, 100.0 * tensor, power)


def apply_reading(gpu: object, reading: GpuReading) -> None:
    """Write a reading onto a FakeGpu (duck-typed: any object with the same fields)."""
    gpu.memory_used = reading.memory_used  # type: ignore[attr-defined]
    gpu.gpu_util_percent = reading.gpu_util_percent  # type: ignore[attr-defined]
    gpu.mem_util_percent = reading.dram_bw_util_percent  # type: ignore[attr-defined]
    gpu.dram_bw_util_percent = reading.dram_bw_util_percent  # type: ignore[attr-defined]
    gpu.sm_util_percent = reading.gpu_util_percent  # type: ignore[attr-defined]
    gpu.tensor_util_percent = reading.tensor_util_percent  # type: ignore[attr-defined]
    gpu.power_mw = reading.power_mw  # type: ignore[attr-defined]


def make_fake_nvml(plant: Plant):  # -> rooflight.collectors.nvml_fake.FakeNvml
    """One simulated H100 SXM with GPM support, idle until the engine runs."""
    from rooflight.collectors.nvml_fake import FakeGpu, FakeNvml

    gpu = FakeGpu(name="NVIDIA H100 80GB HBM3", uuid="GPU-d3m0d3m0-0000-4000-8000-000000000000", gpm=True,
                  dram_bw_util_percent=0.0, sm_util_percent=0.0, tensor_util_percent=0.0,
                  power_mw=IDLE_POWER_MW, power_limit_mw=MAX_POWER_MW, clock_sm_mhz=1980,
                  clock_mem_mhz=2619, temperature_c=45, clock_event_reasons=0,  # 0: clocks free to run at max
                  energy_mj=0,
                  # a healthy GPU: no ECC error, no row remapped, XID events watched and none seen
                  ecc_corrected=0, ecc_uncorrected=0, remapped_rows=(0, 0, 0, 0), xid_supported=True)
    gpu.memory_used = min(gpu.memory_total, int(gpu.memory_total * plant.gpu_memory_utilization) + NON_TORCH_BYTES)
    return FakeNvml(gpus=[gpu])
