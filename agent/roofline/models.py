"""Model constants: the few numbers the physics needs, from a config.json, a preset, or an HF id.

Owns ModelSpec (layers, heads, KV heads, head dim, total and active parameters, weight and KV dtypes)
and the two byte counts everything else derives from:

- weight_bytes: every weight as stored: quantized linear weights at their format's bytes plus group
  scales, embeddings / LM head / norms at the 16-bit serving dtype (fp32 checkpoints are served in
  16 bit). What one decode step streams (whole model; with tensor parallelism each GPU 1/tp of it).
- kv_bytes_per_sequence(L) = K+V bytes per layer and token x (full layers x L + sum over
  sliding-window layers of min(L, window)); per layer and token 2 x kv_heads x head_dim x
  bytes(kv_dtype), for MLA (DeepSeek-style latent KV) kv_lora_rank + rope_head_dim.

Parameter counts from a config.json are computed from the architecture as a list of named tensors
(embeddings, attention with its biases, gated MLP or MoE experts, routers, norms), exact for Llama,
Mistral, Qwen2/3 and Gemma 2/3; each model type's config-class defaults (Gemma's tied embeddings)
apply where a field is absent. Every field is read through config_reader.ConfigReader. Presets are built through
the same parser, so they cannot drift from it. `ref-8b` and `ref-70b` are the reference shapes of
docs/physics.md (section Units and reference numbers) with their nominal 8e9 / 70e9 parameters (the
worked numbers are computed with those);
`llama-3-8b` carries the real 8,030,261,248. Bad or inconsistent input raises ConfigError (exit 2).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

from rooflight.agent.errors import ConfigError
from rooflight.agent.roofline import physics as ph
from rooflight.agent.roofline.config_reader import ConfigReader
from rooflight.agent.roofline.quantization import QuantScheme, WeightFormat, parse_scheme

FLOPS_PER_MULTIPLY_ADD = 2.0

DTYPE_BYTES: Mapping[str, float] = MappingProxyType(
    {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "fp4": 0.5})

_DTYPE_ALIASES = {
    "float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
    "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8",
    "fp8_inc": "fp8", "e4m3": "fp8", "mxfp4": "fp4", "nvfp4": "fp4",
}


@functools.lru_cache(maxsize=64)  # the derive step asks for a few dtypes' bytes on every sample
def normalize_dtype(dtype: str) -> str:
    """'bfloat16' -> 'bf16', 'fp8_e4m3' -> 'fp8', ...; ConfigError on anything unknown."""
    d = dtype.strip().lower().replace("torch.", "")
    d = _DTYPE_ALIASES.get(d, d)
    if d not in DTYPE_BYTES:
        raise ConfigError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPE_BYTES)}")
    return d


def dtype_bytes(dtype: str) -> float:
    """Bytes per element: bf16/fp16 2, fp8/int8 1, int4/fp4 0.5 (scales ignored), fp32 4."""
    return DTYPE_BYTES[normalize_dtype(dtype)]


def dense_ep_refusal(model_name: str, ep: int) -> str:
    """The words `rooflight run` and `rooflight plan` refuse ep > 1 on a dense model with (each prefixes what
    it was given: a target's name, or the flag)."""
    return (f"ep {ep}: {model_name} is dense (no routed experts), and expert parallelism splits only the experts of"
            " a MoE model; drop ep, or give the MoE model it serves (--model / --model-config)")


@dataclass(frozen=True)
class ModelSpec:
    """What the physics needs to know about one model (all GPUs of one copy together).

    Frozen: what follows from its fields is computed once per spec (functools.cached_property), where the
    derive step asked for the same bytes and FLOPs dozens of times a sample (`bench/bench_derive.py`)."""

    name: str
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    params_total: float
    params_active: float
    weight_dtype: str  # what most quantized linear weights are stored in; the model's dtype if none
    kv_dtype: str
    source: str
    mla_kv_lora_rank: int | None = None
    mla_rope_head_dim: int | None = None
    n_experts: int = 0  # routed experts per MoE layer (0: dense)
    n_experts_active: int = 0  # routed experts each token uses
    expert_params: float = 0.0  # all routed-expert weights, all layers (inside params_total)
    act_dtype: str = "bf16"  # the 16-bit dtype of activations and of every unquantized tensor
    compute_dtype: str = "bf16"  # the GEMMs' input dtype: whose tensor-core peak bounds MFU
    linear_params: float = 0.0  # non-expert linear weights a quantization applies to (not the LM head)
    shared_weight_bytes: float | None = None  # every weight but the routed experts, as stored
    expert_weight_bytes: float | None = None  # the routed experts, as stored
    window_layers: tuple[tuple[int, int], ...] = ()  # (window tokens, layers) of local-attention layers
    notes: tuple[str, ...] = ()  # how the checkpoint was read, for the plan and the logs
    # The input embedding table when it is not also the LM head (untied): a lookup reads one row per
    # token and multiplies nothing. 0 for tied embeddings and for the nominal reference shapes, whose
    # worked numbers count every weight as streamed and multiplied (docs/physics.md, Weight bytes).
    embedding_params: float = 0.0
    # The LM head's matmul (the tied table where embeddings are tied): engines run it only for the
    # positions that need logits, the last of each prefill and every decode token. 0 for the nominal shapes.
    lm_head_params: float = 0.0
    mla_qk_head_dim: int | None = None  # MLA: query/key dims per head (nope + rope); None: head_dim
    mla_v_head_dim: int | None = None  # MLA: value dims per head; None: head_dim
    # The longest sequence the model reads (config.json max_position_embeddings); None where not known (the
    # nominal reference shapes).
    max_context_tokens: int | None = None
    vocab_size: int | None = None  # the tokenizer's (config.json vocab_size): a draft model's must be the model's

    @functools.cached_property
    def is_mla(self) -> bool:
        return self.mla_kv_lora_rank is not None

    @functools.cached_property
    def is_moe(self) -> bool:
        return self.params_active < self.params_total

    @functools.cached_property
    def weight_bytes(self) -> float:
        """Bytes of all weights as stored, whole model: quantized linear weights at their format's
        bytes plus group scales, everything else (embeddings, LM head, norms) at the 16-bit dtype."""
        if self.shared_weight_bytes is None or self.expert_weight_bytes is None:
            return self.params_total * dtype_bytes(self.weight_dtype)
        return self.shared_weight_bytes + self.expert_weight_bytes

    def weight_bytes_streamed(self, batch: float) -> float:
        """Weight bytes one decode step of `batch` sequences reads. Dense: all of them. MoE: the
        shared weights plus the routed experts the batch touches, expected share 1 - (1 - k/E)^B
        under uniform routing (batch 1 reads only the active experts; large batches nearly all)."""
        if not self.n_experts:
            return self.weight_bytes
        experts = self.routed_expert_bytes
        return self.weight_bytes - experts + experts * self._touched(batch)

    @functools.cached_property
    def matmul_params_active(self) -> float:
        """Active parameters a token multiplies with: P_active without the untied input embedding
        table (a lookup, not a matmul). The live MFU's 2 x P (docs/physics.md, Live ratios)."""
        return self.params_active - self.embedding_params

    @functools.cached_property
    def prefill_matmul_params(self) -> float:
        """Parameters a prompt token that needs no logits multiplies with: matmul_params_active without the
        LM head, which runs once per prefill (its last position), not per prompt token."""
        return self.matmul_params_active - self.lm_head_params

    def decode_weight_bytes(self, tokens_per_step: float, expert_ranks: float = 1.0) -> float:
        """Weight bytes one engine step that runs `tokens_per_step` tokens reads on one model copy: the
        untied input embedding table only one row per token; MoE: the experts the step's tokens touch.
        Under expert parallelism (`expert_ranks` copies share one set of experts, each holding 1/that),
        a copy holds experts / expert_ranks and the tokens of every copy reach them:
        touched(tokens x expert_ranks) of its share."""
        tokens = max(tokens_per_step, 0.0)
        rows = tokens * self.hidden_size * dtype_bytes(self.act_dtype)
        table = self.embedding_params * dtype_bytes(self.act_dtype)
        dense = self.weight_bytes - table + min(rows, table)
        if not self.n_experts:
            return dense
        experts = self.routed_expert_bytes
        ranks = max(expert_ranks, 1.0)
        return dense - experts + experts / ranks * self._touched(tokens * ranks)

    @functools.cached_property
    def routed_expert_bytes(self) -> float:
        """The routed experts' bytes as stored, all layers (0 for a dense model)."""
        if not self.n_experts:
            return 0.0
        return (self.expert_weight_bytes if self.expert_weight_bytes is not None
                else self.expert_params * dtype_bytes(self.weight_dtype))

    def _touched(self, tokens: float) -> float:
        """Expected share of an MoE layer's experts at least one of `tokens` tokens routes to (uniform)."""
        return 1.0 - (1.0 - self.n_experts_active / self.n_experts) ** max(tokens, 0.0)

    def attention_flops(self, start: float, end: float) -> float:
        """FLOPs of the attention scores and weighted values (QK^T and AV, 2 FLOPs a multiply-add)
        for the tokens at positions start..end-1 of one sequence, each attending to every earlier
        token and itself (a window layer: to at most its window). Not in 2 x P: no weight does it."""
        layers = [(math.inf, self.full_attention_layers), *self.window_layers]
        attended = sum(n * (ph.attended_tokens(end, w) - ph.attended_tokens(start, w)) for w, n in layers)
        return self.attention_flops_per_pair * attended

    @functools.cached_property
    def attention_flops_per_pair(self) -> float:
        """FLOPs of one token attending to one cached token in one layer: every query head's score
        (q.k) and weighted value, 2 x heads x (qk dims + v dims); MLA with its unabsorbed head dims."""
        qk = self.mla_qk_head_dim or self.head_dim
        v = self.mla_v_head_dim or self.head_dim
        return FLOPS_PER_MULTIPLY_ADD * self.n_heads * (qk + v)

    def kv_pool_layers(self, grouped: bool) -> int:
        """Layers whose K+V one token of the engine's KV pool holds. Ungrouped (one page layout for
        every layer): all of them. Grouped, as vLLM's hybrid KV-cache manager allocates a model with
        more than one attention type (full + sliding window, chunked): layers are split into groups
        of one type of `group` layers each, and a page holds one group's layers; group is the fewest
        layers of any type, or the most when the counts are within 1.25x (docs/physics.md, Live ratios)."""
        kinds = [n for n in (self.full_attention_layers, *(n for _, n in self.window_layers)) if n > 0]
        if not grouped or len(kinds) < 2:
            return self.n_layers
        fewest, most = min(kinds), max(kinds)
        return most if most < fewest * 1.25 else fewest

    @functools.cached_property
    def kv_bytes_per_layer_token(self) -> float:
        """K+V bytes one token holds in one layer (MLA: the shared latent plus the rope key)."""
        b = dtype_bytes(self.kv_dtype)
        if self.mla_kv_lora_rank is not None:
            return (self.mla_kv_lora_rank + (self.mla_rope_head_dim or 0)) * b
        return 2 * self.n_kv_heads * self.head_dim * b

    @functools.cached_property
    def kv_bytes_per_token(self) -> float:
        """K+V bytes one token holds, all layers: what each new token adds while every layer still
        keeps it (a sliding-window layer drops it once it is `window` tokens old)."""
        return self.n_layers * self.kv_bytes_per_layer_token

    @functools.cached_property
    def full_attention_layers(self) -> int:
        """Layers that keep every token of the context (the rest keep a window)."""
        return self.n_layers - sum(n for _, n in self.window_layers)

    def kv_bytes_per_sequence(self, context_tokens: float) -> float:
        """K+V bytes one sequence of `context_tokens` holds, whole model: full-attention layers keep
        every token, a sliding-window layer at most its window."""
        layer_tokens = ph.kv_layer_tokens(context_tokens, self.full_attention_layers, self.window_layers)
        return self.kv_bytes_per_layer_token * layer_tokens

    def _gpu_share(self, tp: int) -> float:
        """Share of the KV cache one of `tp` GPUs holds: KV heads shard across TP ranks (replicated
        when there are fewer KV heads than ranks); an MLA latent is not split by head, so every rank
        holds all of it (as vLLM does)."""
        if tp < 1:
            raise ConfigError(f"tensor-parallel size must be >= 1, got {tp}")
        if self.is_mla:
            return 1.0
        return max(1.0, self.n_kv_heads / tp) / self.n_kv_heads

    def kv_bytes_per_token_per_gpu(self, tp: int) -> float:
        """KV bytes per token (all layers) on one of `tp` GPUs."""
        return self.kv_bytes_per_token * self._gpu_share(tp)

    def kv_bytes_per_sequence_per_gpu(self, context_tokens: float, tp: int) -> float:
        """KV bytes one sequence of `context_tokens` holds on one of `tp` GPUs."""
        return self.kv_bytes_per_sequence(context_tokens) * self._gpu_share(tp)

    def context_for_sequence_kv_bytes(self, target_bytes: float) -> float | None:
        """The context length at which one sequence's cache reaches `target_bytes` (whole model), or
        None when sliding windows cap it below that for every length."""
        per_layer, start, have = self.kv_bytes_per_layer_token, 0.0, 0.0
        for edge in [*sorted({float(w) for w, _ in self.window_layers}), math.inf]:
            keeping = self.full_attention_layers + sum(n for w, n in self.window_layers if w > start)
            slope = per_layer * keeping
            if slope > 0 and have + slope * (edge - start) >= target_bytes:
                return start + (target_bytes - have) / slope
            if math.isinf(edge):
                return None
            have, start = have + slope * (edge - start), edge
        return None

    def stored_as(self, fmt: WeightFormat) -> ModelSpec:
        """The model with every linear weight (routed experts included, the LM head not) in `fmt`;
        a 16- or 32-bit float is the whole model's dtype. Embeddings, LM head, norms stay 16-bit."""
        if fmt.dtype in ("bf16", "fp16", "fp32"):
            b = dtype_bytes(fmt.dtype)
            return dataclasses.replace(
                self, weight_dtype=fmt.dtype, act_dtype=fmt.dtype, compute_dtype=fmt.dtype,
                shared_weight_bytes=(self.params_total - self.expert_params) * b,
                expert_weight_bytes=self.expert_params * b)
        b, a = dtype_bytes(fmt.dtype) + fmt.scale_bytes_per_weight, dtype_bytes(self.act_dtype)
        rest = self.params_total - self.linear_params - self.expert_params
        return dataclasses.replace(
            self, weight_dtype=fmt.dtype, compute_dtype=fmt.gemm_dtype or self.act_dtype,
            shared_weight_bytes=self.linear_params * b + rest * a, expert_weight_bytes=self.expert_params * b)

    def with_dtypes(self, weight_dtype: str | None, kv_dtype: str | None) -> ModelSpec:
        """A copy with other weight / KV dtypes (None or 'auto' keeps the current one), as
        `--weight-dtype` / `--kv-dtype` ask. Weight-only int8/int4/fp4 keep the 16-bit GEMM peak;
        fp8 weights run fp8 GEMMs. No group scales: an override does not say the group size."""
        spec = self
        if weight_dtype not in (None, "auto"):
            w = normalize_dtype(weight_dtype)
            if w != self.weight_dtype:
                spec = spec.stored_as(WeightFormat(w, 0.0, "fp8" if w == "fp8" else None))
        if kv_dtype not in (None, "auto"):
            spec = dataclasses.replace(spec, kv_dtype=normalize_dtype(kv_dtype))
        return spec


MAX_LAYERS = 10_000
MAX_WIDTH = 10_000_000  # hidden, intermediate and head sizes
MAX_VOCAB = 100_000_000
MAX_WINDOW = 2**40

_INT, _BOOL, _STR, _INTS, _STRS, _OBJECT = "int", "bool", "str", "ints", "strs", "object"


# Every config.json field the model constants read, with its type and range (aliases share them).
# All present fields are checked up front, used or not, so a bad value never hides in a branch.
_FIELDS: Mapping[str, tuple[str, int, int]] = MappingProxyType({
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers"), (_INT, 1, MAX_LAYERS)),
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "num_attention_heads", "n_head",
                     "num_key_value_heads", "num_kv_heads", "head_dim", "intermediate_size",
                     "moe_intermediate_size", "num_experts_per_tok", "num_experts_per_token",
                     "kv_lora_rank", "v_head_dim"), (_INT, 1, MAX_WIDTH)),
    **dict.fromkeys(("num_local_experts", "num_experts", "n_routed_experts", "n_shared_experts",
                     "shared_expert_intermediate_size", "q_lora_rank", "qk_rope_head_dim",
                     "qk_nope_head_dim"), (_INT, 0, MAX_WIDTH)),
    **dict.fromkeys(("first_k_dense_replace", "decoder_sparse_step", "moe_layer_freq",
                     "max_window_layers"), (_INT, 0, MAX_LAYERS)),
    **dict.fromkeys(("interleave_moe_layer_step", "no_rope_layer_interval"), (_INT, 1, MAX_LAYERS)),
    "intermediate_size_mlp": (_INT, 1, MAX_WIDTH),
    "moe_layers": (_INTS, 0, MAX_LAYERS),
    "no_rope_layers": (_INTS, 0, 1),
    "sliding_window_pattern": (_INT, 1, MAX_LAYERS),
    **dict.fromkeys(("sliding_window", "attention_chunk_size", "max_position_embeddings"), (_INT, 1, MAX_WINDOW)),
    "vocab_size": (_INT, 1, MAX_VOCAB),
    "mlp_only_layers": (_INTS, 0, MAX_LAYERS),
    **dict.fromkeys(("use_sliding_window", "multi_query", "tie_word_embeddings", "attention_bias"),
                    (_BOOL, 0, 0)),
    **dict.fromkeys(("torch_dtype", "dtype", "model_type", "_name_or_path"), (_STR, 0, 0)),
    "layer_types": (_STRS, 0, 0),
    **dict.fromkeys(("quantization_config", "text_config"), (_OBJECT, 0, 0)),
})


