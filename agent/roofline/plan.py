"""The serving calculator of docs/physics.md, for one model on one GPU type: the Plan and the pools.

Owns the Plan (every figure in base units: bytes, seconds, FLOP, FLOP/s, tokens/s) and the pool sizing
(PoolPlan). All arithmetic is agent/roofline/physics.py; this module only decides which numbers to put in.
Pure: the `rooflight plan` command (its flags, its text and JSON, the live agent it reads) is
agent/plan_cli.py.

Conventions: whole-model bytes (weights, KV) against the peak of the model's GPUs (tp x per-GPU
peak); memory is per GPU (each GPU holds 1/tp of the weights and its shard of the KV cache).
In text (the pools' reasons here, the command's output in agent/plan_cli.py): decimal units (1 GB =
1e9 B), KV per token also in KiB (128 KiB = 131,072 B), figures to 3 significant digits (sig);
docs/physics.md (section Plan ceilings) rounds the same values to 2-3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rooflight.agent.roofline import physics as ph
from rooflight.agent.errors import ConfigError
from rooflight.agent.roofline.gpus import GpuProfile
from rooflight.agent.roofline.models import ModelSpec

NVLINK_ALLREDUCE_SECONDS = 5e-6  # fixed launch-plus-latency floor of one small all-reduce on NVLink
NVLINK_BYTES_PER_SECOND = 450e9  # one GPU's NVLink 4 bandwidth, one direction (H100/H200 SXM)
PCIE_ALLREDUCE_SECONDS = 25e-6  # the same floor across PCIe
PCIE_BYTES_PER_SECOND = 25e9  # PCIe Gen4 x16, one direction, what an all-reduce sees in practice
# Profiles whose GPUs talk over PCIe only (no NVLink in the usual server): TP all-reduces pay PCIe's figures.
PCIE_ONLY = frozenset({"a100-pcie-40gb", "a100-pcie-80gb", "h100-pcie", "l40s", "l40", "l4", "a10",
                       "rtx-6000-ada", "rtx-4090"})
DEFAULT_TTFT_SLO_SECONDS = 0.5  # a chat prompt's p99 time to first token
TAIL_MISS = 0.01  # the SLOs are p99s: at most 1% of requests past them
DEFAULT_DECODE_MBU = 0.7  # a healthy decode's share of the bandwidth peak (section MBU: 0.6-0.8)
DEFAULT_ITL_SLO_SECONDS = 0.05  # a chat stream's inter-token budget (20 tokens/s)


@dataclass(frozen=True)
class Plan:
    """One serving configuration worked through the roofline. Base units throughout."""

    model: str
    model_source: str
    gpu: str
    tp: int
    context_tokens: int
    batch: int
    prompt_tokens: int
    prefill_mfu: float
    weight_dtype: str
    kv_dtype: str
    compute_dtype: str  # the GEMM dtype whose peak this GPU runs them at
    params_total: float
    params_active: float
    n_layers: int
    peak_flops: float  # the model's GPUs together, at the weight dtype's GEMM peak
    peak_bandwidth_bytes_per_second: float  # the model's GPUs together
    weight_bytes: float  # whole model
    weight_bytes_per_gpu: float
    weight_bytes_streamed_per_step: float  # at `batch`: all weights, or (MoE) the experts touched
    kv_bytes_per_token: float  # whole model, all layers
    kv_bytes_per_sequence: float  # at context_tokens, whole model (sliding windows capped)
    windowed_layers: int  # layers that keep only a window of recent tokens
    kv_window_tokens: int  # the largest such window (0: none)
    reserved_bytes_per_gpu: float
    kv_bytes_free_per_gpu: float  # memory - weights/tp - reserved (negative: does not fit)
    kv_bytes_free_total: float
    fits: bool
    max_concurrent_sequences: float  # at context_tokens
    ridge_point: float  # FLOP/byte
    decode_step_seconds_weights_only: float  # batch 1, no cache
    decode_tokens_per_second_weights_only: float
    decode_step_seconds_at_context: float  # batch 1, one sequence's cache at context_tokens
    decode_tokens_per_second_at_context: float
    decode_step_seconds_at_batch: float  # `batch` sequences, each at context_tokens
    decode_tokens_per_second_at_batch: float
    decode_intensity_at_batch: float  # FLOP/byte
    decode_attainable_fraction_of_peak: float  # roofline at that intensity / peak compute
    kv_weight_crossover_tokens: float | None  # None: sliding windows cap the cache below the weights
    tp_allreduce_seconds_per_token: float  # NVLink estimate, 0 at tp=1
    tp_allreduce_seconds_at_batch: float  # latency + payload of `batch` tokens' activations, on the GPU's link
    decode_step_seconds_at_batch_with_tp: float  # decode_step_seconds_at_batch + that
    decode_tokens_per_second_at_batch_with_tp: float
    prefill_tp_allreduce_seconds: float  # the prompt's activations all-reduced, on top of prefill_seconds
    prefill_flops: float
    prefill_compute_seconds_at_roof: float  # prefill FLOPs / peak
    prefill_weight_seconds: float  # reading the weights the prompt's tokens touch, once
    prefill_seconds_at_roof: float  # max(compute at the roof, weight streaming)
    prefill_seconds: float  # max(compute at prefill_mfu, weight streaming)
    prefill_crossover_tokens: float  # prompts shorter than this are memory-bound (weight streaming)
    prefill_memory_bound: bool  # prompt shorter than the crossover
    notes: tuple[str, ...]  # how the model's checkpoint was read


def build_plan(model: ModelSpec, gpu: GpuProfile, *, tp: int, context_tokens: int, batch: int,
               prompt_tokens: int, prefill_mfu: float = 0.5, reserved_bytes_per_gpu: float = 4e9) -> Plan:
    """Work one configuration through docs/physics.md's arithmetic; ConfigError on impossible inputs."""
    if tp < 1 or context_tokens < 1 or batch < 1 or prompt_tokens < 1:
        raise ConfigError("--tp, --context, --batch and --prompt-tokens must be at least 1")
    if not 0 < prefill_mfu <= 1:
        raise ConfigError(f"--prefill-mfu must be in (0, 1], got {prefill_mfu}")
    if model.n_heads % tp:
        raise ConfigError(f"{model.n_heads} attention heads cannot be split over tp={tp} GPUs")
    compute_dtype = gpu.peak_dtype_for(model.compute_dtype)
    peak = tp * gpu.peak_flops[compute_dtype]
    bw = tp * gpu.memory_bandwidth_bytes_per_second
    w = model.weight_bytes
    seq = model.kv_bytes_per_sequence(context_tokens)
    # Per GPU: 1/tp of the weights, and the KV shard it holds (all of an MLA latent; a replicated
    # head when KV heads < tp). Summed over the tp GPUs that is what one step streams.
    seq_streamed = tp * model.kv_bytes_per_sequence_per_gpu(context_tokens, tp)
    w_prompt = model.weight_bytes_streamed(prompt_tokens)  # MoE: the experts the prompt touches
    free = gpu.memory_bytes - w / tp - reserved_bytes_per_gpu
    w1, wb = model.weight_bytes_streamed(1), model.weight_bytes_streamed(batch)  # MoE: experts touched
    step_w = ph.decode_step_seconds(w1, 0, bw)
    step_ctx = ph.decode_step_seconds(w1, seq_streamed, bw)
    step_b = ph.decode_step_seconds(wb, batch * seq_streamed, bw)
    intensity = ph.decode_intensity(batch, model.params_active, wb, batch * seq_streamed)
    crossover = prefill_crossover_tokens(model, peak, bw)
    comm_b = tp_allreduce_seconds(model, gpu, tp, batch)
    return Plan(
        model=model.name, model_source=model.source, gpu=gpu.key, tp=tp, context_tokens=context_tokens,
        batch=batch, prompt_tokens=prompt_tokens, prefill_mfu=prefill_mfu,
        weight_dtype=model.weight_dtype, kv_dtype=model.kv_dtype, compute_dtype=compute_dtype,
        params_total=model.params_total,
        params_active=model.params_active, n_layers=model.n_layers, peak_flops=peak, peak_bandwidth_bytes_per_second=bw,
        weight_bytes=w, weight_bytes_per_gpu=w / tp,
        weight_bytes_streamed_per_step=wb, kv_bytes_per_token=model.kv_bytes_per_token,
        kv_bytes_per_sequence=seq, reserved_bytes_per_gpu=reserved_bytes_per_gpu,
        windowed_layers=model.n_layers - model.full_attention_layers,
        kv_window_tokens=max((win for win, _ in model.window_layers), default=0),
        kv_bytes_free_per_gpu=free, kv_bytes_free_total=free * tp, fits=free > 0,
        max_concurrent_sequences=ph.max_concurrent_sequences(free, seq_streamed / tp),
        ridge_point=ph.ridge_point(peak, bw),
        decode_step_seconds_weights_only=step_w,
        decode_tokens_per_second_weights_only=ph.decode_tokens_per_second(1, step_w),
        decode_step_seconds_at_context=step_ctx,
        decode_tokens_per_second_at_context=ph.decode_tokens_per_second(1, step_ctx),
        decode_step_seconds_at_batch=step_b,
        decode_tokens_per_second_at_batch=ph.decode_tokens_per_second(batch, step_b),
        decode_intensity_at_batch=intensity,
        decode_attainable_fraction_of_peak=ph.attainable_flops(intensity, peak, bw) / peak,
        kv_weight_crossover_tokens=model.context_for_sequence_kv_bytes(w),
        tp_allreduce_seconds_per_token=ph.tensor_parallel_allreduce_seconds(
            model.n_layers, tp, NVLINK_ALLREDUCE_SECONDS),
        tp_allreduce_seconds_at_batch=comm_b,
        decode_step_seconds_at_batch_with_tp=step_b + comm_b,
        decode_tokens_per_second_at_batch_with_tp=ph.decode_tokens_per_second(batch, step_b + comm_b),
        prefill_tp_allreduce_seconds=tp_allreduce_seconds(model, gpu, tp, prompt_tokens),
        prefill_flops=ph.prefill_flops(prompt_tokens, model.params_active),
        prefill_compute_seconds_at_roof=ph.prefill_seconds(prompt_tokens, model.params_active, peak, 1.0),
        prefill_weight_seconds=ph.weight_stream_seconds(w_prompt, bw),
        prefill_seconds_at_roof=ph.prefill_seconds_bound(
            prompt_tokens, model.params_active, peak, 1.0, w_prompt, bw),
        prefill_seconds=ph.prefill_seconds_bound(
            prompt_tokens, model.params_active, peak, prefill_mfu, w_prompt, bw),
        prefill_crossover_tokens=crossover,
        prefill_memory_bound=prompt_tokens < crossover,
        notes=model.notes,
    )


