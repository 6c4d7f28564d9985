"""The serving calculator of docs/physics.md, for one model on one GPU type: the Plan and the pools.

Owns the Plan (every figure in base units: bytes, seconds, FLOP, FLOP/s, tokens/s) and the pool sizing
(PoolPlan). Every byte, FLOP and step time is the step model's (agent/roofline/step.py), the one the live
agent's MBU, MFU, capacity and saturation use; the queueing is agent/roofline/physics.py. This module only
decides which steps to ask about.
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
from rooflight.agent.roofline.models import ModelSpec, dense_ep_refusal
from rooflight.agent.roofline.step import (
    Decode, Layout, Prefill, Roofs, Speculation, Step, decode_seconds_per_token, decode_step_seconds,
)
from rooflight.collectors.common import MAX_BATCH, MAX_CONTEXT_TOKENS, MAX_TENSOR_PARALLEL

DEFAULT_TTFT_SLO_SECONDS = 0.5  # a chat prompt's p99 time to first token
MAX_GROUPS = 1e12  # groups' work a pool plan sizes at most: past it the figures are a typo's, not a fleet's
TAIL_MISS = 0.01  # the SLOs are p99s: at most 1% of requests past them
DEFAULT_DECODE_MBU = 0.7  # a healthy decode's share of the bandwidth peak (section MBU: 0.6-0.8)
DEFAULT_ITL_SLO_SECONDS = 0.05  # a chat stream's inter-token budget (20 tokens/s)
DEFAULT_CONTEXT_TOKENS = 8000  # the calculator's sequence, where the model reads that many (else its most)
DEFAULT_PROMPT_TOKENS = 2048  # the calculator's prompt, likewise


@dataclass(frozen=True)
class Plan:
    """One serving configuration worked through the roofline. Base units throughout."""

    model: str
    model_source: str
    gpu: str
    tp: int
    ep: int  # GPUs the routed experts are spread over (1: every copy holds all of them)
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
    kv_bytes_per_sequence_per_gpu: float  # of which one GPU holds this
    max_context_tokens: int | None  # the model's max_position_embeddings (None: not known)
    windowed_layers: int  # layers that keep only a window of recent tokens
    kv_window_tokens: int  # the largest such window (0: none)
    reserved_bytes_per_gpu: float
    kv_bytes_free_per_gpu: float  # memory - weights/tp - reserved (negative: does not fit)
    kv_bytes_free_total: float
    fits: bool
    max_concurrent_sequences: float  # at context_tokens
    batch_within_kv_wall: bool  # batch <= max_concurrent_sequences: the decode figures at batch are a real engine's
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
    link: str  # what the TP all-reduces run over (NVLink 4, NVLink 5, Infinity Fabric, PCIe)
    tp_allreduce_seconds_per_token: float  # the link's fixed latency x 2 per layer, 0 at tp=1
    tp_allreduce_seconds_at_batch: float  # latency + payload of `batch` tokens' activations, on the GPU's link
    decode_step_seconds_at_batch_with_tp: float  # decode_step_seconds_at_batch + that
    decode_tokens_per_second_at_batch_with_tp: float
    prefill_tp_allreduce_seconds: float  # the prompt's activations all-reduced, on top of prefill_seconds
    prefill_flops: float  # weights' matmuls + causal attention + the LM head once
    prefill_attention_flops: float  # of which the causal attention over the prompt
    prefill_compute_seconds_at_roof: float  # prefill FLOPs / peak
    prefill_weight_seconds: float  # reading the weights the prompt's tokens touch, once
    prefill_seconds_at_roof: float  # max(compute at the roof, weight streaming)
    prefill_seconds: float  # max(compute at prefill_mfu, weight streaming)
    prefill_crossover_tokens: float  # prompts shorter than this are memory-bound (weight streaming)
    prefill_memory_bound: bool  # prompt shorter than the crossover
    notes: tuple[str, ...]  # how the model's checkpoint was read
    draft_model: str | None = None  # speculative decoding's draft model; the decode figures are its steps
    num_speculative_tokens: float = 0.0  # k: tokens it proposes a step, verified with the sequence's own
    decode_tokens_per_step: float = 1.0  # tokens a sequence keeps a step: 1 + acceptance x k
    draft_weight_bytes_per_gpu: float = 0.0  # the draft's weights on each GPU (its KV is in kv_bytes_per_sequence*)
    draft_kv_bytes_per_token: float = 0.0  # the draft's KV a token, all its layers (beside kv_bytes_per_token)


def build_plan(model: ModelSpec, gpu: GpuProfile, *, tp: int, context_tokens: int, batch: int,
               prompt_tokens: int, prefill_mfu: float = 0.5, reserved_bytes_per_gpu: float = 4e9,
               ep: int = 1, draft: ModelSpec | None = None, speculation: Speculation = Speculation(),
               named: str | None = None) -> Plan:
    """Work one configuration through the step model (docs/physics.md, section Plan ceilings); ConfigError on
    impossible inputs (`named`: the model as the user gave it, for them)."""
    if tp < 1 or ep < 1 or context_tokens < 1 or batch < 1 or prompt_tokens < 1:
        raise ConfigError("--tp, --ep, --context, --batch and --prompt-tokens must be at least 1")
    if not 0 < prefill_mfu <= 1:
        raise ConfigError(f"--prefill-mfu must be in (0, 1], got {prefill_mfu}")
    _check_counts(model, tp, ep, (("--batch", batch, MAX_BATCH, "sequences in one decode step"),
                                  ("--context", context_tokens, MAX_CONTEXT_TOKENS, "tokens in one sequence"),
                                  ("--prompt-tokens", prompt_tokens, MAX_CONTEXT_TOKENS, "tokens in one prompt")))
    check_context(model, (("--context", context_tokens), ("--prompt-tokens", prompt_tokens)), named)
    layout = Layout(model, tp=tp, ep=ep, draft=draft)
    compute_dtype = gpu.peak_dtype_for(model.compute_dtype)
    roofs = Roofs(tp * gpu.peak_flops[compute_dtype], tp * gpu.memory_bandwidth_bytes_per_second, gpu.link)
    peak, bw = roofs.flops, roofs.bandwidth
    context = layout.layer_tokens(context_tokens)  # KV layer-tokens one sequence holds
    spec = speculation if draft is not None else Speculation()
    k, kept = spec.draft_tokens, max(spec.tokens_per_step, 1.0)

    def decode(sequences: float, held: float) -> Step:  # a decode step, its draft passes and verified tokens
        return Step(decode=Decode(sequences, held, 1.0 + k), draft_passes=k)

    weights_only = layout.cost(decode(1, 0.0))
    at_context = layout.cost(decode(1, context))
    at_batch = layout.cost(decode(batch, context))
    prompt = Prefill(prompt_tokens, ((1.0, 0.0, float(prompt_tokens)),), 1.0)
    prefill = layout.cost(Step(prefill=prompt))
    memory = _beside_draft(layout, draft, tp)
    free = gpu.memory_bytes - layout.weight_bytes_per_gpu - memory.weight_bytes_per_gpu - reserved_bytes_per_gpu
    step_b = at_batch.seconds(roofs)
    sequence_per_gpu = memory.sequence_kv_bytes_per_gpu(context_tokens)
    sequences = ph.max_concurrent_sequences(free, sequence_per_gpu)
    comm_b = layout.comm_seconds(batch * (1.0 + k), gpu.link)
    return Plan(
        model=model.name, model_source=model.source, gpu=gpu.key, tp=tp, ep=ep, context_tokens=context_tokens,
        batch=batch, prompt_tokens=prompt_tokens, prefill_mfu=prefill_mfu,
        weight_dtype=model.weight_dtype, kv_dtype=model.kv_dtype, compute_dtype=compute_dtype,
        params_total=model.params_total,
        params_active=model.params_active, n_layers=model.n_layers, peak_flops=peak, peak_bandwidth_bytes_per_second=bw,
        weight_bytes=model.weight_bytes, weight_bytes_per_gpu=layout.weight_bytes_per_gpu,
        weight_bytes_streamed_per_step=at_batch.weight_bytes, kv_bytes_per_token=model.kv_bytes_per_token,
        kv_bytes_per_sequence=layout.sequence_kv_bytes(context_tokens) + memory.draft_sequence_kv_bytes(context_tokens),
        kv_bytes_per_sequence_per_gpu=sequence_per_gpu,
        max_context_tokens=model.max_context_tokens, reserved_bytes_per_gpu=reserved_bytes_per_gpu,
        windowed_layers=model.n_layers - model.full_attention_layers,
        kv_window_tokens=max((win for win, _ in model.window_layers), default=0),
        kv_bytes_free_per_gpu=free, kv_bytes_free_total=free * tp, fits=free > 0,
        max_concurrent_sequences=sequences, batch_within_kv_wall=batch <= sequences,
        ridge_point=roofs.ridge,
        decode_step_seconds_weights_only=weights_only.seconds(roofs),
        decode_tokens_per_second_weights_only=kept / weights_only.seconds(roofs),
        decode_step_seconds_at_context=at_context.seconds(roofs),
        decode_tokens_per_second_at_context=kept / at_context.seconds(roofs),
        decode_step_seconds_at_batch=step_b,
        decode_tokens_per_second_at_batch=batch * kept / step_b,
        decode_intensity_at_batch=at_batch.intensity,
        decode_attainable_fraction_of_peak=at_batch.flops / step_b / peak,
        kv_weight_crossover_tokens=layout.context_for_kv_bytes(weights_only.weight_bytes),
        link=gpu.link.name,
        tp_allreduce_seconds_per_token=ph.tensor_parallel_allreduce_seconds(
            model.n_layers, tp, gpu.link.latency_seconds),
        tp_allreduce_seconds_at_batch=comm_b,
        decode_step_seconds_at_batch_with_tp=step_b + comm_b,
        decode_tokens_per_second_at_batch_with_tp=batch * kept / (step_b + comm_b),
        prefill_tp_allreduce_seconds=layout.comm_seconds(prompt_tokens, gpu.link),
        prefill_flops=prefill.prefill_flops,
        prefill_attention_flops=prompt_tokens * layout.attention_per_token(prompt.spans),
        prefill_compute_seconds_at_roof=prefill.prefill_flops / peak,
        prefill_weight_seconds=prefill.weight_bytes / bw,
        prefill_seconds_at_roof=prefill.seconds(roofs),
        prefill_seconds=prefill.seconds(roofs.at(compute=prefill_mfu)),
        prefill_crossover_tokens=layout.prefill_crossover_tokens(roofs),
        prefill_memory_bound=prefill.prefill_flops / peak < prefill.bytes / bw,
        notes=model.notes,
        draft_model=draft.name if draft is not None else None, num_speculative_tokens=k, decode_tokens_per_step=kept,
        draft_weight_bytes_per_gpu=memory.weight_bytes_per_gpu,
        draft_kv_bytes_per_token=draft.kv_bytes_per_token if draft is not None else 0.0,
    )


@dataclass(frozen=True)
class _DraftMemory:
    """What a draft model holds beside the model on each GPU: its weights (its own TP over the same GPUs, as
    vLLM runs it by default) and its KV cache per sequence; nothing without one."""

    layout: Layout
    draft: Layout | None

    @property
    def weight_bytes_per_gpu(self) -> float:
        return self.draft.weight_bytes_per_gpu if self.draft is not None else 0.0

    def draft_sequence_kv_bytes(self, context: float) -> float:
        return self.draft.sequence_kv_bytes(context) if self.draft is not None else 0.0

    def sequence_kv_bytes_per_gpu(self, context: float) -> float:
        """One sequence's KV on one GPU: the model's, plus the draft's for the same tokens."""
        own = self.layout.sequence_kv_bytes_per_gpu(context)
        return own + (self.draft.sequence_kv_bytes_per_gpu(context) if self.draft is not None else 0.0)