def _num(r: ConfigReader, *keys: str, default: int | None = None) -> int:
    """The first present of `keys`, in the range _FIELDS gives it."""
    _, lo, hi = _FIELDS[keys[0]]
    return r.integer(*keys, default=default, lo=lo, hi=hi)


def _opt(r: ConfigReader, key: str) -> int | None:
    _, lo, hi = _FIELDS[key]
    return r.optional_integer(key, lo=lo, hi=hi)


def _ints(r: ConfigReader, key: str) -> tuple[int, ...]:
    _, lo, hi = _FIELDS[key]
    return r.int_list(key, lo=lo, hi=hi)


def validate_fields(r: ConfigReader) -> None:
    """Check every known field that is present (ConfigError naming the first bad one)."""
    for key, (kind, lo, hi) in _FIELDS.items():
        if not r.has(key):
            continue
        if kind == _INT:
            r.integer(key, lo=lo, hi=hi)
        elif kind == _INTS:
            r.int_list(key, lo=lo, hi=hi)
        elif kind == _BOOL:
            r.boolean(key, False)
        elif kind == _STR:
            r.string(key)
        elif kind == _STRS:
            r.str_list(key)
        else:
            r.mapping(key)

# What each model type's Hugging Face config class assumes when a field is absent (the config.json
# of Gemma-2-9B, for one, has no tie_word_embeddings: Gemma2Config's default, true, applies).
_TYPE_DEFAULTS: Mapping[str, Mapping[str, Any]] = MappingProxyType({
    "gemma": {"tie_word_embeddings": True},
    "gemma2": {"tie_word_embeddings": True, "sliding_window_pattern": 2},
    "gemma3_text": {"tie_word_embeddings": True, "sliding_window_pattern": 6, "sliding_window": 4096,
                    "vocab_size": 262_208, "num_attention_heads": 8, "num_key_value_heads": 4,
                    "head_dim": 256},
    # Llama4TextConfig: a NoPE (global) layer every 4th, the others chunked attention of 8,192 tokens
    "llama4_text": {"no_rope_layer_interval": 4, "attention_chunk_size": 8192, "interleave_moe_layer_step": 1},
    "cohere": {"tie_word_embeddings": True},
    "cohere2": {"tie_word_embeddings": True, "sliding_window_pattern": 4},
})
_TYPE_DEFAULTS_ALIAS = {"gemma3": "gemma3_text", "llama4": "llama4_text"}
_NORMS_PER_LAYER = {"gemma2": 4, "gemma3_text": 4, "gemma3": 4}  # pre/post attention and MLP norms
_QK_NORM = frozenset({"qwen3", "qwen3_moe", "gemma3", "gemma3_text"})  # per-head q/k RMSNorm
_QKV_BIAS = frozenset({"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl"})
_FULL = frozenset({"full_attention", "attention", "global"})
_SLIDING = frozenset({"sliding_attention", "sliding", "local"})
_CARRIED_FROM_WRAPPER = ("torch_dtype", "dtype", "quantization_config", "_name_or_path")


