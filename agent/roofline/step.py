"""The step model: one engine step of a model on its GPUs, as bytes read, FLOPs done and roofline time.

Every number Rooflight derives from a model and its GPUs goes through here (docs/physics.md, section The
step model): the live MBU and MFU and the work counters (signals/derive.py), the plausibility bounds
(signals/bounds.py), capacity, headroom, saturation and the cost and energy split (signals/headroom.py),
`rooflight plan`, its pools and `--rate` (roofline/plan.py), the status page's ceilings and operating points
(serve/status.py) and the demo's simulated GPU (demo/plant.py). No other module computes the bytes or the
FLOPs of a step: tests/agent/roofline/test_step_model.py reads the source and fails if one does.

A `Layout` is the model on its GPUs: tensor-parallel size, expert-parallel size, a speculative draft model,
whether the engine pages its KV pool by attention type (vLLM's hybrid manager); the KV dtype and the
quantization are the ModelSpec's own. A `Step` is what one step runs: decoding sequences (how many, the KV
layer-tokens each holds, the tokens each verifies), a prefill (tokens computed, the prompts' spans for their
attention, the prefills that end and run the LM head), draft passes, and the tokens per step of the steps it
stands for (MoE expert coverage). `Layout.cost` turns it into a `StepCost`; `StepCost.seconds` puts it on a
roofline. Every term but the weights' expert coverage is linear in tokens, so a Step of rates (tokens per
second) gives FLOP/s: that is how the live MFU asks.

Pure: numbers in, numbers out.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Sequence

from rooflight.agent.roofline import physics
from rooflight.agent.roofline.gpus import Link
from rooflight.agent.roofline.models import ModelSpec, dtype_bytes

FLOPS_PER_PARAM = physics.FLOPS_PER_PARAM_PER_TOKEN  # a multiply and an add per weight a token meets


@dataclass(frozen=True)
class Lengths:
    """A distribution of token counts (prompt lengths, tokens per step) as point masses (share, tokens),
    the shares summing to 1. A histogram's buckets give one point each (`from_histogram`)."""

    points: tuple[tuple[float, float], ...]

    @staticmethod
    def one(tokens: float) -> Lengths:
        return Lengths(((1.0, float(tokens)),))

    @staticmethod
    def from_histogram(bounds: Sequence[float], cumulative: Sequence[float], total: float | None) -> Lengths | None:
        """The buckets of a cumulative histogram of token counts (bounds ascending, the last +Inf) as one point
        each. Token counts are whole, so a bucket (lo, hi] holds lo + 1 .. hi (vLLM's first step bucket, le=1,
        is exactly 1); every bucket's point sits at one common fraction of that range, the fraction set so the
        points' mean is the histogram's sum / count (one point at that mean where the observations fill one
        bucket); the +Inf bucket is taken to reach twice its lower bound. None without observations."""
        counts, below, lower, points = [], 0.0, 0.0, []
        for bound, cum in zip(bounds, cumulative):
            n = max(cum - below, 0.0)
            below = max(below, cum)
            first = math.floor(lower) + 1.0
            upper = max(bound if math.isfinite(bound) else 2.0 * lower, first)
            if n > 0:
                counts.append((n, first, upper))
            lower = bound if math.isfinite(bound) else lower
        n_all = sum(n for n, _, _ in counts)
        if n_all <= 0:
            return None
        if len(counts) == 1 and total is not None and total > 0:  # one bucket: its observations' mean, exactly
            return Lengths.one(total / n_all)
        base = sum(n * lo for n, lo, _ in counts)
        width = sum(n * (hi - lo) for n, lo, hi in counts)
        share = 0.5 if total is None or width <= 0 else min(1.0, max(0.0, (total - base) / width))
        for n, lo, hi in counts:
            points.append((n / n_all, lo + share * (hi - lo)))
        return Lengths(tuple(points))

    def mean(self) -> float:
        return self.expect(lambda tokens: tokens)

    def expect(self, f: Callable[[float], float]) -> float:
        """E[f(tokens)] over the distribution."""
        return sum(share * f(tokens) for share, tokens in self.points)


@dataclass(frozen=True)
class Decode:
    """The sequences a step decodes."""

    sequences: float  # sequences decoding in the step (or per second, for rates)
    context: float  # KV layer-tokens each holds: what each of its tokens attends to, summed over layers
    tokens_each: float = 1.0  # tokens each runs: 1, or 1 + k draft tokens verified under speculative decoding


