"""The constants one target's physics uses: its model, its GPUs' peaks, and how many GPUs one copy spans."""

from __future__ import annotations

from dataclasses import dataclass

from rooflight.agent.roofline.gpus import GpuProfile
from rooflight.agent.roofline.models import ModelSpec


@dataclass(frozen=True, slots=True)
class TargetConstants:
    model: ModelSpec | None
    gpu: GpuProfile
    gpu_source: str  # "flag", "nvml" or "default": how the profile was chosen
    tensor_parallel_size: int = 1

    @property
    def compute_dtype(self) -> str:
        """The dtype whose peak bounds the matmuls: weight-only int4 still computes in 16-bit."""
        dtype = self.model.weight_dtype if self.model else "bf16"
        return dtype if dtype in ("fp8", "int8", "fp16") else "bf16"

    @property
    def peak_flops_per_gpu(self) -> float:
        return self.gpu.peak_flops_for(self.compute_dtype)

    @property
    def peak_flops(self) -> float:
        """Dense peak of all the GPUs one model copy spans."""
        return self.peak_flops_per_gpu * self.tensor_parallel_size

    @property
    def peak_bandwidth(self) -> float:
        """HBM peak of all the GPUs one model copy spans: each streams its shard of the weights."""
        return self.gpu.memory_bandwidth_bytes_per_second * self.tensor_parallel_size
