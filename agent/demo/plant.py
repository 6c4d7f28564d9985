"""The simulated engine's hardware and model constants, and what one engine step costs.

This is the only place the demo turns work into time, and it does so through `rooflight.agent.roofline.physics`, so the
demo and the agent share one physics: a decode step streams the weights plus every running
sequence's live KV bytes at the achieved bandwidth (peak x efficiency); a prefill costs 2 x active
params FLOPs per token at the peak dense FLOP/s x prefill MFU.

A step that mixes phases (a prefill admitted while other sequences decode) costs decode time PLUS
prefill time, not the max of the two. That is the arithmetic of docs/physics.md (section Prefill
time) for a mixed iteration (decode 6.1 ms + a 512-token chunk 16.6 ms ~= 23 ms): on one set of SMs
the prefill's compute and the decode's memory stream run one after the other in practice, and with
it the head-of-line stall is every in-flight decode stalling ~260 ms on top of its own ~6 ms step. A prefill-only step
still has to stream the weights once, so it costs max(weight read, prefill compute): a prompt
shorter than the ridge (~295 tokens) is memory-bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from rooflight.agent.roofline import physics
from rooflight.agent.roofline.gpus import get_profile
from rooflight.agent.roofline.models import preset

# Bytes the runtime (CUDA context, activations, CUDA graphs) keeps out of the KV pool; vLLM's
# profiling run measures this, the demo fixes it.
RUNTIME_RESERVE_BYTES = 2_000_000_000


@dataclass(frozen=True, slots=True)
class Plant:
    """Plain numbers the simulator needs, resolved once from the GPU profile and model preset."""

    gpu_profile: str
    model_preset: str
    weight_bytes: float
    kv_bytes_per_token: float
    params_active: float
    peak_flops: float  # dense bf16 FLOP/s of one GPU
    peak_bandwidth: float  # HBM bytes/s of one GPU
    memory_bytes: float  # HBM capacity
    bandwidth_efficiency: float = 0.8
    prefill_mfu: float = 0.5
    block_size: int = 16
    gpu_memory_utilization: float = 0.9

    @property
    def achieved_bandwidth(self) -> float:
        return self.peak_bandwidth * self.bandwidth_efficiency

    @property
    def kv_pool_bytes(self) -> float:
        """vLLM's KV budget: utilization x HBM, less weights and the runtime reserve."""
        return self.memory_bytes * self.gpu_memory_utilization - self.weight_bytes - RUNTIME_RESERVE_BYTES

    @property
    def num_gpu_blocks(self) -> int:
        return int(self.kv_pool_bytes // (self.kv_bytes_per_token * self.block_size))

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size


def make_plant(
    gpu: str,
    model: str,
    *,
    bandwidth_efficiency: float = 0.8,
    prefill_mfu: float = 0.5,
    block_size: int = 16,
    gpu_memory_utilization: float = 0.9,
) -> Plant:
    """Resolve a GPU profile name and a model preset name into a Plant (ConfigError if unknown)."""
    profile = get_profile(gpu)
    spec = preset(model)
    return Plant(
        gpu_profile=gpu,
        model_preset=model,
        weight_bytes=float(spec.weight_bytes),
        kv_bytes_per_token=float(spec.kv_bytes_per_token),
        params_active=float(spec.params_active),
        peak_flops=float(profile.peak_flops_for("bf16")),
        peak_bandwidth=float(profile.memory_bandwidth_bytes_per_second),
        memory_bytes=float(profile.memory_bytes),
        bandwidth_efficiency=bandwidth_efficiency,
        prefill_mfu=prefill_mfu,
        block_size=block_size,
        gpu_memory_utilization=gpu_memory_utilization,
    )


def decode_seconds(plant: Plant, live_kv_tokens: float) -> float:
    """One decode pass: weights + live KV bytes over the achieved bandwidth."""
    return physics.decode_step_seconds(
        plant.weight_bytes, live_kv_tokens * plant.kv_bytes_per_token, plant.achieved_bandwidth
    )


def prefill_compute_seconds(plant: Plant, tokens: float) -> float:
    """Prefill FLOPs (2 x active params per token) over peak x prefill MFU."""
    return physics.prefill_seconds(tokens, plant.params_active, plant.peak_flops, plant.prefill_mfu)


def step_seconds(plant: Plant, prefill_tokens: float, decode_seqs: int, live_kv_tokens: float) -> float:
    """Wall time of one engine step (see the module docstring for the mixed-phase rule).

    `live_kv_tokens` is the KV the decoding sequences attend over (read this step).
    """
    if decode_seqs > 0:
        t = decode_seconds(plant, live_kv_tokens)
        if prefill_tokens > 0:
            t += prefill_compute_seconds(plant, prefill_tokens)
        return t
    if prefill_tokens > 0:
        weight_read = plant.weight_bytes / plant.achieved_bandwidth
        return max(weight_read, prefill_compute_seconds(plant, prefill_tokens))
    return 0.0


def step_read_bytes(plant: Plant, prefill_tokens: float, decode_seqs: int, live_kv_tokens: float) -> float:
    """HBM bytes a step reads: the weights once, plus the decoders' live KV."""
    if decode_seqs == 0 and prefill_tokens == 0:
        return 0.0
    return plant.weight_bytes + (live_kv_tokens * plant.kv_bytes_per_token if decode_seqs else 0.0)


def step_flops(plant: Plant, tokens: float) -> float:
    """2 x active params per token computed (prefill and decode alike; attention FLOPs not modelled)."""
    return physics.prefill_flops(tokens, plant.params_active)
