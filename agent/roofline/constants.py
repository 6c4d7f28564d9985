"""The constants one target's physics uses: its model, its GPUs' peaks, and how many GPUs one copy spans."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from rooflight.agent.roofline.gpus import UNKNOWN_GPU, GpuProfile
from rooflight.agent.roofline.models import ModelSpec
from rooflight.agent.roofline.step import Layout, Roofs


@dataclass(frozen=True)
class TargetConstants:
    """Frozen, so each derived value is computed once per instance (cached_property; no slots, which would
    leave it nowhere to keep them): the engine loop hands the derive step the same instance while nothing
    changes, and the physics reads these peaks ~20 times a sample."""

    model: ModelSpec | None
    gpu: GpuProfile | None  # None: a GPU with no constants on file; MBU and MFU stay absent
    gpu_source: str  # "flag", "nvml" or "default": how the profile was chosen
    tensor_parallel_size: int = 1
    gpu_note: str = ""  # why there is no profile (gpus.unknown_gpu_reason), for the log and gpu_info
    # GPUs the routed experts are spread over (expert parallelism); 1 or tp: every copy holds all of them.
    expert_parallel_size: int = 1
    draft: ModelSpec | None = None  # a speculative-decoding draft model, streamed k times a step
    kv_pool_grouped: bool = False  # the engine groups layers by attention type in its KV pool (vLLM)

    @cached_property
    def layout(self) -> Layout | None:
        """The model on these GPUs, for the step model (agent/roofline/step.py); None without a model."""
        if self.model is None:
            return None
        return Layout(self.model, tp=self.tensor_parallel_size, ep=max(self.expert_parallel_size, 1),
                      draft=self.draft, kv_pool_grouped=self.kv_pool_grouped)

    @cached_property
    def roofs(self) -> Roofs | None:
        """The copy's peaks (compute at the model's GEMM dtype, bandwidth) and its link; None for an unknown
        GPU or without a model."""
        if self.model is None or self.gpu is None or self.peak_flops is None or self.peak_bandwidth is None:
            return None
        return Roofs(self.peak_flops, self.peak_bandwidth, self.gpu.link)

    @cached_property
    def gpu_key(self) -> str:
        """The profile key, or 'unknown' when the GPU has no constants."""
        return self.gpu.key if self.gpu else UNKNOWN_GPU

    @cached_property
    def compute_dtype(self) -> str:
        """The dtype whose tensor-core peak bounds the matmuls: the model's GEMM dtype (fp8 for W8A8
        fp8; 16-bit for weight-only int8/int4 and for fp32 checkpoints, which vLLM serves in 16 bit),
        as this GPU runs it (fp8 on Ampere falls back to 16 bit)."""
        dtype = self.model.compute_dtype if self.model else "bf16"
        return self.gpu.peak_dtype_for(dtype) if self.gpu else dtype

    @cached_property
    def peak_flops_per_gpu(self) -> float | None:
        """Dense peak of one GPU at compute_dtype; None for an unknown GPU."""
        return self.gpu.peak_flops[self.compute_dtype] if self.gpu else None

    @cached_property
    def peak_flops(self) -> float | None:
        """Dense peak of all the GPUs one model copy spans; None for an unknown GPU."""
        per_gpu = self.peak_flops_per_gpu
        return None if per_gpu is None else per_gpu * self.tensor_parallel_size

    @cached_property
    def peak_bandwidth(self) -> float | None:
        """HBM peak of all the GPUs one model copy spans (each streams its shard of the weights);
        None for an unknown GPU."""
        if self.gpu is None:
            return None
        return self.gpu.memory_bandwidth_bytes_per_second * self.tensor_parallel_size
