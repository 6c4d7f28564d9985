"""Model constants: the few numbers the physics needs, from a config.json, a preset, or an HF id.

Owns ModelSpec (layers, heads, KV heads, head dim, total and active parameters, weight and KV dtypes)
and the two byte counts everything else derives from:

- weight_bytes = params_total x bytes(weight_dtype): what one decode step streams (whole model; with
  tensor parallelism each GPU streams 1/tp of it).
- kv_bytes_per_token = 2 x layers x kv_heads x head_dim x bytes(kv_dtype); for MLA (DeepSeek-style
  latent KV) layers x (kv_lora_rank + rope_head_dim) x bytes(kv_dtype).

Parameter counts from a config.json are computed from the architecture (embeddings, attention, gated
MLP or MoE experts, norms; biases ignored), exact for Llama-family models. Presets are built through
the same parser, so they cannot drift from it. `ref-8b` and `ref-70b` are the seeds' reference
shapes with their nominal 8e9 / 70e9 parameters (the worked numbers are computed with those);
`llama-3-8b` carries the real 8,030,261,248. Bad or inconsistent input raises ConfigError (exit 2).
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from rooflight.agent.errors import ConfigError

DTYPE_BYTES: Mapping[str, float] = MappingProxyType(
    {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "fp4": 0.5})

_DTYPE_ALIASES = {
    "float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
    "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8",
    "fp8_inc": "fp8", "e4m3": "fp8", "mxfp4": "fp4", "nvfp4": "fp4",
}


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


@dataclass(frozen=True)
class ModelSpec:
    """What the physics needs to know about one model (all GPUs of one copy together)."""

    name: str
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    params_total: float
    params_active: float
    weight_dtype: str
    kv_dtype: str
    source: str
    mla_kv_lora_rank: int | None = None
    mla_rope_head_dim: int | None = None
    n_experts: int = 0  # routed experts per MoE layer (0: dense)
    n_experts_active: int = 0  # routed experts each token uses
    expert_params: float = 0.0  # all routed-expert weights, all layers (inside params_total)

    @property
    def is_mla(self) -> bool:
        return self.mla_kv_lora_rank is not None

    @property
    def is_moe(self) -> bool:
        return self.params_active < self.params_total

    @property
    def weight_bytes(self) -> float:
        """Bytes of weights one decode step streams, whole model: params_total x bytes(weight_dtype)."""
        return self.params_total * dtype_bytes(self.weight_dtype)

    def weight_bytes_streamed(self, batch: float) -> float:
        """Weight bytes one decode step of `batch` sequences reads. Dense: all of them. MoE: the
        shared weights plus the routed experts the batch touches, expected share 1 - (1 - k/E)^B
        under uniform routing (batch 1 reads only the active experts; large batches nearly all)."""
        if not self.n_experts:
            return self.weight_bytes
        touched = 1.0 - (1.0 - self.n_experts_active / self.n_experts) ** max(batch, 0.0)
        shared = self.params_total - self.expert_params
        return (shared + self.expert_params * touched) * dtype_bytes(self.weight_dtype)

    @property
    def kv_bytes_per_token(self) -> float:
        """K+V bytes one token holds, all layers (MLA: the shared latent plus the rope key)."""
        b = dtype_bytes(self.kv_dtype)
        if self.mla_kv_lora_rank is not None:
            return self.n_layers * (self.mla_kv_lora_rank + (self.mla_rope_head_dim or 0)) * b
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * b

    def kv_bytes_per_token_per_gpu(self, tp: int) -> float:
        """KV bytes per token on one of `tp` GPUs: KV heads shard across TP ranks (replicated when
        there are fewer KV heads than ranks); an MLA latent is not split by head, so every rank holds
        all of it (as vLLM does)."""
        if tp < 1:
            raise ConfigError(f"tensor-parallel size must be >= 1, got {tp}")
        if self.is_mla:
            return self.kv_bytes_per_token
        heads_per_gpu = max(1.0, self.n_kv_heads / tp)
        return self.kv_bytes_per_token * heads_per_gpu / self.n_kv_heads

    def with_dtypes(self, weight_dtype: str | None, kv_dtype: str | None) -> ModelSpec:
        """A copy with other weight / KV dtypes (None or 'auto' keeps the current one)."""
        w = self.weight_dtype if weight_dtype in (None, "auto") else normalize_dtype(weight_dtype)
        k = self.kv_dtype if kv_dtype in (None, "auto") else normalize_dtype(kv_dtype)
        return dataclasses.replace(self, weight_dtype=w, kv_dtype=k)


def _int(cfg: Mapping[str, Any], *keys: str, default: int | None = None, where: str = "") -> int:
    for key in keys:
        if key in cfg and cfg[key] is not None:
            v = cfg[key]
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"{where}: {key} must be a non-negative integer, got {v!r}")
            return v
    if default is None:
        raise ConfigError(f"{where}: missing {' / '.join(keys)}")
    return default


def _weight_dtype_of(cfg: Mapping[str, Any], where: str) -> str:
    q = cfg.get("quantization_config")
    if isinstance(q, Mapping):
        method = str(q.get("quant_method", "")).lower()
        bits = q.get("bits") or q.get("w_bit") or q.get("num_bits")
        if method in ("fp8", "fbgemm_fp8", "modelopt") and not bits:
            return "fp8"
        if method in ("mxfp4", "nvfp4"):
            return "fp4"
        if q.get("load_in_4bit"):
            return "int4"
        if q.get("load_in_8bit"):
            return "int8"
        if bits in (4, 8):
            return "int4" if bits == 4 else "int8"
        raise ConfigError(f"{where}: cannot tell the weight dtype of quantization {method!r}; "
                          "pass --weight-dtype")
    return _torch_dtype_of(cfg, where)


def _torch_dtype_of(cfg: Mapping[str, Any], where: str) -> str:
    raw = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    try:
        return normalize_dtype(str(raw))
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def _attention_params(cfg: Mapping[str, Any], h: int, n_heads: int, n_kv: int, hd: int,
                      where: str) -> tuple[int, int | None, int | None]:
    """Per-layer attention weights, and the MLA (kv_lora_rank, rope_dim) when the model uses MLA."""
    if cfg.get("kv_lora_rank") is None:
        return h * n_heads * hd * 2 + h * n_kv * hd * 2, None, None
    rank = _int(cfg, "kv_lora_rank", where=where)
    rope = _int(cfg, "qk_rope_head_dim", where=where)
    nope = _int(cfg, "qk_nope_head_dim", where=where)
    v_hd = _int(cfg, "v_head_dim", default=nope, where=where)
    q_rank = cfg.get("q_lora_rank")
    qk = n_heads * (nope + rope)
    q = h * qk if not q_rank else h * q_rank + q_rank + q_rank * qk
    kv = h * (rank + rope) + rank + rank * n_heads * (nope + v_hd)
    if rank == 0:
        raise ConfigError(f"{where}: kv_lora_rank must be positive")
    return q + kv + n_heads * v_hd * h, rank, rope


def _mlp_params(cfg: Mapping[str, Any], h: int, layers: int,
                where: str) -> tuple[int, int, int, int, int]:
    """(total, active, routed-expert params, experts, experts per token) of the MLPs, all layers:
    a dense gated MLP, or routed (+ shared) experts."""
    inter = cfg.get("intermediate_size")
    n_exp = _int(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0, where=where)
    if n_exp == 0:
        dense = layers * 3 * h * _int(cfg, "intermediate_size", where=where)
        return dense, dense, 0, 0, 0
    top_k = _int(cfg, "num_experts_per_tok", "num_experts_per_token", where=where)
    if not 0 < top_k <= n_exp:
        raise ConfigError(f"{where}: num_experts_per_tok={top_k} must be in 1..{n_exp}")
    e_inter = _int(cfg, "moe_intermediate_size", "intermediate_size", where=where)
    shared = _int(cfg, "n_shared_experts", default=0, where=where) * 3 * h * e_inter
    shared += 3 * h * _int(cfg, "shared_expert_intermediate_size", default=0, where=where)
    dense_layers = _int(cfg, "first_k_dense_replace", default=0, where=where)
    step = _int(cfg, "decoder_sparse_step", default=1, where=where) or 1
    mlp_only = set(cfg.get("mlp_only_layers") or ())
    moe_layers = sum(1 for i in range(dense_layers, layers) if i not in mlp_only and (i + 1) % step == 0)
    dense = (layers - moe_layers) * 3 * h * (inter or 0)
    if layers - moe_layers and not inter:
        raise ConfigError(f"{where}: dense layers need intermediate_size")
    expert = 3 * h * e_inter
    router = h * n_exp
    total = dense + moe_layers * (n_exp * expert + shared + router)
    active = dense + moe_layers * (top_k * expert + shared + router)
    return total, active, moe_layers * n_exp * expert, n_exp, top_k


def from_hf_config(cfg: Mapping[str, Any], *, source: str, name: str | None = None,
                   weight_dtype: str | None = None, kv_dtype: str | None = None) -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json mapping (Llama/Qwen/Mistral/Mixtral/DeepSeek).

    Handles GQA/MQA (num_key_value_heads, multi_query), MoE (routed, shared and dense layers), MLA
    (kv_lora_rank) and multimodal wrappers (text_config). Weight dtype comes from
    quantization_config or torch_dtype, the KV dtype from torch_dtype (vLLM's 'auto'), unless given.
    """
    where = source
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"{where}: config must be a JSON object")
    if "num_hidden_layers" not in cfg and isinstance(cfg.get("text_config"), Mapping):
        cfg = {**cfg["text_config"], **{k: v for k, v in cfg.items() if k in ("torch_dtype", "dtype")
                                        and k not in cfg["text_config"]}}
    layers = _int(cfg, "num_hidden_layers", "n_layer", "num_layers", where=where)
    h = _int(cfg, "hidden_size", "n_embd", "d_model", where=where)
    n_heads = _int(cfg, "num_attention_heads", "n_head", where=where)
    default_kv = 1 if cfg.get("multi_query") else n_heads
    n_kv = _int(cfg, "num_key_value_heads", "num_kv_heads", default=default_kv, where=where)
    if min(layers, h, n_heads, n_kv) == 0:
        raise ConfigError(f"{where}: layers, hidden size and head counts must be positive")
    if n_heads % n_kv:
        raise ConfigError(f"{where}: {n_heads} attention heads are not a multiple of {n_kv} KV heads")
    if cfg.get("head_dim") is None and h % n_heads:
        raise ConfigError(f"{where}: hidden_size {h} is not divisible by {n_heads} heads; set head_dim")
    hd = _int(cfg, "head_dim", default=h // n_heads, where=where)
    vocab = _int(cfg, "vocab_size", where=where)
    attn, mla_rank, mla_rope = _attention_params(cfg, h, n_heads, n_kv, hd, where)
    mlp_total, mlp_active, experts, n_exp, top_k = _mlp_params(cfg, h, layers, where)
    embeddings = vocab * h * (1 if cfg.get("tie_word_embeddings", False) else 2)
    norms = layers * 2 * h + h
    base = embeddings + norms + layers * attn
    w = normalize_dtype(weight_dtype) if weight_dtype not in (None, "auto") else _weight_dtype_of(cfg, where)
    k = normalize_dtype(kv_dtype) if kv_dtype not in (None, "auto") else _torch_dtype_of(cfg, where)
    return ModelSpec(
        name=name or str(cfg.get("_name_or_path") or cfg.get("model_type") or "model"),
        n_layers=layers, hidden_size=h, n_heads=n_heads, n_kv_heads=n_kv, head_dim=hd,
        params_total=float(base + mlp_total), params_active=float(base + mlp_active),
        weight_dtype=w, kv_dtype=k, source=source, mla_kv_lora_rank=mla_rank, mla_rope_head_dim=mla_rope,
        n_experts=n_exp, n_experts_active=top_k, expert_params=float(experts))


def load_config_json(path: str | Path, **kw: Any) -> ModelSpec:
    """Read a config.json (or a model directory holding one); ConfigError if unreadable or bad."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read model config {p}: {e.strerror or e}") from None
    except ValueError as e:
        raise ConfigError(f"model config {p} is not valid JSON: {e}") from None
    kw.setdefault("name", p.parent.name or p.stem)
    return from_hf_config(cfg, source=f"config.json:{p}", **kw)


def _dense(layers: int, h: int, heads: int, kv: int, inter: int, vocab: int, **extra: Any) -> dict:
    return {"num_hidden_layers": layers, "hidden_size": h, "num_attention_heads": heads,
            "num_key_value_heads": kv, "intermediate_size": inter, "vocab_size": vocab,
            "torch_dtype": "bfloat16", **extra}


# Architecture fields as published in each model's config.json (numbers only).
PRESET_CONFIGS: Mapping[str, Mapping[str, Any]] = MappingProxyType({
    "ref-8b": _dense(32, 4096, 32, 8, 14336, 128256, _nominal_params=8e9),
    "ref-70b": _dense(80, 8192, 64, 8, 28672, 128256, _nominal_params=70e9),
    "llama-3-8b": _dense(32, 4096, 32, 8, 14336, 128256),
    "llama-3-70b": _dense(80, 8192, 64, 8, 28672, 128256),
    "llama-3-405b": _dense(126, 16384, 128, 8, 53248, 128256),
    "llama-3.2-1b": _dense(16, 2048, 32, 8, 8192, 128256, head_dim=64, tie_word_embeddings=True),
    "llama-3.2-3b": _dense(28, 3072, 24, 8, 8192, 128256, head_dim=128, tie_word_embeddings=True),
    "qwen3-8b": _dense(36, 4096, 32, 8, 12288, 151936, head_dim=128),
    "qwen3-32b": _dense(64, 5120, 64, 8, 25600, 151936, head_dim=128),
    "qwen3-30b-a3b": _dense(48, 2048, 32, 4, 6144, 151936, head_dim=128, num_experts=128,
                            num_experts_per_tok=8, moe_intermediate_size=768),
    "mixtral-8x7b": _dense(32, 4096, 32, 8, 14336, 32000, num_local_experts=8, num_experts_per_tok=2),
    "deepseek-v3": _dense(61, 7168, 128, 128, 18432, 129280, n_routed_experts=256,
                          num_experts_per_tok=8, n_shared_experts=1, moe_intermediate_size=2048,
                          first_k_dense_replace=3, q_lora_rank=1536, kv_lora_rank=512,
                          qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                          quantization_config={"quant_method": "fp8"}),
})

# (regex over the last path component, lowercased) -> preset key.
HF_ID_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"(meta-)?llama-3(\.[13])?-8b(-instruct)?", "llama-3-8b"),
    (r"(meta-)?llama-3(\.[13])?-70b(-instruct)?", "llama-3-70b"),
    (r"(meta-)?llama-3(\.1)?-405b(-instruct)?(-fp8)?", "llama-3-405b"),
    (r"llama-3\.2-1b(-instruct)?", "llama-3.2-1b"),
    (r"llama-3\.2-3b(-instruct)?", "llama-3.2-3b"),
    (r"qwen3-8b(-base)?", "qwen3-8b"),
    (r"qwen3-32b", "qwen3-32b"),
    (r"qwen3-30b-a3b(-base|-instruct-2507|-thinking-2507)?", "qwen3-30b-a3b"),
    (r"mixtral-8x7b(-instruct)?(-v0\.1)?", "mixtral-8x7b"),
    (r"deepseek-v3(-base|-0324)?", "deepseek-v3"),
)


def _build_presets() -> Mapping[str, ModelSpec]:
    out: dict[str, ModelSpec] = {}
    for key, cfg in PRESET_CONFIGS.items():
        spec = from_hf_config(cfg, source=f"preset:{key}", name=key)
        nominal = cfg.get("_nominal_params")
        if nominal:  # the seeds' reference shapes: round parameter counts, as the lesson computes
            spec = dataclasses.replace(spec, params_total=float(nominal), params_active=float(nominal))
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
    for pattern, key in HF_ID_PATTERNS:
        if re.fullmatch(pattern, last):
            return PRESETS[key]
    return None
