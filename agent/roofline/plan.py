"""`rooflight plan`: the serving calculator of docs/physics.md, for one model on one GPU type.

Owns the Plan (every figure in base units: bytes, seconds, FLOP, FLOP/s, tokens/s), its human text
and its JSON form, and the `plan` subcommand. All arithmetic is agent/roofline/physics.py; this module only
decides which numbers to put in and how to print them.

Conventions: whole-model bytes (weights, KV) against the peak of the model's GPUs (tp x per-GPU
peak); memory is per GPU (each GPU holds 1/tp of the weights and its shard of the KV cache).
Decimal units in the text (1 GB = 1e9 B), KV per token also in KiB (128 KiB = 131,072 B). Figures
print to 3 significant digits; docs/physics.md (section Plan ceilings) rounds the same values to 2-3.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

from rooflight.agent.roofline import physics as ph
from rooflight.agent.errors import ConfigError
from rooflight.agent.roofline.gpus import DEFAULT_PROFILE_KEY, PROFILES, GpuProfile, get_profile
from rooflight.agent.roofline.models import PRESETS, ModelSpec, load_config_json, preset, preset_for_hf_id

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


def _gb(b: float) -> str:
    return f"{sig(b / 1e9)} GB"


def _ms(s: float) -> str:
    return f"{sig(s * 1e3)} ms"


def format_plan(plan: Plan) -> str:
    """Human text: each line is a number and what it means."""
    p = plan
    moe = f" ({sig(p.params_active / 1e9)}B active)" if p.params_active < p.params_total else ""
    lines = [
        f"{p.model} on {p.tp} x {p.gpu}: {sig(p.params_total / 1e9)}B params{moe}, "
        f"weights {p.weight_dtype}, KV cache {p.kv_dtype}; context {p.context_tokens:,} tokens, "
        f"batch {p.batch}",
        "",
        "Memory (per GPU unless said)",
        f"  weights                 {_gb(p.weight_bytes)} total, {_gb(p.weight_bytes_per_gpu)} per GPU",
        f"  KV cache per token      {p.kv_bytes_per_token:,.0f} B ({sig(p.kv_bytes_per_token / 1024)} KiB),"
        " all layers",
        f"  KV cache per sequence   {_gb(p.kv_bytes_per_sequence)} at {p.context_tokens:,} tokens"
        + (f" ({p.windowed_layers} of {p.n_layers} layers keep only the last {p.kv_window_tokens:,})"
           if p.windowed_layers else ""),
        f"  KV memory left          {_gb(p.kv_bytes_free_per_gpu)} per GPU ({_gb(p.kv_bytes_free_total)}"
        f" in all), after {_gb(p.reserved_bytes_per_gpu)} reserved for runtime and activations",
    ]
    if p.weight_bytes_streamed_per_step < p.weight_bytes:
        lines.append(f"  MoE weights streamed    {_gb(p.weight_bytes_streamed_per_step)} per step at batch "
                     f"{p.batch} (the experts its tokens touch; batch 1 reads only the active ones)")
    if p.fits:
        lines.append(f"  max concurrent seqs     {p.max_concurrent_sequences:,.0f} at {p.context_tokens:,}"
                     " tokens each: the batch the KV wall allows")
    else:
        lines.append("  DOES NOT FIT            the weights alone exceed this GPU's memory: raise --tp")
    lines += [
        "",
        "Roofline",
        f"  ridge point             {sig(p.ridge_point)} FLOP/byte: below it a step waits on memory",
        f"  decode ceiling          {_ms(p.decode_step_seconds_weights_only)}/token, "
        f"{sig(p.decode_tokens_per_second_weights_only)} tok/s (batch 1, weights only)",
        f"  decode ceiling at ctx   {_ms(p.decode_step_seconds_at_context)}/token, "
        f"{sig(p.decode_tokens_per_second_at_context)} tok/s (batch 1, weights + KV at "
        f"{p.context_tokens:,} tokens)",
        f"  cache = weights at      {sig(p.kv_weight_crossover_tokens)} tokens of context"
        if p.kv_weight_crossover_tokens is not None else
        "  cache = weights at      never: sliding windows cap one sequence's cache below the weights",
        f"  decode at batch {p.batch:<7} {_ms(p.decode_step_seconds_at_batch)}/step, "
        f"{sig(p.decode_tokens_per_second_at_batch)} tok/s in all; intensity "
        f"{sig(p.decode_intensity_at_batch)} FLOP/byte = "
        f"{sig(100 * p.decode_attainable_fraction_of_peak)}% of peak compute at best",
    ]
    if p.tp > 1:
        lines.append(f"  TP all-reduce           ~{_ms(p.tp_allreduce_seconds_per_token)}/token on NVLink"
                     " (2 per layer, ~5 us each), on top of the decode step")
        lines.append(f"  with TP at batch {p.batch:<6} {_ms(p.decode_step_seconds_at_batch_with_tp)}/step, "
                     f"{sig(p.decode_tokens_per_second_at_batch_with_tp)} tok/s in all (all-reduces "
                     f"{_ms(p.tp_allreduce_seconds_at_batch)}: latency + the batch's activations over the link)")
    cross = f"{sig(p.prefill_crossover_tokens)}-token crossover"
    bound = (f"memory-bound: shorter than the {cross}, it waits on reading the weights"
             if p.prefill_memory_bound else f"compute-bound: longer than the {cross}")
    lines += [
        "",
        f"Prefill of {p.prompt_tokens:,} tokens ({bound})",
        f"  work                    {sig(p.prefill_flops / 1e12)} TFLOP, "
        f"{_ms(p.prefill_compute_seconds_at_roof)} at peak compute",
        f"  weight streaming        {_ms(p.prefill_weight_seconds)} to read the weights once: the floor "
        f"of any prompt under {sig(p.prefill_crossover_tokens)} tokens",
        f"  time                    {_ms(p.prefill_seconds_at_roof)} at the compute roof, "
        f"{_ms(p.prefill_seconds)} at {sig(100 * p.prefill_mfu)}% MFU (the longer of compute and "
        "weight streaming)" + (f"; + {_ms(p.prefill_tp_allreduce_seconds)} of TP all-reduces" if p.tp > 1 else ""),
        "",
        f"Peaks used: {sig(p.peak_flops / 1e12)} TFLOP/s dense {p.compute_dtype}, "
        f"{sig(p.peak_bandwidth_bytes_per_second / 1e12)} TB/s ({p.tp} GPU{'s' if p.tp > 1 else ''}). "
        "Every figure is a roofline bound; measured MBU/MFU say how close a live engine gets.",
        *(f"Note: {note}" for note in p.notes),
    ]
    return "\n".join(lines)


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """Every field, base units, for `--json` (null where there is no such number)."""
    return {**dataclasses.asdict(plan), "notes": list(plan.notes)}


def resolve_model(model: str | None, model_config: str | None, weight_dtype: str | None,
                  kv_dtype: str | None) -> ModelSpec:
    """--model-config wins; --model is a preset name or a Hugging Face id that maps to one."""
    if model_config:  # the overrides replace what the config says, so an unsized scheme still plans
        return load_config_json(model_config, weight_dtype=weight_dtype, kv_dtype=kv_dtype)
    else:
        name = model or "ref-8b"
        try:
            spec = preset(name)
        except ConfigError:
            found = preset_for_hf_id(name)
            if found is None:
                raise
            spec = found
    return spec.with_dtypes(weight_dtype, kv_dtype)


def format_catalog() -> str:
    """The model presets and GPU profiles `--model` and `--gpu` accept."""
    lines = ["Model presets (--model):"]
    for key, m in PRESETS.items():
        moe = f", {sig(m.params_active / 1e9)}B active" if m.is_moe else ""
        window = "".join(f", {n}/{m.n_layers} layers keep {w:,} tokens" for w, n in m.window_layers)
        lines.append(f"  {key:<18} {sig(m.params_total / 1e9)}B params{moe}, {m.weight_dtype}, "
                     f"KV {m.kv_bytes_per_token:,.0f} B/token{window}")
    lines.append("GPU profiles (--gpu), dense per-GPU peaks:")
    for key, g in PROFILES.items():
        lines.append(f"  {key:<16} {sig(g.peak_flops['bf16'] / 1e12)} TFLOP/s bf16, "
                     f"{sig(g.memory_bandwidth_bytes_per_second / 1e12)} TB/s, {sig(g.memory_bytes / 1e9)} GB,"
                     f" ridge {sig(g.ridge_point)}")
    return "\n".join(lines)


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
        raise ConfigError(f"one prompt's prefill takes {_ms(stall)}, at or past the {_ms(ttft_slo)} TTFT target: "
                          "no number of groups meets it; raise --ttft-slo, --tp or the prefill capacity")
    decode_groups = ph.groups_needed(decode_demand, decode_capacity)
    shared = shared_groups_for(rate, stall, decode_load, ttft_slo)
    reasons = []
    if min(prefill_load, decode_load) < 1.0:
        reasons.append(f"two pools would carry {sig(prefill_load)} prefill and {sig(decode_load)} decode groups' "
                       "work: a pool with under one group's work idles most of its GPUs; too small a fleet to "
                       "keep two pools busy")
    if stall <= itl_slo:
        reasons.append(f"one prompt's prefill takes {_ms(stall)}, within the {_ms(itl_slo)} ITL budget: "
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
            f"one prompt's prefill holds a group {_ms(stall)}, past the {_ms(itl_slo)} ITL budget a shared pool's "
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
        raise ConfigError(f"{model.name} on {tp} x {gpu.key}: one sequence's decode step takes {_ms(step(1.0))}, "
                          f"past the {_ms(itl_slo or 0.0)} ITL target; raise --itl-slo or --tp")
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


def format_pools(p: PoolPlan) -> str:
    source = {"flags": "as given", "physics": "the roofline of the model on its GPUs", "live": "the live agent"}
    lines = [
        f"Pools for {sig(p.rate)} req/s of {sig(p.prompt_tokens)} prompt + {sig(p.output_tokens)} output tokens"
        f" (p99 TTFT {_ms(p.ttft_slo)}, ITL {_ms(p.itl_slo)})",
        f"  per group ({p.gpus_per_group} GPU{'s' if p.gpus_per_group > 1 else ''}): "
        f"{sig(p.prefill_capacity_per_group)} prefill tok/s, {sig(p.decode_capacity_per_group)} decode tok/s "
        f"({source.get(p.capacity_source, p.capacity_source)}"
        + (f"; decode batch {p.decode_batch:,.0f}" if p.decode_batch else "") + ")",
        f"  prefill pool            {_groups(p.prefill_groups)} at {_pct(p.prefill_utilization)} busy: "
        f"p99 TTFT within {_ms(p.ttft_slo)} ({sig(p.prefill_tokens_per_second)} prompt tok/s / "
        f"{sig(p.prefill_capacity_per_group)} = {p.prefill_groups_at_full_load} at 100%, where the queue never "
        "drains)",
        f"  decode pool             {_groups(p.decode_groups)} at {_pct(p.decode_utilization)} busy "
        f"({sig(p.decode_tokens_per_second)} output tok/s / {sig(p.decode_capacity_per_group)})",
        f"  one shared pool         {_groups(p.shared_groups)} at {_pct(p.shared_utilization)} busy "
        f"({p.shared_groups_at_full_load} at 100%)",
    ]
    if p.kv_bytes_per_request is not None:
        lines.append(f"  KV shipped per request  {_gb(p.kv_bytes_per_request)} (the prompt's cache, prefill to decode)")
    verdict = (f"share one pool of {_groups(p.shared_groups)}" if p.share else
               f"split: {p.prefill_groups} prefill + {_groups(p.decode_groups, 'decode group')}")
    lines += ["", f"Verdict: {verdict}", *(f"  - {r}" for r in p.reasons)]
    return "\n".join(lines)


def _pct(ratio: float) -> str:
    return f"{sig(100 * ratio)}%"


def _groups(n: int, what: str = "group") -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


# --- A running agent's signals (`--from-live`) ---

# The agent's names (agent/metrics/names.py; this floor cannot import it, a test holds the two equal).
LIVE_NAMES = {
    "tokens": "rooflight_tokens_per_second", "requests": "rooflight_requests_per_second",
    "headroom": "rooflight_headroom_ratio", "saturation": "rooflight_saturation_ratio",
    "binding": "rooflight_saturation_binding_info", "capacity": "rooflight_capacity_requests_per_second",
    "capacity_decode": "rooflight_capacity_decode_tokens_per_second",
    "capacity_phase": "rooflight_capacity_phase_tokens_per_second",
    "cost": "rooflight_cost_per_million_tokens", "joule": "rooflight_tokens_per_joule",
}
MAX_LIVE_BYTES = 16 * 1024 * 1024  # read at most this of a page ...
MAX_LIVE_KEPT_BYTES = 4 * 1024 * 1024  # ... and keep at most this of its lines of LIVE_NAMES (an agent: ~1 MB)
_LIVE_CHUNK = 64 * 1024
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class LiveSeries:
    """One (target, engine, model, rank) of a live agent over one window."""

    target: str
    engine: str
    model: str
    rank: str
    window: str
    role: str | None = None
    requests_per_second: float | None = None
    tokens_per_second: dict[str, float] = dataclasses.field(default_factory=dict)
    headroom: dict[str, float] = dataclasses.field(default_factory=dict)
    saturation: float | None = None
    binding: str | None = None
    capacity_requests_per_second: float | None = None
    capacity_decode_tokens_per_second: float | None = None
    capacity_phase_tokens_per_second: dict[str, float] = dataclasses.field(default_factory=dict)
    cost_per_million_tokens: dict[str, float] = dataclasses.field(default_factory=dict)
    tokens_per_joule: dict[str, float] = dataclasses.field(default_factory=dict)

    def mix(self) -> tuple[float, float] | None:
        """(mean prompt, mean output) tokens per request: each phase's tokens/s / requests/s."""
        if not self.requests_per_second:
            return None
        r = self.requests_per_second
        return self.tokens_per_second.get("prefill", 0.0) / r, self.tokens_per_second.get("decode", 0.0) / r