@dataclass(frozen=True)
class _Tensor:
    """One weight tensor (an MoE layer's routed experts together), by its Hugging Face module name."""

    name: str
    params: int
    kind: str  # linear, expert, embedding, lm_head, other (norms, biases, routers)
    active: int  # parameters one token computes with


def _unwrap(cfg: Any, where: str) -> ConfigReader:
    """The language model's config: a multimodal wrapper's `text_config` (with the wrapper's dtype
    and quantization), merged over its model type's defaults."""
    r = ConfigReader(cfg, where)
    text = r.mapping("text_config")
    if text is not None and not r.has("num_hidden_layers"):
        inner = dict(text.cfg)
        for key in _CARRIED_FROM_WRAPPER:
            if key not in inner and r.has(key):
                inner[key] = r.cfg[key]
        r = ConfigReader(inner, where)
    model_type = (r.string("model_type") or "").lower()
    defaults = _TYPE_DEFAULTS.get(_TYPE_DEFAULTS_ALIAS.get(model_type, model_type), {})
    return ConfigReader({**defaults, **r.cfg}, where) if defaults else r


def _served_dtype(r: ConfigReader) -> tuple[str, str | None, tuple[str, ...]]:
    """(16-bit dtype the engine runs in, low-bit dtype torch_dtype itself names or None, notes).
    vLLM serves an fp32 checkpoint in 16 bit: 2-byte weights and KV and the 16-bit peak."""
    raw = r.string("torch_dtype") or r.string("dtype") or "bfloat16"
    try:
        d = normalize_dtype(raw)
    except ConfigError as e:
        raise ConfigError(f"{r.where}: torch_dtype: {e}") from None
    if d == "fp32":
        return "bf16", None, ("fp32 checkpoint: vLLM serves it in 16 bit (bf16 weights and KV, the "
                              "16-bit peak)",)
    if d in ("bf16", "fp16"):
        return d, None, ()
    return "bf16", d, ()