@dataclass(frozen=True)
class Prefill:
    """The prompt tokens a step computes."""

    tokens: float  # prompt tokens computed (prefix-cache hits are not)
    # (weight, start, end): the prompts those tokens belong to, each computing positions start..end-1 (the
    # cached prefix before start is attended to, not recomputed). Only their proportions count: the attention
    # per computed token. (): the prompts' lengths are unknown and their attention is not counted.
    spans: tuple[tuple[float, float, float], ...] = ()
    logits: float = 0.0  # prefills that end in the step: each runs the LM head once, for its last position


@dataclass(frozen=True)
class Step:
    """What one engine step runs (or a second of steps, with rates in: see the module docstring)."""

    decode: Decode | None = None
    prefill: Prefill | None = None
    draft_passes: float = 0.0  # forward passes of the draft model (k a step under speculative decoding)
    step_tokens: Lengths | None = None  # tokens per step of the steps this one stands for; None: its own tokens
    kv_layer_tokens: float | None = None  # live KV layer-tokens the step reads; None: sequences x context

    def tokens(self) -> float:
        """Tokens the step runs through the model: every decoding sequence's, every computed prompt token."""
        decode = self.decode.sequences * self.decode.tokens_each if self.decode else 0.0
        return decode + (self.prefill.tokens if self.prefill else 0.0)


@dataclass(frozen=True)
class Roofs:
    """What the GPUs of one model copy reach: FLOP/s at the model's GEMM dtype, HBM bytes/s, and the link its
    all-reduces run over; scale by efficiencies with `at`."""

    flops: float
    bandwidth: float
    link: Link | None = None

    def at(self, compute: float = 1.0, memory: float = 1.0) -> Roofs:
        """These roofs at a share of each peak (an MFU, an MBU)."""
        return Roofs(self.flops * compute, self.bandwidth * memory, self.link)

    @property
    def ridge(self) -> float:
        return physics.ridge_point(self.flops, self.bandwidth)


@dataclass(frozen=True)
class StepCost:
    """A step's bytes (weights, KV), FLOPs (prefill, decode) and how long it takes on a roofline."""

    weight_bytes: float
    kv_bytes: float
    prefill_flops: float
    decode_flops: float

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes

    @property
    def flops(self) -> float:
        return self.prefill_flops + self.decode_flops

    @property
    def intensity(self) -> float:
        """FLOPs per byte read."""
        return self.flops / self.bytes if self.bytes > 0 else 0.0

    def seconds(self, roofs: Roofs) -> float:
        """Roofline time: a step that decodes takes the longer of reading its bytes and its decode FLOPs, then
        its prefill FLOPs (on one set of SMs the two run one after the other); a prefill alone takes the
        longer of reading its bytes and its FLOPs."""
        memory = self.bytes / roofs.bandwidth
        prefill = self.prefill_flops / roofs.flops
        if self.decode_flops > 0:
            return max(memory, self.decode_flops / roofs.flops) + prefill
        return max(memory, prefill)