def window_seconds(name: str) -> float:
    """'10s', '1m', '250ms', '1h' in seconds (0 for a name that is not a duration)."""
    for unit in ("ms", "s", "m", "h"):
        if name.endswith(unit):
            try:
                return float(name[: -len(unit)]) * _UNITS[unit]
            except ValueError:
                return 0.0
    return 0.0


def live_series(text: str, window: str | None = None) -> list[LiveSeries]:
    """Every series' signals over `window` (default: the longest the page has) from an agent's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {v: k for k, v in LIVE_NAMES.items()}
    rows: list[tuple[str, dict[str, str], float]] = []
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in wanted and "window" in sample.labels and math.isfinite(sample.value):
                    rows.append((wanted[sample.name], sample.labels, sample.value))
    except (ValueError, TypeError, IndexError, KeyError) as exc:  # prometheus_client's parser raises these
        raise ConfigError(f"--from-live: not a Prometheus text page the agent serves ({type(exc).__name__});"
                          " point it at the agent's /metrics") from None
    windows = {labels["window"] for _, labels, _ in rows}
    if window is not None and window not in windows:
        raise ConfigError(f"--window {window}: the agent serves {', '.join(sorted(windows)) or 'no windows yet'}")
    chosen = window or max(windows, key=window_seconds, default=None)
    out: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for kind, labels, value in rows:
        if labels["window"] != chosen:
            continue
        key = (labels.get("target", ""), labels.get("engine", ""), labels.get("model", ""), labels.get("rank", ""))
        _put(out.setdefault(key, {}), kind, labels, value)
    return [LiveSeries(*key, window=chosen or "", **fields) for key, fields in sorted(out.items())]


def _put(fields: dict[str, Any], kind: str, labels: dict[str, str], value: float) -> None:
    by = {"tokens": ("tokens_per_second", "phase"), "headroom": ("headroom", "resource"),
          "capacity_phase": ("capacity_phase_tokens_per_second", "phase"),
          "cost": ("cost_per_million_tokens", "phase"), "joule": ("tokens_per_joule", "phase")}
    single = {"requests": "requests_per_second", "capacity": "capacity_requests_per_second",
              "capacity_decode": "capacity_decode_tokens_per_second"}
    if kind in by:
        name, label = by[kind]
        fields.setdefault(name, {})[labels.get(label, "")] = value
    elif kind in single:
        fields[single[kind]] = value
    elif kind == "saturation":
        fields["saturation"], fields["role"] = value, labels.get("role")
    elif kind == "binding":
        fields["binding"] = labels.get("resource")


def _shown(text: object) -> str:
    """A label value as a terminal may print it: characters that are not printable (escape sequences that
    retitle, clear or rewrite the screen, line breaks that forge lines) are shown as \\xNN / \\uNNNN."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def format_live(series: list[LiveSeries]) -> str:
    """The live signals as text; every label value from the page goes through _shown (the agent may be hostile)."""
    if not series:
        return "The agent serves no windowed signals yet (no engine sampled, or its windows not yet covered)."
    lines = []
    for s in series:
        lines.append(f"{_shown(s.target)} ({_shown(s.engine)}, {_shown(s.model)}, rank {_shown(s.rank)}), window "
                     f"{_shown(s.window)}, role {_shown(s.role or '?')}")
        tps = s.tokens_per_second
        mix = s.mix()
        if s.requests_per_second is not None:
            each = f" ({sig(mix[0])} prompt + {sig(mix[1])} output tokens each)" if mix else ""
            lines.append(f"  now                     {sig(s.requests_per_second)} req/s; "
                         f"{sig(tps.get('prefill', 0.0))} prefill + {sig(tps.get('decode', 0.0))} decode tok/s{each}")
        if s.capacity_requests_per_second is not None:
            alone = ", ".join(f"{sig(v)} {_shown(k)}" for k, v in s.capacity_phase_tokens_per_second.items())
            lines.append(f"  capacity at this mix    {sig(s.capacity_requests_per_second)} req/s, "
                         f"{sig(s.capacity_decode_tokens_per_second or 0.0)} decode tok/s before the first wall"
                         + (f" (one phase alone: {alone} tok/s)" if alone else ""))
        if s.headroom:
            lines.append("  headroom                " + ", ".join(f"{_shown(k)} {v:.2f}" for k, v in s.headroom.items()))
        if s.saturation is not None:
            lines.append(f"  saturation              {s.saturation:.2f} (binding: {_shown(s.binding or '?')})")
        for phase, cost in s.cost_per_million_tokens.items():
            lines.append(f"  cost                    {sig(cost)} per 1M {_shown(phase)} tokens")
        for phase, tpj in s.tokens_per_joule.items():
            lines.append(f"  energy                  {sig(tpj)} {_shown(phase)} tokens per joule")
    return "\n".join(lines)


