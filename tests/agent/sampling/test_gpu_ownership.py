"""Which GPUs serve which engine: two engines on one node, each matched to its GPUs through NVML's
compute-process lists and each engine's process tree, so each target uses its own GPUs' peaks and
knows its tensor-parallel size without a flag.
"""

from __future__ import annotations

import asyncio
import os
import subprocess

from rooflight.agent.config.agent import build
from rooflight.collectors.nvml_fake import FakeNvml, a100_like, h100_like
from support import FakeEngine, sample_text, started_agent


async def test_each_target_gets_its_own_gpus_peaks_and_tp() -> None:
    # engine B must not be in engine A's (this process's) tree: the shell exits, its sleep is reparented
    out = subprocess.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True)
    other = int(out.stdout.strip())
    engines = [FakeEngine(body=sample_text("vllm-cpu-load-c16.prom")) for _ in range(2)]
    for e in engines:
        await e.start()
    h100s, a100 = h100_like(2), a100_like(1)
    for gpu in h100s.gpus:  # engine A (this process) spans both H100s: TP=2
        gpu.processes = [(os.getpid(), 1 << 30)]
    a100.gpus[0].processes = [(other, 1 << 30)]  # engine B (the child) has the A100
    nvml = FakeNvml(h100s.gpus + a100.gpus)
    config = build({}, {}, {
        "targets": [{"url": engines[0].url, "name": "a", "pid": os.getpid()},
                    {"url": engines[1].url, "name": "b", "pid": other}],
        "model": "llama-3-8b", "interval": "0.2", "windows": "1s,2s", "nvml_interval": "0.2",
    })
    try:
        async with started_agent(config, nvml_lib=nvml) as agent:
            deadline = asyncio.get_running_loop().time() + 15
            while asyncio.get_running_loop().time() < deadline:
                views = {t.name: t for t in agent.snapshot.targets}
                a, b = views["a"].constants, views["b"].constants
                if a and b and a.tensor_parallel_size == 2 and b.gpu.key.startswith("a100"):
                    break
                await asyncio.sleep(0.2)
            assert (a.gpu.key, a.gpu_source, a.tensor_parallel_size) == ("h100-sxm", "nvml", 2)
            assert (b.gpu.key, b.gpu_source, b.tensor_parallel_size) == ("a100-sxm-80gb", "nvml", 1)
            # TP=2 doubles the peak the target's MBU and MFU divide by
            assert a.peak_bandwidth == 2 * a.gpu.memory_bandwidth_bytes_per_second
            assert a.peak_flops == 2 * a.gpu.peak_flops[a.compute_dtype]
    finally:
        for e in engines:
            await e.stop()
        os.kill(other, 9)