def tp_allreduce_seconds(model: ModelSpec, gpu: GpuProfile, tp: int, tokens: float) -> float:
    """TP communication of one forward pass over `tokens` tokens on this GPU's link (NVLink, or PCIe for the
    PCIE_ONLY profiles): 2 all-reduces per layer, latency + 2 (tp - 1) / tp x tokens x hidden x 2 bytes / link."""
    pcie = gpu.key in PCIE_ONLY
    return ph.tensor_parallel_allreduce_seconds_at(
        model.n_layers, tp, tokens, model.hidden_size, PCIE_ALLREDUCE_SECONDS if pcie else NVLINK_ALLREDUCE_SECONDS,
        PCIE_BYTES_PER_SECOND if pcie else NVLINK_BYTES_PER_SECOND)


def prefill_crossover_tokens(model: ModelSpec, peak_flops: float, peak_bandwidth: float) -> float:
    """Prompt length where prefill compute at the roof equals reading the weights it touches once.
    Dense: W x peak / (2 P x bandwidth). MoE: a longer prompt touches more experts, so the bytes
    depend on the length; iterating from all the weights converges down to the crossing."""
    tokens = ph.prefill_crossover_tokens(model.weight_bytes, model.params_active, peak_flops, peak_bandwidth)
    for _ in range(100 if model.n_experts else 0):
        nxt = ph.prefill_crossover_tokens(model.weight_bytes_streamed(tokens), model.params_active,
                                          peak_flops, peak_bandwidth)
        if abs(nxt - tokens) < 1e-6 * tokens:
            return nxt
        tokens = nxt
    return tokens