def fetch_live(url: str, timeout: float = 10.0) -> str:
    """The lines of LIVE_NAMES on the agent's /metrics (at `url`, or `url`/metrics when the URL has no path);
    ConfigError if unreadable.

    Bounded against a hostile server: `timeout` is the deadline of the whole exchange, not of each read
    (a byte every few seconds cannot keep it going), at most MAX_LIVE_BYTES are read, and only the lines
    live_series reads are kept, at most MAX_LIVE_KEPT_BYTES of them. A user:password in the URL is sent as
    basic auth and never printed; a redirect is not followed (it would carry the credentials elsewhere)."""
    import base64
    import http.client
    import socket
    import threading
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or port == -1:
        raise ConfigError("--from-live: write the agent's URL, e.g. http://127.0.0.1:9746")
    netloc = parts.hostname if port is None else f"{parts.hostname}:{port}"
    path = parts.path if parts.path not in ("", "/") else "/metrics"
    shown = urlunsplit((parts.scheme, netloc, path, "", ""))
    headers = {"Accept": "text/plain", "Host": netloc}
    if parts.username is not None:
        token = f"{parts.username}:{parts.password or ''}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(token).decode()
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = kind(parts.hostname, port, timeout=timeout)
    expired = threading.Event()

    def expire() -> None:  # the deadline: whatever read is waiting ends now
        expired.set()
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    try:
        conn.request("GET", urlunsplit(("", "", path, parts.query, "")), headers=headers)
        response = conn.getresponse()
        if 300 <= response.status < 400:
            raise ConfigError(f"--from-live {shown}: HTTP {response.status}, a redirect; not followed (it could send"
                              " the credentials to another server): give the agent's own URL")
        if response.status != 200:
            raise ConfigError(f"--from-live {shown}: HTTP {response.status}")
        kept = _wanted_lines(response, shown, expired)
    except (OSError, http.client.HTTPException) as exc:
        if expired.is_set():
            raise ConfigError(f"--from-live {shown}: no whole answer within {timeout:g} s") from None
        raise ConfigError(f"--from-live {shown}: cannot read it ({type(exc).__name__})") from None
    finally:
        timer.cancel()
        conn.close()
    if expired.is_set():
        raise ConfigError(f"--from-live {shown}: no whole answer within {timeout:g} s")
    return kept


