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
        "weight streaming)",
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


def run_plan(args: argparse.Namespace) -> int:
    """Entry point of `rooflight plan`; prints text or JSON, returns the exit code."""
    if getattr(args, "list", False):
        print(format_catalog())
        return 0
    model = resolve_model(args.model, args.model_config, args.weight_dtype, args.kv_dtype)
    plan = build_plan(model, get_profile(args.gpu), tp=args.tp, context_tokens=args.context,
                      batch=args.batch, prompt_tokens=args.prompt_tokens, prefill_mfu=args.prefill_mfu,
                      reserved_bytes_per_gpu=args.reserved_gb * 1e9)
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
    p.set_defaults(func=run_plan)
