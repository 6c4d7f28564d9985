"""The simulated engine's hardware and model constants, and what one engine step costs.

This is the only place the demo turns work into time, and it does so through the step model the agent uses
(`rooflight.agent.roofline.step`), so the demo and the agent share one physics: a step reads the weights its
tokens touch plus every decoding sequence's live KV bytes at the achieved bandwidth (peak x efficiency), and
does its tokens' FLOPs (2 x the parameters each multiplies, the prompts' causal attention, the LM head once a
prompt) at the peak dense FLOP/s x prefill MFU.

A step that mixes phases (a prefill admitted while other sequences decode) costs decode time PLUS
prefill time, not the max of the two (`StepCost.seconds`). That is the arithmetic of docs/physics.md (section
Prefill time) for a mixed iteration (decode 6.1 ms + a 512-token chunk 16.6 ms ~= 23 ms): on one set of SMs
the prefill's compute and the decode's memory stream run one after the other in practice, and with it the
head-of-line stall is every in-flight decode stalling ~260 ms on top of its own ~6 ms step. A prefill-only
step still has to read the weights once, so it costs max(weight read, prefill compute): a prompt shorter
than the crossover (~300 tokens) is memory-bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from rooflight.agent.roofline.gpus import get_profile
from rooflight.agent.roofline.models import preset
from rooflight.agent.roofline.step import Decode, Layout, Prefill, Roofs, Step, StepCost

# Bytes the runtime (CUDA context, activations, CUDA graphs) keeps out of the KV pool; vLLM's
# profiling run measures this, the demo fixes it.
RUNTIME_RESERVE_BYTES = 2_000_000_000


@dataclass(frozen=True, slots=True)
class Plant:
    """The simulated model on its simulated GPU, resolved once from the GPU profile and model preset."""

    gpu_profile: str
    model_preset: str
    layout: Layout  # the model on one GPU, for the step model
    peak_flops: float  # dense FLOP/s of one GPU at the model's GEMM dtype
    peak_bandwidth: float  # HBM bytes/s of one GPU
    memory_bytes: float  # HBM capacity
    bandwidth_efficiency: float = 0.8
    prefill_mfu: float = 0.5
    block_size: int = 16
    gpu_memory_utilization: float = 0.9

    @property
    def weight_bytes(self) -> float:
        """Every weight, as the GPU holds them."""
        return self.layout.weight_bytes_per_gpu

    @property
    def kv_bytes_per_token(self) -> float:
        """K+V bytes a token takes in the pool (every layer)."""
        return self.layout.kv_bytes_per_pool_token

    @property
    def roofs(self) -> Roofs:
        """What the simulated GPU reaches: its peaks at the demo's efficiencies."""
        return Roofs(self.peak_flops, self.peak_bandwidth).at(self.prefill_mfu, self.bandwidth_efficiency)

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
        layout=Layout(spec),
        peak_flops=float(profile.peak_flops_for(spec.compute_dtype)),
        peak_bandwidth=float(profile.memory_bandwidth_bytes_per_second),
        memory_bytes=float(profile.memory_bytes),
        bandwidth_efficiency=bandwidth_efficiency,
        prefill_mfu=prefill_mfu,
        block_size=block_size,
        gpu_memory_utilization=gpu_memory_utilization,
    )


def step_of(plant: Plant, prefill: Sequence[tuple[int, int, bool]], decode_contexts: Sequence[int]) -> Step:
    """The step a scheduled batch runs: prefill chunks (start, end, whether it ends its prompt) and the
    decoding sequences' contexts (the tokens each holds)."""
    layout = plant.layout
    decode = None
    if decode_contexts:
        held = sum(layout.layer_tokens(c) for c in decode_contexts)
        decode = Decode(len(decode_contexts), held / len(decode_contexts))
    chunk = None
    if prefill:
        chunk = Prefill(float(sum(end - start for start, end, _ in prefill)),
                        tuple((1.0, float(start), float(end)) for start, end, _ in prefill),
                        float(sum(1 for *_, ends in prefill if ends)))
    return Step(decode=decode, prefill=chunk)


def step_cost(plant: Plant, step: Step) -> StepCost:
    return plant.layout.cost(step)


def step_seconds(plant: Plant, step: Step) -> float:
    """Wall time of one engine step (see the module docstring for the mixed-phase rule)."""
    if step.decode is None and step.prefill is None:
        return 0.0
    return step_cost(plant, step).seconds(plant.roofs)