def _wanted_lines(response: Any, shown: str, expired: Any) -> str:
    """The page's lines that name one of LIVE_NAMES (samples and their # TYPE / # HELP), read a chunk at a time."""
    names = tuple(LIVE_NAMES.values())
    kept: list[bytes] = []
    size = held = 0
    rest = b""
    while not expired.is_set():
        chunk = response.read1(_LIVE_CHUNK)
        if not chunk:
            break
        size += len(chunk)
        if size > MAX_LIVE_BYTES:
            raise ConfigError(f"--from-live {shown}: larger than {MAX_LIVE_BYTES // (1024 * 1024)} MiB; not an agent's page")
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        for line in lines:
            if _names_one_of(line, names):
                held += len(line) + 1
                if held > MAX_LIVE_KEPT_BYTES:
                    raise ConfigError(f"--from-live {shown}: more than {MAX_LIVE_KEPT_BYTES // (1024 * 1024)} MiB of"
                                      " signal lines; not an agent's page")
                kept.append(line)
        if len(rest) > MAX_LIVE_KEPT_BYTES:
            raise ConfigError(f"--from-live {shown}: a line longer than {MAX_LIVE_KEPT_BYTES // (1024 * 1024)} MiB;"
                              " not an agent's page")
    if rest and _names_one_of(rest, names):
        kept.append(rest)
    return b"\n".join(kept).decode("utf-8", errors="replace") + "\n"