def _beside_draft(layout: Layout, draft: ModelSpec | None, tp: int) -> _DraftMemory:
    return _DraftMemory(layout, Layout(draft, tp=tp) if draft is not None else None)


def sig(x: float, digits: int = 3) -> str:
    """3 significant digits, thousands separated, no trailing zeros: 4.776 -> '4.78', 33628 -> '33,600'."""
    if x == 0 or not math.isfinite(x):
        return str(x)
    if abs(x) >= 1e15:  # past a quadrillion, digits say nothing: 1e+20, not 100,000,000,000,000,000,000
        return f"{x:.{digits}g}"
    r = round(x, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{r:,.0f}" if abs(r) >= 10 ** (digits - 1) else f"{r:,.{digits}g}".rstrip(".")


def ms(s: float) -> str:
    """Seconds as milliseconds to 3 significant digits: 0.0104 -> '10.4 ms'."""
    return f"{sig(s * 1e3)} ms"


# --- Pools: disaggregated prefill and decode, or one shared pool (docs/physics.md, section Headroom) ---

@dataclass(frozen=True)
class PoolPlan:
    """Groups (the GPUs one copy of the model spans, `gpus_per_group`: max(tp, ep), an EP group of
    `ranks_per_group` ranks of tp GPUs) for a request rate, split into prefill and decode pools or shared,
    each sized at its latency target; base units (requests/s, tokens, tokens/s, seconds, bytes, ratios)."""

    rate: float
    prompt_tokens: float
    output_tokens: float
    prefill_tokens_per_second: float  # demand: rate x prompt
    decode_tokens_per_second: float  # demand: rate x output
    prefill_capacity_per_group: float
    decode_capacity_per_group: float  # at the batch whose step meets the ITL target (physics), else as given
    capacity_source: str  # flags, physics or live
    gpus_per_group: int  # max(tp, ep): the GPUs one copy of the model spans; pools count whole groups
    prefill_groups: int  # the fewest whose p99 TTFT (M/M/c wait + one prefill) meets ttft_slo
    decode_groups: int  # the fewest whose batch slots leave at most 1% of requests waiting for one (Erlang C)
    decode_groups_at_full_load: int  # ceil(rate x output / decode capacity): 100% busy, half the time over
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
    decode_slots_per_group: float  # sequences a decode group holds at once: its batch, or capacity x ITL
    decode_step_seconds: float  # the step those slots advance at: the physics step, or the ITL target
    kv_bytes_per_request: float | None  # the cache a prefill pool ships to the decode pool per request
    requests_per_second_per_group: float  # one group doing both phases at this mix: 1 / (P / C_p + O / C_d)
    load_per_group: float  # rate / that: the groups' work the rate is (one group's saturation at it)
    share: bool
    reasons: tuple[str, ...]
    ranks_per_group: float = 1.0  # engine ranks of tp GPUs in a group: ep / tp under expert parallelism, else 1
    output_cv: float | None = None  # the output lengths' cv a physics decode capacity was sized at
    running_context_tokens: float | None = None  # the running batch's mean context it held (physics only)


def build_pool_plan(rate: float, prompt_tokens: float, output_tokens: float, prefill_capacity: float,
                    decode_capacity: float, *, itl_slo: float = DEFAULT_ITL_SLO_SECONDS,
                    ttft_slo: float = DEFAULT_TTFT_SLO_SECONDS, source: str = "flags", gpus_per_group: int = 1,
                    decode_batch: float | None = None, kv_bytes_per_request: float | None = None,
                    decode_step_seconds: float | None = None, ranks_per_group: float = 1.0,
                    output_cv: float | None = None, running_context_tokens: float | None = None) -> PoolPlan:
    """Size both pools at their targets and decide on the physics (docs/physics.md, section Pools sized at the
    SLO). Prefill: the fewest groups whose p99 TTFT, an M/M/c queueing wait plus one prompt's prefill, meets
    ttft_slo. Decode: each group holds `decode_batch` sequences stepping every `decode_step_seconds` (the
    physics' batch, or the live agent's at its first wall; without one, capacity x ITL target sequences at the
    ITL target), each request holds one slot for output x step; the
    fewest groups whose slots leave at most 1% of requests waiting for one (Erlang C over every slot of the
    pool), where ceil(demand / capacity) is busy 100% and over its slots half the time. Share one pool when one prompt's
    prefill fits in the ITL budget (a shared pool's decodes barely wait for it), or when one of the two
    pools would carry under one group's work; else split."""
    for name, value in (("--rate", rate), ("--prompt", prompt_tokens), ("--output", output_tokens),
                        ("prefill capacity", prefill_capacity), ("decode capacity", decode_capacity),
                        ("--itl-slo", itl_slo), ("--ttft-slo", ttft_slo)):
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{name} must be a number above 0, got {value!r}")
    prefill_demand, decode_demand = rate * prompt_tokens, rate * output_tokens
    ranks = max(1.0, ranks_per_group)  # an EP group's ranks each prefill their own prompts: the queue's servers
    stall = prompt_tokens * ranks / prefill_capacity  # one prompt's prefill on one rank: the queue's service time
    prefill_load, decode_load = prefill_demand / prefill_capacity, decode_demand / decode_capacity  # groups' work
    if prefill_load + decode_load > MAX_GROUPS:
        raise ConfigError(f"--rate {rate:g} at {sig(prompt_tokens)} prompt and {sig(output_tokens)} output tokens is "
                          f"{sig(prefill_load + decode_load)} groups' work, more than {MAX_GROUPS:,.0f}: check "
                          "--rate, --prompt, --output and the capacities")
    prefill_ranks = ph.servers_for_latency(rate, stall, ttft_slo, TAIL_MISS)
    prefill_groups = None if prefill_ranks is None else max(1, math.ceil(prefill_ranks / ranks - 1e-9))
    if prefill_groups is None:
        raise ConfigError(f"one prompt's prefill takes {ms(stall)}, at or past the {ms(ttft_slo)} TTFT target: "
                          "no number of groups meets it; raise --ttft-slo, --tp or the prefill capacity")
    step = decode_step_seconds if decode_step_seconds is not None and decode_step_seconds > 0 else itl_slo
    slots = decode_batch if decode_batch else decode_capacity * step
    decode_groups = decode_groups_for(rate, output_tokens * step, slots, decode_load)
    shared = shared_groups_for(rate, stall, decode_load, ttft_slo, ranks)
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
        decode_groups=decode_groups, decode_groups_at_full_load=ph.groups_needed(decode_demand, decode_capacity),
        shared_groups=shared,
        prefill_groups_at_full_load=ph.groups_needed(prefill_demand, prefill_capacity),
        shared_groups_at_full_load=ph.groups_needed(prefill_load + decode_load, 1.0),
        prefill_utilization=prefill_load / prefill_groups, decode_utilization=decode_load / decode_groups,
        shared_utilization=(prefill_load + decode_load) / shared,
        prefill_seconds_per_prompt=stall, ttft_slo=ttft_slo, itl_slo=itl_slo,
        decode_batch=decode_batch, decode_slots_per_group=slots, decode_step_seconds=step,
        kv_bytes_per_request=kv_bytes_per_request,
        requests_per_second_per_group=rate / (prefill_load + decode_load),
        load_per_group=prefill_load + decode_load, share=bool(reasons), ranks_per_group=ranks_per_group,
        output_cv=output_cv, running_context_tokens=running_context_tokens,
        reasons=tuple(reasons) or (
            f"one prompt's prefill holds a {'rank' if ranks > 1 else 'group'} {ms(stall)}, past the {ms(itl_slo)} ITL budget a shared pool's "
            "decodes would wait: split, and scale each pool on its own signal",),
    )