@dataclass(frozen=True)
class Layout:
    """A model on its GPUs: one copy spans `tp` GPUs; under expert parallelism the routed experts are spread
    over `ep` GPUs (vLLM: DP x TP), so `ep / tp` copies share one set; a draft model is read once per draft
    pass; `kv_pool_grouped`: the engine pages its KV pool by attention type (vLLM's hybrid manager)."""

    model: ModelSpec
    tp: int = 1
    ep: int = 1
    draft: ModelSpec | None = None
    kv_pool_grouped: bool = False

    # -- the weights ------------------------------------------------------------------------------------
    @functools.cached_property
    def expert_ranks(self) -> float:
        """Copies that share one set of routed experts: ep / tp, at least 1."""
        return max(1.0, self.ep / self.tp)

    def weight_bytes(self, step_tokens: Lengths, draft_passes: float = 0.0) -> float:
        """Weight bytes one step reads, over the steps' token counts: the input embedding table a row a token,
        the MoE experts a step's tokens touch (this copy's share of them under expert parallelism, reached by
        every copy's tokens), plus the draft model once per draft pass."""
        ranks = self.expert_ranks
        weights = step_tokens.expect(lambda t: self.model.decode_weight_bytes(t, ranks))
        if self.draft is not None and draft_passes > 0:
            draft = self.draft
            weights += draft_passes * step_tokens.expect(lambda t: draft.decode_weight_bytes(t))
        return weights

    @functools.cached_property
    def weight_bytes_per_gpu(self) -> float:
        """Weight bytes one GPU holds: its 1/tp of the copy, the routed experts 1/ep of them."""
        experts = self.model.routed_expert_bytes
        return (self.model.weight_bytes - experts + experts / self.expert_ranks) / self.tp

    # -- the KV cache -----------------------------------------------------------------------------------
    @functools.cached_property
    def kv_layer_token_bytes(self) -> float:
        """K+V bytes one token holds in one layer, summed over the copy's GPUs (each its head shard, or its own
        copy of an MLA latent or of a KV head replicated past the head count)."""
        m = self.model
        return m.kv_bytes_per_layer_token * self.tp * m.kv_bytes_per_token_per_gpu(self.tp) / m.kv_bytes_per_token

    @functools.cached_property
    def pool_layers(self) -> int:
        """Layers one token of the engine's KV pool holds (ModelSpec.kv_pool_layers)."""
        return self.model.kv_pool_layers(self.kv_pool_grouped)

    @functools.cached_property
    def kv_bytes_per_pool_token(self) -> float:
        return self.pool_layers * self.kv_layer_token_bytes

    def layer_tokens(self, context: float) -> float:
        """KV layer-tokens a sequence of `context` tokens holds (sliding and chunked layers keep a window)."""
        m = self.model
        return physics.kv_layer_tokens(context, m.full_attention_layers, m.window_layers)

    def pool_tokens(self, context: float) -> float:
        """KV pool tokens a sequence of `context` tokens takes: a pool token per layer group's page on a
        grouped pool, one per context token where every page holds every layer."""
        if self.kv_pool_grouped and self.pool_layers < self.model.n_layers:
            return self.layer_tokens(context) / self.pool_layers
        return context

    def pool_layer_tokens(self, occupancy: float, capacity_tokens: float) -> float:
        """KV layer-tokens the pool holds at `occupancy` of `capacity_tokens` pool tokens."""
        return occupancy * capacity_tokens * self.pool_layers

    def sequence_kv_bytes(self, context: float) -> float:
        """K+V bytes one sequence of `context` tokens holds, whole model (windows capped)."""
        return self.layer_tokens(context) * self.model.kv_bytes_per_layer_token

    def sequence_kv_bytes_per_gpu(self, context: float) -> float:
        """K+V bytes one sequence holds on one of the copy's GPUs."""
        return self.layer_tokens(context) * self.kv_layer_token_bytes / self.tp

    def kv_bytes(self, layer_tokens: float) -> float:
        """K+V bytes `layer_tokens` layer-tokens hold, summed over the copy's GPUs (what a step reads)."""
        return layer_tokens * self.kv_layer_token_bytes

    def layer_tokens_in(self, kv_bytes: float) -> float:
        """The KV layer-tokens `kv_bytes` hold, summed over the copy's GPUs (kv_bytes' inverse)."""
        return kv_bytes / self.kv_layer_token_bytes

    def token_kv_bytes(self, tokens: float) -> float:
        """K+V bytes `tokens` tokens take in every layer, summed over the copy's GPUs (a KV transfer's)."""
        return self.kv_bytes(tokens * self.model.n_layers)

    def context_of(self, layer_tokens: float) -> float:
        """The context, in tokens, of a sequence holding `layer_tokens` as if every layer kept it all."""
        return layer_tokens / self.model.n_layers

    def context_for_kv_bytes(self, target_bytes: float) -> float | None:
        """The context at which one sequence's cache reaches `target_bytes` (whole model); None when the
        windows cap it below that."""
        return self.model.context_for_sequence_kv_bytes(target_bytes)

    # -- the FLOPs --------------------------------------------------------------------------------------
    def decode_flops(self, decode: Decode) -> float:
        """2 x the parameters a token multiplies (not the input embedding table) plus its attention over the
        layer-tokens its sequence holds, for every token each sequence runs."""
        m = self.model
        per_token = FLOPS_PER_PARAM * m.matmul_params_active + m.attention_flops_per_pair * decode.context
        return decode.sequences * decode.tokens_each * per_token

    def prefill_flops(self, prefill: Prefill) -> float:
        """2 x the parameters a prompt token multiplies (without the LM head), plus the causal attention of
        its prompt per computed token; the LM head once per prefill that ends."""
        m = self.model
        per_token = FLOPS_PER_PARAM * m.prefill_matmul_params + self.attention_per_token(prefill.spans)
        return prefill.tokens * per_token + prefill.logits * FLOPS_PER_PARAM * m.lm_head_params

    def attention_per_token(self, spans: Sequence[tuple[float, float, float]]) -> float:
        """Attention FLOPs per computed prompt token of prompts computing positions start..end-1 in these
        proportions: sum of weight x attention(start, end) over sum of weight x (end - start)."""
        computed = sum(w * (end - start) for w, start, end in spans)
        if computed <= 0:
            return 0.0
        return sum(w * self.model.attention_flops(start, end) for w, start, end in spans) / computed

    # -- a step -----------------------------------------------------------------------------------------
    def cost(self, step: Step) -> StepCost:
        """The bytes one step reads and the FLOPs it does."""
        decode, prefill = step.decode, step.prefill
        tokens = step.step_tokens or Lengths.one(max(step.tokens(), 1.0))
        kv_layer_tokens = (step.kv_layer_tokens if step.kv_layer_tokens is not None
                           else decode.sequences * decode.context if decode else 0.0)
        return StepCost(
            weight_bytes=self.weight_bytes(tokens, step.draft_passes),
            kv_bytes=self.kv_bytes(kv_layer_tokens),
            prefill_flops=self.prefill_flops(prefill) if prefill else 0.0,
            decode_flops=self.decode_flops(decode) if decode else 0.0,
        )

    def comm_seconds(self, tokens: float, link: Link | None) -> float:
        """Tensor-parallel communication of a pass over `tokens` tokens: two all-reduces per layer, each the
        link's latency plus a ring's 2 (tp - 1) / tp x the activations over its bytes/s; 0 at tp 1."""
        if link is None or self.tp <= 1:
            return 0.0
        return physics.tensor_parallel_allreduce_seconds_at(
            self.model.n_layers, self.tp, tokens, self.model.hidden_size, link.latency_seconds,
            link.all_reduce_bytes_per_second(self.tp), dtype_bytes(self.model.act_dtype))

    def prefill_crossover_tokens(self, roofs: Roofs) -> float:
        """The prompt length at which a prefill's FLOPs at these roofs take as long as reading the weights its
        tokens touch: shorter prompts wait on memory. Found by bisection (attention makes the FLOPs grow
        faster than linearly, MoE coverage the bytes slower)."""
        def compute_over_memory(tokens: float) -> float:
            cost = self.cost(Step(prefill=Prefill(tokens, ((1.0, 0.0, tokens),), 1.0)))
            return cost.prefill_flops / roofs.flops - cost.bytes / roofs.bandwidth

        low, high = 1.0, 1.0
        while compute_over_memory(high) < 0 and high < 1e12:
            low, high = high, high * 2
        for _ in range(100):
            mid = math.sqrt(low * high)
            low, high = (mid, high) if compute_over_memory(mid) < 0 else (low, mid)
            if high - low < 1e-9 * high:
                break
        return high