def _names_one_of(line: bytes, names: tuple[str, ...]) -> bool:
    text = line[:200].decode("utf-8", errors="replace")
    if text.startswith(("# TYPE ", "# HELP ")):
        text = text[7:]
    for name in names:
        if text.startswith(name) and text[len(name):len(name) + 1] in ("{", " "):
            return True
    return False


def run_capacity(args: argparse.Namespace) -> int:
    """`plan --from-live URL` and/or `plan --rate R`: the live agent's signals, the pools for a rate."""
    series = live_series(fetch_live(args.from_live), args.window) if args.from_live else None
    out: dict[str, Any] = {}
    text = []
    if series is not None:
        out["live"] = [dataclasses.asdict(s) for s in series]
        text.append(format_live(series))
    elif args.rate is not None:  # sizing from the model's physics: the calculator the pools come from, first
        plan = _calculator(args)
        out["plan"] = plan_to_dict(plan)
        text.append(format_plan(plan))
    if args.rate is not None:
        pools = _pools_for(args, series)
        out["pools"] = dataclasses.asdict(pools)
        text.append(format_pools(pools))
    print(json.dumps(out, indent=2) if args.json else "\n\n".join(text))
    return 0


def _pools_for(args: argparse.Namespace, series: list[LiveSeries] | None) -> PoolPlan:
    """The pools for --rate: the mix from --prompt/--output, else the live one; capacities from the flags,
    else the live agent's one-phase capacities, else the model's roofline on --gpu."""
    live = next((s for s in series or () if {"prefill", "decode"} <= set(s.capacity_phase_tokens_per_second)), None)
    mix = live.mix() if live is not None else None
    prompt = args.prompt if args.prompt is not None else (mix[0] if mix else None)
    output = args.output if args.output is not None else (mix[1] if mix else None)
    if prompt is None or output is None:
        raise ConfigError("--rate needs --prompt and --output (mean tokens per request), or --from-live with traffic")
    source, batch, kv, gpus = "flags", None, None, args.tp
    cp, cd = args.prefill_capacity, args.decode_capacity
    if cp is None or cd is None:
        if live is not None:
            source = "live"
            cp = cp if cp is not None else live.capacity_phase_tokens_per_second["prefill"]
            cd = cd if cd is not None else live.capacity_phase_tokens_per_second["decode"]
        else:
            source = "physics"
            model = resolve_model(args.model, args.model_config, args.weight_dtype, args.kv_dtype)
            p_cap, d_cap, batch, kv = physics_capacities(
                model, get_profile(args.gpu), tp=args.tp, prompt_tokens=prompt, output_tokens=output,
                batch_max=args.batch_max, prefill_mfu=args.prefill_mfu, decode_mbu=args.decode_mbu,
                reserved_bytes_per_gpu=args.reserved_gb * 1e9, itl_slo=args.itl_slo)
            cp = cp if cp is not None else p_cap
            cd = cd if cd is not None else d_cap
    return build_pool_plan(args.rate, prompt, output, cp, cd, itl_slo=args.itl_slo, ttft_slo=args.ttft_slo, source=source,
                           gpus_per_group=gpus, decode_batch=batch, kv_bytes_per_request=kv)