def decode_groups_for(rate: float, slot_seconds: float, slots_per_group: float, load: float) -> int:
    """The fewest decode groups of `slots_per_group` batch slots each whose slots leave at most TAIL_MISS of
    requests waiting for one: requests arrive as a Poisson stream at `rate` and each holds a slot for
    `slot_seconds` (its output x the step), so the pool is M/M/c over every slot (Erlang C: the chance an
    arrival finds all c x slots busy); never fewer than `load`, the groups' work at 100%."""
    offered = rate * slot_seconds
    per_group = max(slots_per_group, 1.0)
    return ph.fewest_meeting(max(1, ph.groups_needed(load, 1.0)),
                             lambda c: ph.erlang_c(math.floor(c * per_group), offered) <= TAIL_MISS)


def shared_groups_for(rate: float, prefill_seconds: float, decode_load: float, ttft_slo: float,
                      ranks: float = 1.0) -> int:
    """The fewest groups of one shared pool whose prompts' p99 TTFT meets ttft_slo: each of c groups spends
    decode_load / c of its time decoding, so a prompt's prefill stretches to S / (1 - decode_load / c) and
    the prefill queue is M/M/c at that service time, over the groups' `ranks` each (an EP group's ranks each
    prefill their own prompts; `prefill_seconds` is one rank's)."""
    def meets(groups: int) -> bool:
        free = 1.0 - decode_load / groups
        if free <= 0:
            return False
        service = prefill_seconds / free
        servers = max(1, math.floor(groups * ranks + 1e-9))
        return service < ttft_slo and ph.mmc_wait_exceeds(servers, rate, service, ttft_slo - service) <= TAIL_MISS

    return ph.fewest_meeting(max(1, math.ceil(rate * prefill_seconds / ranks + decode_load - 1e-9)), meets)