def _windows(r: ConfigReader, layers: int) -> tuple[tuple[int, int], ...]:
    """(window, layer count) of the layers that keep only recent tokens: from `layer_types`
    (sliding_attention / chunked_attention), else `sliding_window` on every layer, every layer but
    each `sliding_window_pattern`-th (Gemma 2/3, Cohere 2), or the layers from `max_window_layers`
    on (Qwen2); none when `use_sliding_window` is false."""
    types = r.str_list("layer_types") or _llama4_layer_types(r, layers)
    if types:
        if len(types) != layers:
            raise ConfigError(f"{r.where}: layer_types has {len(types)} entries for {layers} layers")
        counts: dict[int, int] = {}
        for i, kind in enumerate(types):
            if kind in _FULL:
                continue
            if kind in _SLIDING:
                window = _num(r, "sliding_window")
            elif kind == "chunked_attention":
                window = _num(r, "attention_chunk_size")
            else:
                raise ConfigError(f"{r.where}: layer_types[{i}] is {kind[:40]!r}; Rooflight sizes "
                                  "full_attention, sliding_attention and chunked_attention layers")
            counts[window] = counts.get(window, 0) + 1
        return tuple(sorted(counts.items()))
    window = _opt(r, "sliding_window")
    if window is None or not r.boolean("use_sliding_window", True):
        return ()
    if r.has("max_window_layers"):
        n = layers - min(layers, _num(r, "max_window_layers"))
    elif r.has("sliding_window_pattern"):
        pattern = _num(r, "sliding_window_pattern")
        n = sum(1 for i in range(layers) if (i + 1) % pattern)
    else:
        n = layers
    return ((window, n),) if n else ()