@dataclass(frozen=True)
class Speculation:
    """Speculative decoding in a decode step: each sequence verifies 1 + `draft_tokens` (k) tokens, the draft
    model runs `draft_passes` forward passes (k where not said), and a sequence keeps `tokens_per_step`
    (1 + accepted / drafts: 1 + acceptance x k) of them. The default: no speculation."""

    draft_tokens: float = 0.0
    tokens_per_step: float = 1.0
    draft_passes: float | None = None

    @staticmethod
    def of(draft_tokens: float, acceptance: float) -> Speculation:
        """k draft tokens a step of which `acceptance` (accepted / proposed) are kept."""
        return Speculation(draft_tokens, 1.0 + acceptance * draft_tokens)


def decode_step_seconds(layout: Layout, roofs: Roofs, batch: float, context: float,
                        speculation: Speculation = Speculation()) -> float:
    """A decode step of `batch` sequences holding `context` KV layer-tokens each, at these roofs, plus its TP
    all-reduces: under speculative decoding a step verifies 1 + k tokens a sequence and runs the draft model
    k times. The gap a stream sees between its steps: vLLM observes one ITL a verify step."""
    k = speculation.draft_tokens
    step = Step(decode=Decode(batch, context, 1.0 + k), draft_passes=speculation.draft_passes or k)
    return layout.cost(step).seconds(roofs) + layout.comm_seconds(batch * (1.0 + k), roofs.link)


def decode_seconds_per_token(layout: Layout, roofs: Roofs, batch: float, context: float,
                             speculation: Speculation = Speculation()) -> float:
    """decode_step_seconds over the tokens the step yields each sequence (`tokens_per_step`: 1 without
    speculation). The seconds the live capacity (signals/headroom.py) and `rooflight plan` both price a decoded
    token at."""
    return decode_step_seconds(layout, roofs, batch, context, speculation) / max(speculation.tokens_per_step, 1.0)


def prompt_spans(prompts: Lengths | None, hit_ratio: float | None = None) -> tuple[tuple[float, float, float], ...]:
    """The spans of prompts of these lengths whose first `hit_ratio` share was found in the prefix cache: each
    computes positions hit x L..L. () when the lengths are unknown."""
    if prompts is None:
        return ()
    hit = min(max(hit_ratio or 0.0, 0.0), 1.0)
    return tuple((share, hit * length, length) for share, length in prompts.points)