def _check_counts(model: ModelSpec, tp: int, ep: int, counts: tuple[tuple[str, float, float, str], ...]) -> None:
    """ConfigError, saying what to write, for a count past what the model and the GPUs allow: --tp past
    MAX_TENSOR_PARALLEL or not a divisor of the attention heads, --ep past one routed expert a group of --tp
    GPUs, and each (flag, value, most, what it counts) of `counts` past its most."""
    if tp > MAX_TENSOR_PARALLEL:
        raise ConfigError(f"--tp {tp}: at most {MAX_TENSOR_PARALLEL:,} GPUs one model copy spans (an NVL72 rack is 72)")
    if model.n_heads % tp:
        raise ConfigError(f"{model.n_heads} attention heads cannot be split over tp={tp} GPUs")
    if ep > 1 and not model.is_moe:
        raise ConfigError(f"--{dense_ep_refusal(model.name, ep)}")
    if model.n_experts and ep > model.n_experts * tp:
        raise ConfigError(f"--ep {ep} over --tp {tp} is {-(-ep // tp):,} expert groups, but {model.name} has "
                          f"{model.n_experts} routed experts and each group holds at least one; write at most "
                          f"--ep {model.n_experts * tp:,}")
    for flag, value, most, what in counts:
        if value > most:
            raise ConfigError(f"{flag} {value}: at most {most:,} {what}")