def _llama4_layer_types(r: ConfigReader, layers: int) -> list[str]:
    """Llama 4's attention types, which its configs give as `no_rope_layers` (1: a RoPE layer, attending within
    chunks of `attention_chunk_size`; 0: a NoPE layer, attending to everything), or, without the list, a NoPE
    layer every `no_rope_layer_interval`-th (Llama4TextConfig's defaults); [] for other models."""
    if _model_type(r) not in ("llama4_text", "llama4"):
        return []
    rope = _ints(r, "no_rope_layers")
    if not rope:
        interval = _num(r, "no_rope_layer_interval")
        rope = tuple(int((i + 1) % interval != 0) for i in range(layers))
    if len(rope) != layers:
        raise ConfigError(f"{r.where}: no_rope_layers has {len(rope)} entries for {layers} layers")
    return ["chunked_attention" if use_rope else "full_attention" for use_rope in rope]


def _model_type(r: ConfigReader) -> str:
    return (r.string("model_type") or "").lower()


def _attention(r: ConfigReader, prefix: str, h: int, n_heads: int, n_kv: int, hd: int,
               model_type: str) -> list[_Tensor]:
    """One layer's attention weights: q/k/v/o projections (+ biases), or MLA's low-rank ones."""
    if not r.has("kv_lora_rank"):
        out = [_Tensor(f"{prefix}.q_proj", h * n_heads * hd, "linear", 0),
               _Tensor(f"{prefix}.k_proj", h * n_kv * hd, "linear", 0),
               _Tensor(f"{prefix}.v_proj", h * n_kv * hd, "linear", 0),
               _Tensor(f"{prefix}.o_proj", n_heads * hd * h, "linear", 0)]
        if r.boolean("attention_bias", False):
            out.append(_Tensor(f"{prefix}.bias", (n_heads + 2 * n_kv) * hd + h, "other", 0))
        elif model_type in _QKV_BIAS:
            out.append(_Tensor(f"{prefix}.bias", (n_heads + 2 * n_kv) * hd, "other", 0))
        return out
    rank = _num(r, "kv_lora_rank")
    rope = _num(r, "qk_rope_head_dim")
    nope = _num(r, "qk_nope_head_dim")
    v_hd = _num(r, "v_head_dim", default=nope)
    q_rank = _opt(r, "q_lora_rank")
    qk = n_heads * (nope + rope)
    if q_rank:
        out = [_Tensor(f"{prefix}.q_a_proj", h * q_rank, "linear", 0),
               _Tensor(f"{prefix}.q_a_layernorm", q_rank, "other", 0),
               _Tensor(f"{prefix}.q_b_proj", q_rank * qk, "linear", 0)]
    else:
        out = [_Tensor(f"{prefix}.q_proj", h * qk, "linear", 0)]
    return out + [_Tensor(f"{prefix}.kv_a_proj_with_mqa", h * (rank + rope), "linear", 0),
                  _Tensor(f"{prefix}.kv_a_layernorm", rank, "other", 0),
                  _Tensor(f"{prefix}.kv_b_proj", rank * n_heads * (nope + v_hd), "linear", 0),
                  _Tensor(f"{prefix}.o_proj", n_heads * v_hd * h, "linear", 0)]


@dataclass(frozen=True)
class _Moe:
    experts: int
    top_k: int
    expert_inter: int
    shared_inter: int  # all shared experts together
    shared_gate: bool  # Qwen2-MoE's sigmoid gate on its shared expert
    layers: frozenset[int]  # which layers are MoE


def _moe(r: ConfigReader, h: int, layers: int) -> _Moe | None:
    n_exp = _num(r, "num_local_experts", "num_experts", "n_routed_experts", default=0)
    if n_exp == 0:
        return None
    top_k = _num(r, "num_experts_per_tok", "num_experts_per_token")
    if top_k > n_exp:
        raise ConfigError(f"{r.where}: num_experts_per_tok={top_k} must be in 1..{n_exp}")
    e_inter = _num(r, "moe_intermediate_size", "intermediate_size")
    shared_single = _num(r, "shared_expert_intermediate_size", default=0)
    shared = _num(r, "n_shared_experts", default=0) * e_inter + shared_single
    if _model_type(r) in ("llama4_text", "llama4"):  # Llama4TextMoe: one shared expert as wide as a routed one
        shared = e_inter
    first_dense = _num(r, "first_k_dense_replace", default=0)
    step = (_num(r, "decoder_sparse_step", default=0) or _num(r, "interleave_moe_layer_step", default=0)
            or 1)  # Qwen2/3-MoE, Llama 4: every step-th layer, counting from 1
    freq = _num(r, "moe_layer_freq", default=1) or 1
    mlp_only = set(_ints(r, "mlp_only_layers"))
    listed = set(_ints(r, "moe_layers")) if r.has("moe_layers") else None  # Llama 4 names them
    moe_layers = frozenset(i for i in range(first_dense, layers)
                           if (i in listed if listed is not None else
                               i not in mlp_only and (i + 1) % step == 0 and i % freq == 0))
    return _Moe(n_exp, top_k, e_inter, shared, shared_single > 0, moe_layers)


