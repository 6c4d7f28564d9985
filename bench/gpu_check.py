"""GPU check: run the real NVML collector against a load this script makes and knows the size of.

On a machine with an NVIDIA GPU (and PyTorch for the load) it runs three phases on one GPU:
idle, a device-to-device copy loop (memory-bound: bytes/s = 2 x bytes copied / time) and a BF16
matmul loop (compute-bound: FLOP/s = 2 n^3 / time), sampling the collector once a second, and
prints what NVML/GPM reported next to what the load should produce. About a minute in all;
`--seconds` sets each loaded phase. Without a GPU it says so and exits 0, having checked nothing.
`--nvtx-bench` also prints the cost of rooflight.agent.sampling.nvtx_marks calls.

    python bench/gpu_check.py [--device 0] [--seconds 20] [--peak-bw BYTES_PER_S] [--peak-flops FLOP_PER_S]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rooflight.collectors.errors import SourceError  # noqa: E402
from rooflight.collectors.nvml import NvmlCollector  # noqa: E402
from rooflight.collectors.samples import GpuDevice  # noqa: E402

# Dense BF16 peak and HBM peak by NVML name (docs/physics.md, section GPU constants), for this
# script's printout only.

def peaks_for(name: str, memory_total: float | None) -> tuple[float | None, float | None]:
    """The agent's own profile for this NVML name: the same constants the agent's MBU/MFU use."""
    from rooflight.agent.roofline.gpus import match_nvml_name

    profile = match_nvml_name(name, memory_total).profile
    if profile is None:
        return None, None
    return profile.memory_bandwidth_bytes_per_second, profile.peak_flops_for("bf16")


def bench_nvtx(n: int = 200_000) -> dict[str, float]:
    """ns per call of nvtx_marks.mark, off (no profiler) and on (package called, no tool attached)."""
    from rooflight.agent.sampling import nvtx_marks
    out = {}
    for label, state in (("off", False), ("on_no_tool", True)):
        nvtx_marks.set_enabled(state)
        t0 = time.perf_counter_ns()
        for _ in range(n):
            nvtx_marks.mark("bench")
        out[label] = (time.perf_counter_ns() - t0) / n
    nvtx_marks.set_enabled()
    return out


class Load:
    """Runs `step` (which returns the work it did) in a thread until stopped; reports work per second."""

    def __init__(self, step: Callable[[], float], sync: Callable[[], None]) -> None:
        self.step, self.sync = step, sync
        self.work = 0.0
        self.elapsed = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.step()
        self.sync()  # warm-up, not counted
        t0 = time.perf_counter()
        while not self._stop.is_set():
            work = sum(self.step() for _ in range(10))
            self.sync()
            self.work += work
            self.elapsed = time.perf_counter() - t0

    def __enter__(self) -> "Load":
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def rate(self) -> float:
        return self.work / self.elapsed if self.elapsed else 0.0


async def watch(c: NvmlCollector, device: int, seconds: float) -> list[GpuDevice]:
    seen = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        await asyncio.sleep(1.0)
        s = await c.sample()
        seen.append(next(d for d in s.devices if d.index == device and "mig" not in d.info))
    return seen[1:] or seen  # the first window straddles the phase change


def summarize(name: str, seen: list[GpuDevice], computed: str, peak_bw: float | None,
              peak_flops: float | None, rate: float | None = None, kind: str = "") -> None:
    def med(get: Callable[[GpuDevice], float | None]) -> float | None:
        vals = [v for v in map(get, seen) if v is not None]
        return statistics.median(vals) if vals else None

    def pct(v: float | None) -> str:
        return "n/a" if v is None else f"{100 * v:.1f}%"

    dram = med(lambda d: d.dram_bandwidth_utilization_ratio)
    print(f"\n== {name}: {computed}")
    print(f"   NVML kernel residency ('GPU util'): {pct(med(lambda d: d.kernel_residency_ratio))}"
          f"   memory duty cycle: {pct(med(lambda d: d.extra.get('memory_busy_ratio')))}")
    print(f"   GPM DRAM bandwidth util: {pct(dram)}   SM active: {pct(med(lambda d: d.extra.get('sm_active_ratio')))}"
          f"   SM occupancy: {pct(med(lambda d: d.extra.get('sm_occupancy_ratio')))}"
          f"   tensor active: {pct(med(lambda d: d.extra.get('tensor_active_ratio')))}")
    power, clock = med(lambda d: d.extra.get("power_watts")), med(lambda d: d.extra.get("clock_sm_hertz"))
    print(f"   power: {power} W   SM clock: {clock / 1e6 if clock else None} MHz"
          f"   clock event reasons: {med(lambda d: d.extra.get('clock_event_reasons'))}")
    if kind == "bytes" and rate and peak_bw:
        implied = f"{dram * peak_bw / 1e9:.0f} GB/s" if dram is not None else "n/a (no GPM)"
        print(f"   computed/peak: {pct(rate / peak_bw)}   GPM x peak: {implied}   computed: {rate / 1e9:.0f} GB/s")
    if kind == "flops" and rate and peak_flops:
        print(f"   computed MFU vs dense BF16 peak: {pct(rate / peak_flops)} ({rate / 1e12:.0f} TFLOP/s)")


async def run(args: argparse.Namespace) -> int:
    c = NvmlCollector(call_timeout=10.0)
    try:
        first = await c.sample()
    except SourceError as exc:
        print(f"no GPU: NVML is not usable here ({exc}); nothing was checked.")
        return 0
    if not first.devices:
        print("no GPU: NVML works but sees no device; nothing was checked.")
        return 0
    dev = next(d for d in first.devices if d.index == args.device and "mig" not in d.info)
    peak_bw, peak_flops = peaks_for(dev.name, dev.memory_total_bytes)
    peak_bw, peak_flops = args.peak_bw or peak_bw, args.peak_flops or peak_flops
    print(f"GPU {dev.index}: {dev.name} {dev.uuid}, driver {first.driver_version}, "
          f"peaks used: {peak_bw} B/s, {peak_flops} FLOP/s")
    print(f"unsupported readings: {dict(c.unsupported) or 'none'}")
    summarize("idle", await watch(c, args.device, 4), "no load", peak_bw, peak_flops)
    try:
        import torch
    except ImportError:
        print("\nPyTorch is not installed: only the idle phase was checked.")
        return 0
    torch.cuda.set_device(args.device)
    n_bytes = 2 << 30
    src = torch.empty(n_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)

    def copy() -> float:
        dst.copy_(src)
        return 2.0 * n_bytes  # read + write

    with Load(copy, torch.cuda.synchronize) as load:
        seen = await watch(c, args.device, args.seconds)
    summarize("copy loop", seen, f"{load.rate / 1e9:.0f} GB/s of DRAM traffic", peak_bw, peak_flops, load.rate, "bytes")
    src = dst = None  # free the 4 GiB before the matmul phase
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)

    def matmul() -> float:
        torch.matmul(a, b)
        return 2.0 * n ** 3

    with Load(matmul, torch.cuda.synchronize) as load:
        seen = await watch(c, args.device, args.seconds)
    summarize("bf16 matmul loop", seen, f"{load.rate / 1e12:.0f} TFLOP/s", peak_bw, peak_flops, load.rate, "flops")
    c.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--seconds", type=float, default=20.0, help="length of each loaded phase")
    p.add_argument("--peak-bw", type=float, default=None, help="peak HBM bytes/s (default: by GPU name)")
    p.add_argument("--peak-flops", type=float, default=None, help="dense BF16 FLOP/s (default: by GPU name)")
    p.add_argument("--nvtx-bench", action="store_true", help="also print ns/call of nvtx_marks.mark")
    args = p.parse_args(argv)
    if args.nvtx_bench:
        costs = bench_nvtx()
        print("nvtx_marks.mark: " + ", ".join(f"{k} {v:.0f} ns/call" for k, v in costs.items()))
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