def sig(x: float, digits: int = 3) -> str:
    """3 significant digits, thousands separated, no trailing zeros: 4.776 -> '4.78', 33628 -> '33,600'."""
    if x == 0 or not math.isfinite(x):
        return str(x)
    r = round(x, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{r:,.0f}" if abs(r) >= 10 ** (digits - 1) else f"{r:,.{digits}g}".rstrip(".")


def ms(s: float) -> str:
    """Seconds as milliseconds to 3 significant digits: 0.0104 -> '10.4 ms'."""
    return f"{sig(s * 1e3)} ms"


# --- Pools: disaggregated prefill and decode, or one shared pool (docs/physics.md, section Headroom) ---

@dataclass(frozen=True)
class PoolPlan:
    """Groups (engine copies of `gpus_per_group` GPUs) for a request rate, split into prefill and decode
    pools or shared, each sized at its latency target; base units (requests/s, tokens, tokens/s, seconds,
    bytes, ratios)."""

    rate: float
    prompt_tokens: float
    output_tokens: float
    prefill_tokens_per_second: float  # demand: rate x prompt
    decode_tokens_per_second: float  # demand: rate x output
    prefill_capacity_per_group: float
    decode_capacity_per_group: float  # at the batch whose step meets the ITL target (physics), else as given
    capacity_source: str  # flags, physics or live
    gpus_per_group: int
    prefill_groups: int  # the fewest whose p99 TTFT (M/M/c wait + one prefill) meets ttft_slo
    decode_groups: int  # ceil(rate x output / decode capacity)
    shared_groups: int  # one pool doing both, its prompts' p99 TTFT at ttft_slo
    prefill_groups_at_full_load: int  # ceil(rate x prompt / prefill capacity): 100% busy, the queue unbounded
    shared_groups_at_full_load: int  # ceil(rate x (prompt / prefill cap + output / decode cap))
    prefill_utilization: float  # prefill demand / the prefill pool's capacity
    decode_utilization: float
    shared_utilization: float
    prefill_seconds_per_prompt: float  # prompt / prefill cap: how long one prompt holds a group
    ttft_slo: float
    itl_slo: float
    decode_batch: float | None  # the batch the decode capacity assumes (physics only)
    kv_bytes_per_request: float | None  # the cache a prefill pool ships to the decode pool per request
    share: bool
    reasons: tuple[str, ...]


def build_pool_plan(rate: float, prompt_tokens: float, output_tokens: float, prefill_capacity: float,
                    decode_capacity: float, *, itl_slo: float = DEFAULT_ITL_SLO_SECONDS,
                    ttft_slo: float = DEFAULT_TTFT_SLO_SECONDS, source: str = "flags", gpus_per_group: int = 1,
                    decode_batch: float | None = None, kv_bytes_per_request: float | None = None) -> PoolPlan:
    """Size both pools at their targets and decide on the physics (docs/physics.md, section Pools sized at the
    SLO). Prefill: the fewest groups whose p99 TTFT, an M/M/c queueing wait plus one prompt's prefill, meets
    ttft_slo. Decode: the demand over what a group decodes at its ITL. Share one pool when one prompt's
    prefill fits in the ITL budget (a shared pool's decodes barely wait for it), or when one of the two
    pools would carry under one group's work; else split."""
    for name, value in (("--rate", rate), ("--prompt", prompt_tokens), ("--output", output_tokens),
                        ("prefill capacity", prefill_capacity), ("decode capacity", decode_capacity),
                        ("--itl-slo", itl_slo), ("--ttft-slo", ttft_slo)):
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{name} must be a number above 0, got {value!r}")
    prefill_demand, decode_demand = rate * prompt_tokens, rate * output_tokens
    stall = prompt_tokens / prefill_capacity  # one prompt's prefill: the service time of the prefill queue
    prefill_load, decode_load = prefill_demand / prefill_capacity, decode_demand / decode_capacity  # groups' work
    prefill_groups = ph.servers_for_latency(rate, stall, ttft_slo, TAIL_MISS)
    if prefill_groups is None:
        raise ConfigError(f"one prompt's prefill takes {ms(stall)}, at or past the {ms(ttft_slo)} TTFT target: "
                          "no number of groups meets it; raise --ttft-slo, --tp or the prefill capacity")
    decode_groups = ph.groups_needed(decode_demand, decode_capacity)
    shared = shared_groups_for(rate, stall, decode_load, ttft_slo)
    reasons = []
    if min(prefill_load, decode_load) < 1.0:
        reasons.append(f"two pools would carry {sig(prefill_load)} prefill and {sig(decode_load)} decode groups' "
                       "work: a pool with under one group's work idles most of its GPUs; too small a fleet to "
                       "keep two pools busy")
    if stall <= itl_slo:
        reasons.append(f"one prompt's prefill takes {ms(stall)}, within the {ms(itl_slo)} ITL budget: "
                       "a shared pool's decodes barely wait, and the KV hop buys nothing")
    return PoolPlan(
        rate=rate, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
        prefill_tokens_per_second=prefill_demand, decode_tokens_per_second=decode_demand,
        prefill_capacity_per_group=prefill_capacity, decode_capacity_per_group=decode_capacity,
        capacity_source=source, gpus_per_group=gpus_per_group, prefill_groups=prefill_groups,
        decode_groups=decode_groups, shared_groups=shared,
        prefill_groups_at_full_load=ph.groups_needed(prefill_demand, prefill_capacity),
        shared_groups_at_full_load=ph.groups_needed(prefill_load + decode_load, 1.0),
        prefill_utilization=prefill_load / prefill_groups, decode_utilization=decode_load / decode_groups,
        shared_utilization=(prefill_load + decode_load) / shared,
        prefill_seconds_per_prompt=stall, ttft_slo=ttft_slo, itl_slo=itl_slo,
        decode_batch=decode_batch, kv_bytes_per_request=kv_bytes_per_request, share=bool(reasons),
        reasons=tuple(reasons) or (
            f"one prompt's prefill holds a group {ms(stall)}, past the {ms(itl_slo)} ITL budget a shared pool's "
            "decodes would wait: split, and scale each pool on its own signal",),
    )


def shared_groups_for(rate: float, prefill_seconds: float, decode_load: float, ttft_slo: float) -> int:
    """The fewest groups of one shared pool whose prompts' p99 TTFT meets ttft_slo: each of c groups spends
    decode_load / c of its time decoding, so a prompt's prefill stretches to S / (1 - decode_load / c) and
    the prefill queue is M/M/c at that service time."""
    def meets(groups: int) -> bool:
        free = 1.0 - decode_load / groups
        if free <= 0:
            return False
        service = prefill_seconds / free
        return service < ttft_slo and ph.mmc_wait_exceeds(groups, rate, service, ttft_slo - service) <= TAIL_MISS

    return ph.fewest_meeting(max(1, math.ceil(rate * prefill_seconds + decode_load - 1e-9)), meets)


def physics_capacities(model: ModelSpec, gpu: GpuProfile, *, tp: int, prompt_tokens: float, output_tokens: float,
                       batch_max: int, prefill_mfu: float, decode_mbu: float, reserved_bytes_per_gpu: float,
                       itl_slo: float | None = None) -> tuple[float, float, float, float]:
    """(prefill tokens/s, decode tokens/s, decode batch, KV bytes per request) of one group of tp GPUs.

    Prefill: a prompt takes P x 2P_active / (peak x prefill MFU) + its TP all-reduces. Decode: the batch N =
    min(batch cap, sequences the KV memory holds at the mean live context prompt + output/2) or, with
    `itl_slo`, the largest batch up to N whose step (roofline at decode_mbu x the bandwidth peak, plus the
    TP all-reduces) meets it; that batch / its step."""
    if not 0 < decode_mbu <= 1 or not 0 < prefill_mfu <= 1:
        raise ConfigError("--decode-mbu and --prefill-mfu must be in (0, 1]")
    if batch_max < 1:
        raise ConfigError("--batch-max must be at least 1")
    peak = tp * gpu.peak_flops[gpu.peak_dtype_for(model.compute_dtype)]
    bw = tp * gpu.memory_bandwidth_bytes_per_second
    context = prompt_tokens + output_tokens / 2
    free = gpu.memory_bytes - model.weight_bytes / tp - reserved_bytes_per_gpu
    seq_per_gpu = model.kv_bytes_per_sequence_per_gpu(context, tp)
    kv_wall = min(float(batch_max), ph.max_concurrent_sequences(free, seq_per_gpu))
    if kv_wall < 1:
        raise ConfigError(f"{model.name} on {tp} x {gpu.key}: no sequence of {context:,.0f} tokens fits beside "
                          "the weights; raise --tp")

    def step(batch: float) -> float:
        return ph.decode_step_seconds_roofline(batch, model.weight_bytes_streamed(batch), tp * seq_per_gpu,
                                               model.params_active, peak * prefill_mfu,
                                               bw * decode_mbu) + tp_allreduce_seconds(model, gpu, tp, batch)

    batch = kv_wall if itl_slo is None else _batch_within(step, kv_wall, itl_slo)
    if batch is None:
        raise ConfigError(f"{model.name} on {tp} x {gpu.key}: one sequence's decode step takes {ms(step(1.0))}, "
                          f"past the {ms(itl_slo or 0.0)} ITL target; raise --itl-slo or --tp")
    prompt_seconds = (prompt_tokens * ph.prefill_seconds_per_token(model.params_active, peak, prefill_mfu)
                      + tp_allreduce_seconds(model, gpu, tp, prompt_tokens))
    return prompt_tokens / prompt_seconds, batch / step(batch), batch, model.kv_bytes_per_sequence(prompt_tokens)


def _batch_within(step: Any, most: float, seconds: float) -> float | None:
    """The largest whole batch up to `most` whose step(batch) <= seconds (step grows with the batch); None
    when even one sequence's step is longer."""
    if step(1.0) > seconds:
        return None
    if step(most) <= seconds:
        return most
    low, high = 1, math.floor(most)  # step(low) meets it, step(high) does not
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if step(float(mid)) <= seconds else (low, mid)
    return float(low)