def check_context(model: ModelSpec, lengths: tuple[tuple[str, float], ...], name: str | None = None) -> None:
    """ConfigError naming the flag, for a (flag, tokens) longer than the model reads (its max_position_embeddings;
    no bound where the model does not say it); `name`: the model as the user gave it (default its own)."""
    most = model.max_context_tokens
    for flag, tokens in lengths:
        if most is not None and tokens > most:
            raise ConfigError(f"{flag} {tokens:,.0f}: {name or model.name} reads at most {most:,} tokens a sequence "
                              f"(max_position_embeddings in its config.json); write at most {most:,}")


def within_context(model: ModelSpec, tokens: int | None, default: int) -> int:
    """A length the user gave, as given (check_context refuses it past the model); else `default`, or the model's
    max_position_embeddings where it reads fewer: a default never refuses a model."""
    if tokens is not None:
        return tokens
    return min(default, model.max_context_tokens) if model.max_context_tokens else default


def group_gpus(tp: int, ep: int = 1) -> int:
    """GPUs one copy of the model spans, the group a pool counts in: max(tp, ep) (an EP group of ep / tp ranks of
    tp GPUs each; without expert parallelism the tp GPUs of one copy)."""
    return max(tp, ep)


def physics_capacities(model: ModelSpec, gpu: GpuProfile, *, tp: int, prompt_tokens: float, output_tokens: float,
                       batch_max: int, prefill_mfu: float, decode_mbu: float, reserved_bytes_per_gpu: float,
                       itl_slo: float | None = None, ep: int = 1, draft: ModelSpec | None = None,
                       speculation: Speculation = Speculation(),
                       output_cv: float = 0.0) -> tuple[float, float, float, float, float]:
    """(prefill tokens/s, decode tokens/s, decode batch, KV bytes per request, decode step seconds) of one group
    (group_gpus: max(tp, ep) GPUs, R = max(1, ep / tp) ranks of tp GPUs each), on the step model at prefill_mfu x the compute peak and decode_mbu x the bandwidth peak.

    Prefill: a prompt's FLOPs (its tokens, its causal attention, the LM head once) + its TP all-reduces. Decode:
    the batch N = min(batch cap, sequences the KV memory holds at the running batch's mean context,
    batch_context: P + O (1 + output_cv^2) / 2, at most the model's context) or,
    with `itl_slo`, the largest batch up to N whose step (the step model's, plus the TP all-reduces; under
    speculative decoding the whole verify step, draft passes and all, as vLLM observes ITL once a verify step)
    meets it; that batch / its step per decoded token. The same seconds the live agent's capacity uses (signals/headroom.py). The step
    model's figures are one rank's, with every rank of the EP group running (each reads its 1/R of the routed
    experts), so the group's capacities and batch are R times one rank's; the step is the rank's."""
    if not 0 < decode_mbu <= 1 or not 0 < prefill_mfu <= 1:
        raise ConfigError("--decode-mbu and --prefill-mfu must be in (0, 1]")
    if batch_max < 1:
        raise ConfigError("--batch-max must be at least 1")
    _check_counts(model, tp, ep, (("--batch-max", batch_max, MAX_BATCH, "sequences in one batch"),))
    check_context(model, (("--prompt + --output", prompt_tokens + output_tokens),))
    layout = Layout(model, tp=tp, ep=ep, draft=draft)
    spec = speculation if draft is not None else Speculation()
    roofs = Roofs(tp * gpu.peak_flops[gpu.peak_dtype_for(model.compute_dtype)],
                  tp * gpu.memory_bandwidth_bytes_per_second, gpu.link).at(prefill_mfu, decode_mbu)
    context = batch_context(model, prompt_tokens, output_tokens, output_cv)
    memory = _beside_draft(layout, draft, tp)
    free = gpu.memory_bytes - layout.weight_bytes_per_gpu - memory.weight_bytes_per_gpu - reserved_bytes_per_gpu
    kv_wall = min(float(batch_max), ph.max_concurrent_sequences(free, memory.sequence_kv_bytes_per_gpu(context)))
    if kv_wall < 1:
        if free <= 0 and layout.weight_bytes_per_gpu < gpu.memory_bytes:
            raise ConfigError(f"{model.name} on {tp} x {gpu.key}: the {sig(reserved_bytes_per_gpu / 1e9)} GB reserved "
                              f"per GPU (--reserved-gb) and {sig(layout.weight_bytes_per_gpu / 1e9)} GB of weights per "
                              f"GPU leave no memory for the KV cache of the {sig(gpu.memory_bytes / 1e9)} GB; lower "
                              "--reserved-gb or raise --tp")
        raise ConfigError(f"{model.name} on {tp} x {gpu.key}: no sequence of {sig(context)} tokens fits beside "
                          "the weights; raise --tp")
    layer_tokens = layout.layer_tokens(context)

    def step(batch: float) -> float:  # seconds a sequence waits a decoded token: the live capacity's
        return decode_seconds_per_token(layout, roofs, batch, layer_tokens, spec)

    def verify(batch: float) -> float:  # the whole step, draft passes and all: the ITL a stream sees
        return decode_step_seconds(layout, roofs, batch, layer_tokens, spec)

    batch = kv_wall if itl_slo is None else _batch_within(verify, kv_wall, itl_slo)
    if batch is None:
        raise ConfigError(f"{model.name} on {tp} x {gpu.key}: one sequence's decode step takes {ms(verify(1.0))}, "
                          f"past the {ms(itl_slo or 0.0)} ITL target; raise --itl-slo or --tp")
    prompt = Prefill(prompt_tokens, ((1.0, 0.0, float(prompt_tokens)),), 1.0)
    prompt_seconds = layout.prefill_flops(prompt) / roofs.flops + layout.comm_seconds(prompt_tokens, gpu.link)
    ranks = layout.expert_ranks
    return (ranks * prompt_tokens / prompt_seconds, ranks * batch / step(batch), ranks * batch,
            layout.sequence_kv_bytes(prompt_tokens), step(batch))


def running_context(prompt_tokens: float, output_tokens: float, output_cv: float = 0.0) -> float:
    """The mean context of the sequences in the running batch: a request decodes for its output's steps, so it is
    in the batch in proportion to its output length O_i, holding P + t tokens at its t-th; over the batch,
    E[O_i (P + O_i / 2)] / E[O_i] = P + E[O^2] / (2 E[O]) = P + O (1 + cv^2) / 2 for outputs of mean O and
    coefficient of variation cv (independent of the prompt): P + O/2 where every output is alike."""
    return prompt_tokens + output_tokens * (1.0 + output_cv * output_cv) / 2


def batch_context(model: ModelSpec, prompt_tokens: float, output_tokens: float, output_cv: float = 0.0) -> float:
    """running_context, at most the model's max_position_embeddings: a wide spread's longest outputs stop at the
    context the model reads, so no sequence in the batch holds more (--output-cv 10 on 249 + 584 tokens: 13,225,
    past an 8,192-token model)."""
    context = running_context(prompt_tokens, output_tokens, output_cv)
    return min(context, float(model.max_context_tokens)) if model.max_context_tokens else context


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