def _mlp(r: ConfigReader, i: int, h: int, moe: _Moe | None, model_type: str) -> list[_Tensor]:
    """One layer's MLP: a gated dense MLP, or a router, routed experts (one tensor per projection,
    all experts together) and shared experts."""
    llama4 = model_type in ("llama4_text", "llama4")
    mlp = "feed_forward" if llama4 else "mlp"
    if moe is None or i not in moe.layers:
        inter = _num(r, "intermediate_size_mlp", "intermediate_size") if llama4 else _num(r, "intermediate_size")
        return [_Tensor(f"model.layers.{i}.{mlp}.{p}_proj", h * inter, "linear", 0)
                for p in ("gate", "up", "down")]
    mixtral = model_type == "mixtral"
    block = f"model.layers.{i}.{'block_sparse_moe' if mixtral else mlp}"
    per_expert = h * moe.expert_inter
    out = [_Tensor(f"{block}.gate", h * moe.experts, "other", 0)]
    out += [_Tensor(f"{block}.experts.0.{p}", moe.experts * per_expert, "expert", moe.top_k * per_expert)
            for p in (("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj"))]
    if moe.shared_inter:
        shared = "shared_expert" if moe.shared_gate or llama4 else "shared_experts"
        out += [_Tensor(f"{block}.{shared}.{p}_proj", h * moe.shared_inter, "linear", 0)
                for p in ("gate", "up", "down")]
    if moe.shared_gate:
        out.append(_Tensor(f"{block}.shared_expert_gate", h, "other", 0))
    return out


def _inventory(r: ConfigReader, layers: int, h: int, n_heads: int, n_kv: int, hd: int,
               moe: _Moe | None) -> list[_Tensor]:
    """Every weight tensor of the language model, named as in the checkpoint."""
    model_type = (r.string("model_type") or "").lower()
    vocab = _num(r, "vocab_size")
    norms = _NORMS_PER_LAYER.get(model_type, 2) * h + (2 * hd if model_type in _QK_NORM else 0)
    out = [_Tensor("model.embed_tokens", vocab * h, "embedding", 0)]
    for i in range(layers):
        out += _attention(r, f"model.layers.{i}.self_attn", h, n_heads, n_kv, hd, model_type)
        out += _mlp(r, i, h, moe, model_type)
        out.append(_Tensor(f"model.layers.{i}.norms", norms, "other", 0))
    out.append(_Tensor("model.norm", h, "other", 0))
    if not r.boolean("tie_word_embeddings", False):
        out.append(_Tensor("lm_head", vocab * h, "lm_head", 0))
    return out


def _stored(tensors: list[_Tensor], scheme: QuantScheme | None, act: str) -> tuple[
        float, float, str | None, str | None]:
    """(bytes of non-expert weights, bytes of routed experts, dominant quantized dtype, its GEMM
    dtype): quantized linear weights at their format's bytes plus scales, the rest at `act`."""
    a = dtype_bytes(act)
    shared = experts = 0.0
    by_format: dict[WeightFormat, float] = {}
    for t in tensors:
        fmt = scheme.format_for(t.name) if scheme and t.kind in ("linear", "expert") else None
        b = a if fmt is None else dtype_bytes(fmt.dtype) + fmt.scale_bytes_per_weight
        if fmt is not None:
            by_format[fmt] = by_format.get(fmt, 0.0) + t.params
        if t.kind == "expert":
            experts += t.params * b
        else:
            shared += t.params * b
    if not by_format:
        return shared, experts, None, None
    top = max(by_format, key=lambda f: by_format[f])
    return shared, experts, top.dtype, top.gemm_dtype