def _calculator(args: argparse.Namespace) -> Plan:
    model = resolve_model(args.model, args.model_config, args.weight_dtype, args.kv_dtype)
    return build_plan(model, get_profile(args.gpu), tp=args.tp, context_tokens=args.context, batch=args.batch,
                      prompt_tokens=args.prompt_tokens, prefill_mfu=args.prefill_mfu,
                      reserved_bytes_per_gpu=args.reserved_gb * 1e9)


def run_plan(args: argparse.Namespace) -> int:
    """Entry point of `rooflight plan`; prints text or JSON, returns the exit code."""
    if getattr(args, "list", False):
        print(format_catalog())
        return 0
    if getattr(args, "from_live", None) or getattr(args, "rate", None) is not None:
        return run_capacity(args)
    plan = _calculator(args)
    print(json.dumps(plan_to_dict(plan), indent=2) if args.json else format_plan(plan))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `plan` subcommand (func=run_plan)."""
    p = subparsers.add_parser(
        "plan", help="serving calculator: memory, KV capacity, roofline ceilings for a model on a GPU",
        description="Work a model on a GPU through the roofline: how much memory the weights and each "
        "sequence's KV cache take, how many sequences fit, how fast decode can possibly go "
        "(bandwidth-bound) and how long a prefill takes (compute-bound). Bounds, not measurements.")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", help="preset name or Hugging Face id (default ref-8b, the reference 8B "
                     "of docs/physics.md, with 8e9 params); presets: llama-3-8b, llama-3-70b, llama-3-405b, qwen3-8b, "
                     "mixtral-8x7b, deepseek-v3, ...")
    src.add_argument("--model-config", metavar="PATH", help="a Hugging Face config.json (or its directory)")
    p.add_argument("--gpu", default=DEFAULT_PROFILE_KEY, help="GPU profile, e.g. h100-sxm, h200, "
                   "a100-sxm-80gb, l40s (default %(default)s)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size: GPUs one model copy spans; "
                   "weights and KV heads split across them (default %(default)s)")
    p.add_argument("--context", type=int, default=8000, help="tokens per sequence (prompt + output) "
                   "for KV sizing and the decode ceiling at context (default %(default)s)")
    p.add_argument("--batch", type=int, default=1, help="concurrent sequences for the decode step, "
                   "throughput and arithmetic intensity (default %(default)s)")
    p.add_argument("--prompt-tokens", type=int, default=2048, help="prompt length for the prefill "
                   "estimate (default %(default)s)")
    p.add_argument("--prefill-mfu", type=float, default=0.5, help="fraction of peak a real prefill "
                   "reaches; 0.4-0.6 is strong (default %(default)s)")
    p.add_argument("--weight-dtype", choices=("bf16", "fp16", "fp8", "int8", "int4", "fp4"),
                   help="override the weight dtype: fewer bytes raise the decode ceiling")
    p.add_argument("--kv-dtype", choices=("bf16", "fp16", "fp8", "int8"),
                   help="override the KV-cache dtype: fp8 halves the cache")
    p.add_argument("--reserved-gb", type=float, default=4.0, help="GB per GPU kept for runtime and "
                   "activations, not KV (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print every figure in base units as JSON")
    p.add_argument("--list", action="store_true", help="list the model presets and GPU profiles")
    pools = p.add_argument_group("capacity and pools (docs/physics.md, section Headroom)")
    pools.add_argument("--rate", type=float, metavar="REQ_PER_S", help="size prefill and decode pools for this "
                       "request rate, and say whether one shared pool is the better answer")
    pools.add_argument("--prompt", type=float, metavar="TOKENS", help="mean prompt tokens per request for "
                       "--rate (default with --from-live: the live mix)")
    pools.add_argument("--output", type=float, metavar="TOKENS", help="mean output tokens per request for "
                       "--rate (default with --from-live: the live mix)")
    pools.add_argument("--prefill-capacity", type=float, metavar="TOK_PER_S", help="prefill tokens/s one "
                       "group carries (default: the model on --gpu at --prefill-mfu, or the live agent's)")
    pools.add_argument("--decode-capacity", type=float, metavar="TOK_PER_S", help="decode tokens/s one group "
                       "carries (default: the roofline at --decode-mbu and the KV wall, or the live agent's)")
    pools.add_argument("--batch-max", type=int, default=256, help="the decode batch cap for the physics "
                       "capacity, like vLLM's max_num_seqs (default %(default)s)")
    pools.add_argument("--decode-mbu", type=float, default=DEFAULT_DECODE_MBU, help="fraction of the "
                       "bandwidth peak decode reaches; 0.6-0.8 is healthy (default %(default)s)")
    pools.add_argument("--itl-slo", type=float, default=DEFAULT_ITL_SLO_SECONDS, metavar="SECONDS",
                       help="the p99 inter-token latency target: the physics decode batch is the largest whose "
                       "step meets it, and a shared pool's decodes may wait this long for one prompt's prefill "
                       "(default %(default)s)")
    pools.add_argument("--ttft-slo", type=float, default=DEFAULT_TTFT_SLO_SECONDS, metavar="SECONDS",
                       help="the p99 time-to-first-token target the prefill (or shared) pool is sized for, with "
                       "an M/M/c queue (default %(default)s)")
    pools.add_argument("--from-live", metavar="URL", help="read a running agent's /metrics (its URL, e.g. "
                       "http://127.0.0.1:9746): its headroom, saturation and capacity at the live mix")
    pools.add_argument("--window", metavar="NAME", help="the live window to read, e.g. 1m (default: the longest)")
    p.set_defaults(func=run_plan)