def from_hf_config(cfg: Mapping[str, Any], *, source: str, name: str | None = None,
                   weight_dtype: str | None = None, kv_dtype: str | None = None) -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json mapping (Llama/Qwen/Mistral/Mixtral/Gemma/DeepSeek).

    Handles GQA/MQA (num_key_value_heads, multi_query), MoE (routed, shared and dense layers), MLA
    (kv_lora_rank), sliding-window and local/global layers, model-type defaults (Gemma's tied
    embeddings), multimodal wrappers (text_config) and quantization_config (quantization.py). The
    KV dtype is the served 16-bit dtype (vLLM's 'auto') unless the checkpoint or `kv_dtype` says
    otherwise; `weight_dtype` replaces the checkpoint's quantization. Every field is read through
    ConfigReader: a bad value is a ConfigError naming it.
    """
    where = source
    r = _unwrap(cfg, where)
    validate_fields(r)
    layers = _num(r, "num_hidden_layers", "n_layer", "num_layers")
    h = _num(r, "hidden_size", "n_embd", "d_model")
    n_heads = _num(r, "num_attention_heads", "n_head")
    default_kv = 1 if r.boolean("multi_query", False) else n_heads
    n_kv = _num(r, "num_key_value_heads", "num_kv_heads", default=default_kv)
    if n_heads % n_kv:
        raise ConfigError(f"{where}: {n_heads} attention heads are not a multiple of {n_kv} KV heads")
    if not r.has("head_dim") and h % n_heads:
        raise ConfigError(f"{where}: hidden_size {h} is not divisible by {n_heads} heads; set head_dim")
    hd = _num(r, "head_dim", default=h // n_heads)
    moe = _moe(r, h, layers)
    tensors = _inventory(r, layers, h, n_heads, n_kv, hd, moe)
    act, low_bit, notes = _served_dtype(r)
    override = weight_dtype not in (None, "auto")
    q = None if override else r.mapping("quantization_config")
    scheme = parse_scheme(q) if q is not None else None
    shared, experts, w, gemm = _stored(tensors, scheme, act)
    spec = ModelSpec(
        name=name or r.string("_name_or_path") or r.string("model_type") or "model",
        n_layers=layers, hidden_size=h, n_heads=n_heads, n_kv_heads=n_kv, head_dim=hd,
        params_total=float(sum(t.params for t in tensors)),
        params_active=float(sum(t.active if t.kind == "expert" else t.params for t in tensors)),
        weight_dtype=w or act, kv_dtype=(scheme.kv_dtype if scheme else None) or act, source=source,
        mla_kv_lora_rank=_num(r, "kv_lora_rank") if r.has("kv_lora_rank") else None,
        mla_rope_head_dim=_num(r, "qk_rope_head_dim") if r.has("kv_lora_rank") else None,
        n_experts=moe.experts if moe else 0, n_experts_active=moe.top_k if moe else 0,
        expert_params=float(sum(t.params for t in tensors if t.kind == "expert")),
        act_dtype=act, compute_dtype=gemm or act,
        linear_params=float(sum(t.params for t in tensors if t.kind == "linear")),
        shared_weight_bytes=shared, expert_weight_bytes=experts,
        window_layers=_windows(r, layers), notes=notes,
        embedding_params=float(sum(t.params for t in tensors if t.kind == "embedding"))
        if any(t.kind == "lm_head" for t in tensors) else 0.0,
        lm_head_params=float(sum(t.params for t in tensors if t.kind == "lm_head")
                             or sum(t.params for t in tensors if t.kind == "embedding")),
        mla_qk_head_dim=_num(r, "qk_nope_head_dim") + _num(r, "qk_rope_head_dim") if r.has("kv_lora_rank") else None,
        mla_v_head_dim=_num(r, "v_head_dim", default=_num(r, "qk_nope_head_dim")) if r.has("kv_lora_rank") else None,
        max_context_tokens=_num(r, "max_position_embeddings") if r.has("max_position_embeddings") else None,
        vocab_size=_num(r, "vocab_size"))
    if low_bit and not override and scheme is None:  # torch_dtype itself names a low-bit dtype
        spec = spec.with_dtypes(low_bit, None)
    return spec.with_dtypes(weight_dtype, kv_dtype)


def _dense(layers: int, h: int, heads: int, kv: int, inter: int, vocab: int, **extra: Any) -> dict:
    return {"model_type": "llama", "num_hidden_layers": layers, "hidden_size": h,
            "num_attention_heads": heads, "num_key_value_heads": kv, "intermediate_size": inter,
            "vocab_size": vocab, "torch_dtype": "bfloat16", **extra}


# Meta's FP8 Llama-3.1-405B (fbgemm_fp8, row-wise): the first and last layers, every attention
# block and the LM head stay in bf16 (the modules_to_not_convert of its quantization_config).
_LLAMA_405B_FP8_SKIP = ["model.layers.0", "model.layers.125", "lm_head",
                        *(f"model.layers.{i}.self_attn" for i in range(1, 125))]


# Architecture fields as published in each model's config.json (numbers only).
PRESET_CONFIGS: Mapping[str, Mapping[str, Any]] = MappingProxyType({
    "ref-8b": _dense(32, 4096, 32, 8, 14336, 128256, _nominal_params=8e9),
    "ref-70b": _dense(80, 8192, 64, 8, 28672, 128256, _nominal_params=70e9),
    "llama-3-8b": _dense(32, 4096, 32, 8, 14336, 128256, max_position_embeddings=8192),
    "llama-3-70b": _dense(80, 8192, 64, 8, 28672, 128256, max_position_embeddings=8192),
    "llama-3-405b": _dense(126, 16384, 128, 8, 53248, 128256, max_position_embeddings=131072),
    "llama-3.1-405b-fp8": _dense(126, 16384, 128, 8, 53248, 128256, max_position_embeddings=131072,
                                 quantization_config={"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
        "modules_to_not_convert": _LLAMA_405B_FP8_SKIP}),
    "llama-3.2-1b": _dense(16, 2048, 32, 8, 8192, 128256, max_position_embeddings=131072, head_dim=64,
                           tie_word_embeddings=True),
    "llama-3.2-3b": _dense(28, 3072, 24, 8, 8192, 128256, max_position_embeddings=131072, head_dim=128,
                           tie_word_embeddings=True),
    "qwen3-8b": _dense(36, 4096, 32, 8, 12288, 151936, max_position_embeddings=40960, head_dim=128,
                       model_type="qwen3"),
    "qwen3-32b": _dense(64, 5120, 64, 8, 25600, 151936, max_position_embeddings=40960, head_dim=128,
                        model_type="qwen3"),
    "qwen3-30b-a3b": _dense(48, 2048, 32, 4, 6144, 151936, max_position_embeddings=40960, head_dim=128,
                            num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, model_type="qwen3_moe"),
    "mistral-7b-v0.1": _dense(32, 4096, 32, 8, 14336, 32000, max_position_embeddings=32768, model_type="mistral",
                              sliding_window=4096),
    "gemma-2-9b": _dense(42, 3584, 16, 8, 14336, 256000, max_position_embeddings=8192, model_type="gemma2",
                         head_dim=256, sliding_window=4096),
    "mixtral-8x7b": _dense(32, 4096, 32, 8, 14336, 32000, max_position_embeddings=32768, num_local_experts=8,
                           num_experts_per_tok=2, model_type="mixtral"),
    "deepseek-v3": _dense(61, 7168, 128, 128, 18432, 129280, max_position_embeddings=163840,
                          model_type="deepseek_v3", n_routed_experts=256, num_experts_per_tok=8, n_shared_experts=1, moe_intermediate_size=2048,
                          first_k_dense_replace=3, q_lora_rank=1536, kv_lora_rank=512,
                          qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                          quantization_config={"quant_method": "fp8"}),
})

# (regex over the last path component, lowercased) -> preset key.
HF_ID_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"(meta-)?llama-3(\.[13])?-8b(-instruct)?", "llama-3-8b"),
    (r"(meta-)?llama-3(\.[13])?-70b(-instruct)?", "llama-3-70b"),
    (r"(meta-)?llama-3(\.1)?-405b(-instruct)?", "llama-3-405b"),
    (r"(meta-)?llama-3\.1-405b(-instruct)?-fp8", "llama-3.1-405b-fp8"),
    (r"llama-3\.2-1b(-instruct)?", "llama-3.2-1b"),
    (r"llama-3\.2-3b(-instruct)?", "llama-3.2-3b"),
    (r"qwen3-8b(-base)?", "qwen3-8b"),
    (r"qwen3-32b", "qwen3-32b"),
    (r"qwen3-30b-a3b(-base|-instruct-2507|-thinking-2507)?", "qwen3-30b-a3b"),
    (r"mistral-7b(-instruct)?-v0\.1", "mistral-7b-v0.1"),
    (r"gemma-2-9b(-it)?", "gemma-2-9b"),
    (r"mixtral-8x7b(-instruct)?(-v0\.1)?", "mixtral-8x7b"),
    (r"deepseek-v3(-base|-0324)?", "deepseek-v3"),
)


# A quantized checkpoint's id names its format: '-FP8' (RedHatAI, NVIDIA), '-FP4' (NVIDIA NVFP4),
# '-AWQ' / '-GPTQ-Int4' (4-bit) and '-GPTQ-Int8' (8-bit weight-only). Its config.json says more.
QUANTIZED_ID_SUFFIXES: tuple[tuple[str, WeightFormat], ...] = (
    (r"-fp8(-dynamic)?", WeightFormat("fp8", 0.0, "fp8")),
    (r"-(nv)?fp4", WeightFormat("fp4", 1 / 16, "fp4")),  # NVFP4: an fp8 scale per 16
    (r"-(awq|gptq(-int4)?|int4|w4a16)", WeightFormat("int4", 2.5 / 128, None)),  # group 128
    (r"-(gptq-int8|int8|w8a16)", WeightFormat("int8", 3 / 128, None)),
)


def _build_presets() -> Mapping[str, ModelSpec]:
    out: dict[str, ModelSpec] = {}
    for key, cfg in PRESET_CONFIGS.items():
        spec = from_hf_config(cfg, source=f"preset:{key}", name=key)
        nominal = cfg.get("_nominal_params")
        if nominal:  # the reference shapes: round parameter counts, as docs/physics.md computes
            spec = dataclasses.replace(  # every nominal weight in the weight dtype
                spec, params_total=float(nominal), params_active=float(nominal), linear_params=float(nominal),
                shared_weight_bytes=nominal * dtype_bytes(spec.weight_dtype), expert_weight_bytes=0.0,
                embedding_params=0.0, lm_head_params=0.0)
        out[key] = spec
    return MappingProxyType(out)


PRESETS: Mapping[str, ModelSpec] = _build_presets()


def preset(name: str) -> ModelSpec:
    """The preset `name` (e.g. 'llama-3-8b'); ConfigError listing the presets otherwise."""
    key = name.strip().lower()
    if key not in PRESETS:
        raise ConfigError(f"unknown model preset {name!r}; valid: {', '.join(PRESETS)}")
    return PRESETS[key]


def preset_for_hf_id(hf_id: str) -> ModelSpec | None:
    """The preset for a Hugging Face id or a local path ending in one (vLLM's /v1/models `root`),
    e.g. 'meta-llama/Meta-Llama-3-8B-Instruct' or '/models/Llama-3.1-8B'; None when unknown."""
    last = re.split(r"[/\\]", hf_id.strip().rstrip("/\\"))[-1].lower()
    key = _preset_key(last)
    if key is not None:
        return _with_context_of(PRESETS[key], last)
    for suffix, fmt in QUANTIZED_ID_SUFFIXES:
        base = re.fullmatch(rf"(.+?){suffix}", last)
        key = _preset_key(base.group(1)) if base else None
        if base is not None and key is not None:
            spec = _with_context_of(PRESETS[key], base.group(1)).stored_as(fmt)
            return dataclasses.replace(spec, notes=(
                *spec.notes, f"{fmt.dtype} weights from the model id's {last[base.end(1):]!r} suffix"))
    return None


# Ids a preset stands for whose context is longer than the preset's own: Llama 3.1 and 3.3 share Llama 3's
# shapes (the llama-3-8b and -70b presets) with RoPE scaled to 131,072 positions (their config.json).
LONGER_CONTEXT_IDS: tuple[tuple[str, int], ...] = ((r"(meta-)?llama-3\.[13]-.*", 131072),)


def _with_context_of(spec: ModelSpec, last: str) -> ModelSpec:
    """The preset as the id `last` names it: its max_position_embeddings where the id's is longer."""
    for pattern, tokens in LONGER_CONTEXT_IDS:
        if re.fullmatch(pattern, last) and (spec.max_context_tokens or 0) < tokens:
            return dataclasses.replace(spec, max_context_tokens=tokens)
    return spec


def _preset_key(last: str) -> str | None:
    return next((key for pattern, key in HF_ID_PATTERNS if re.fullmatch(pattern, last)), None)
