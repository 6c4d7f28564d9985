"""How a checkpoint's quantization_config stores its weights: bytes per weight, scales, GEMM dtype.

A quantized checkpoint does not put every tensor in the low-bit format. Embeddings, the LM head,
norms, biases and MoE routers stay in the 16-bit serving dtype, and each scheme may leave whole
modules out (`ignore`, `exclude_modules`, `modules_to_not_convert`). The quantized linear weights
carry scales: one per group of `group_size` weights (GPTQ/AWQ: a 16-bit scale and a packed zero
point; NVFP4: one fp8 scale per 16; MXFP4: one 8-bit exponent per 32) or one per 128x128 block
(fp8 block quantization, a 4-byte scale). Per-tensor and per-channel scales are under 0.1% of the
weights and are not counted.

The GEMM dtype decides which tensor-core peak MFU divides by: W8A8 fp8 runs fp8 GEMMs, W8A8 int8
runs int8 GEMMs, but weight-only schemes (GPTQ, AWQ, bitsandbytes, weight-only fp8/int8) dequantize
into 16-bit GEMMs, so they keep the 16-bit peak. Every value is read through ConfigReader.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Sequence

from rooflight.agent.errors import ConfigError
from rooflight.agent.roofline.config_reader import ConfigReader

MAX_PATTERNS = 10_000


@dataclass(frozen=True)
class WeightFormat:
    """How one quantized linear weight is stored and multiplied."""

    dtype: str  # element dtype: fp8, int8, int4, fp4
    scale_bytes_per_weight: float  # group/block scales (and zero points) per weight
    gemm_dtype: str | None  # the GEMM's input dtype; None: weight-only, the GEMM runs in 16 bit


class Patterns:
    """Module-name patterns: `re:<regex>` (re.match), globs with * or ?, else a dotted name that
    matches itself and anything inside it ('model.layers.0' matches 'model.layers.0.mlp.up_proj',
    'self_attn' matches every attention projection, 'lm_head' matches the LM head). A glob, like a
    name, matches a module and its children: gpt-oss's 'model.layers.*.self_attn' keeps every
    attention projection 16-bit, as the module it names holds them (transformers and vLLM skip a
    module's children with it)."""

    def __init__(self, patterns: Sequence[str], where: str) -> None:
        if len(patterns) > MAX_PATTERNS:
            raise ConfigError(f"{where}: at most {MAX_PATTERNS:,} module patterns, got {len(patterns):,}")
        self.plain = frozenset(p for p in patterns if not p.startswith("re:") and not set(p) & set("*?["))
        self.globs = tuple(p for p in patterns if not p.startswith("re:") and set(p) & set("*?["))
        self.regexes = tuple(_compile(p[3:], where) for p in patterns if p.startswith("re:"))

    def __bool__(self) -> bool:
        return bool(self.plain or self.globs or self.regexes)

    def match(self, name: str) -> bool:
        parts = name.split(".")
        if self.plain and any(".".join(parts[i:j]) in self.plain
                              for i in range(len(parts)) for j in range(i + 1, len(parts) + 1)):
            return True
        if self.globs:
            prefixes = [".".join(parts[:j]) for j in range(len(parts), 0, -1)]
            if any(fnmatchcase(p, g) for g in self.globs for p in prefixes):
                return True
        return any(r.match(name) for r in self.regexes)


def _compile(pattern: str, where: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as e:
        raise ConfigError(f"{where}: module pattern {pattern[:60]!r} is not a valid regex: {e}") from None


@dataclass(frozen=True)
class QuantScheme:
    """A checkpoint's quantization: which linear weights get which format, and the KV-cache dtype."""

    method: str
    groups: tuple[tuple[Patterns | None, WeightFormat], ...]  # (targets, format); None: every linear
    ignore: Patterns
    kv_dtype: str | None = None  # the KV-cache dtype the checkpoint asks for, if any

    def format_for(self, name: str) -> WeightFormat | None:
        """The format of linear module `name`, or None when it stays in the 16-bit dtype."""
        if self.ignore.match(name):
            return None
        for targets, fmt in self.groups:
            if targets is None or targets.match(name):
                return fmt
        return None


_ELEMENT = {("float", 8): "fp8", ("float", 4): "fp4", ("int", 8): "int8", ("int", 4): "int4"}
_KV_NAMES = {"fp8": "fp8", "fp8_e4m3": "fp8", "float8": "fp8", "int8": "int8", "nvfp4": "fp4", "fp4": "fp4"}


def describe_str(s: str) -> str:
    """A config string in a message, cut to 40 characters."""
    return repr(s if len(s) <= 40 else s[:37] + "...")


def _unsupported(q: ConfigReader, what: str) -> ConfigError:
    return ConfigError(f"{q.where}: {q.path.rstrip('.')}: {what} is not a format Rooflight sizes; "
                       "pass --weight-dtype (and --kv-dtype) to say how the weights are stored")


def _group_scale(bits: int, group_size: int | None, zero_point: bool) -> float:
    """GPTQ/AWQ-style groups: a 16-bit scale (and a packed `bits`-bit zero point) per group."""
    if not group_size or group_size <= 0:
        return 0.0  # per-channel
    return (2.0 + (bits / 8 if zero_point else 0.0)) / group_size


def _kv_from_name(q: ConfigReader, key: str) -> str | None:
    name = q.string(key)
    if name is None:
        return None
    kv = _KV_NAMES.get(name.strip().lower())
    if kv is None:
        raise ConfigError(f"{q.where}: {q.path}{key} {name!r} is not a KV-cache dtype Rooflight knows "
                          f"({', '.join(sorted(set(_KV_NAMES)))}); pass --kv-dtype")
    return kv


def _kv_scheme(q: ConfigReader) -> str | None:
    """compressed-tensors `kv_cache_scheme`: an object {num_bits, type}, or a name such as 'FP8'."""
    if not q.has("kv_cache_scheme"):
        return None
    if isinstance(q.cfg["kv_cache_scheme"], str):
        return _kv_from_name(q, "kv_cache_scheme")
    kv = q.mapping("kv_cache_scheme")
    if kv is None:
        return None
    key = (kv.string("type", "int") or "int", kv.integer("num_bits", lo=1, hi=64))
    if key not in _ELEMENT:
        raise _unsupported(kv, f"a {key[1]}-bit {key[0]} KV cache")
    return _ELEMENT[key]


def _ct_args(w: ConfigReader) -> tuple[str, int]:
    kind = (w.string("type", "int") or "int").lower()
    if kind not in ("int", "float"):
        raise ConfigError(f"{w.where}: {w.path}type must be 'int' or 'float', got {describe_str(kind)}")
    return kind, w.integer("num_bits", lo=1, hi=64)


def _ct_format(group: ConfigReader) -> WeightFormat | None:
    """One compressed-tensors config group: weights {num_bits, type, strategy, group_size,
    block_structure, symmetric} and input_activations (null: weight-only)."""
    w = group.mapping("weights")
    if w is None:
        return None
    kind, bits = _ct_args(w)
    if bits >= 16:
        return None
    if (kind, bits) not in _ELEMENT:
        raise _unsupported(w, f"{bits}-bit {kind} weights")
    strategy = (w.string("strategy", "tensor") or "tensor").lower()
    size = w.optional_integer("group_size", lo=0)
    if strategy == "tensor_group":  # NVFP4: an fp8 scale per group of 16
        scale = 1.0 / (size or 16)
    elif strategy == "group":
        scale = _group_scale(bits, size or 128, not w.boolean("symmetric", True))
    elif strategy == "block":
        block = w.int_list("block_structure", lo=1, hi=1_000_000) or (128, 128)
        if len(block) != 2:
            raise ConfigError(f"{w.where}: {w.path}block_structure must be two numbers, got {list(block)}")
        scale = 4.0 / (block[0] * block[1])
    else:
        scale = 0.0  # tensor, channel: negligible
    gemm = None
    acts = group.mapping("input_activations")
    if acts is not None:
        a_kind, a_bits = _ct_args(acts)
        gemm = _ELEMENT.get((a_kind, a_bits)) if a_bits < 16 else None
    return WeightFormat(_ELEMENT[(kind, bits)], scale, gemm)


def _compressed_tensors(q: ConfigReader) -> QuantScheme:
    groups = []
    for _, group in q.mapping_items("config_groups"):
        fmt = _ct_format(group)
        if fmt is None:
            continue
        targets = group.str_list("targets") or ("Linear",)
        if "Linear" in targets:
            groups.append((None, fmt))
        else:
            groups.append((Patterns(targets, q.where), fmt))
    if not groups:
        raise _unsupported(q, "a compressed-tensors config with no quantized weight group")
    return QuantScheme("compressed-tensors", tuple(groups), Patterns(q.str_list("ignore"), q.where),
                       _kv_scheme(q))


_MODELOPT = {
    "FP8": ("fp8", 0, "fp8"), "FP8_PER_CHANNEL_PER_TOKEN": ("fp8", 0, "fp8"),
    "NVFP4": ("fp4", 16, "fp4"), "W4A16_NVFP4": ("fp4", 16, None), "NVFP4_AWQ": ("fp4", 16, "fp4"),
    "W4A8_AWQ": ("int4", 128, "fp8"), "INT8_SQ": ("int8", 0, "int8"), "INT4_AWQ": ("int4", 128, None),
}


def _modelopt(q: ConfigReader) -> QuantScheme:
    """NVIDIA ModelOpt: quant_algo (FP8, NVFP4, ...), group_size, exclude_modules, and
    kv_cache_quant_algo (or, in the newer config.json form, kv_cache_scheme)."""
    algo = (q.string("quant_algo") or "").upper()
    if algo not in _MODELOPT:
        raise _unsupported(q, f"ModelOpt quant_algo {describe_str(algo)}")
    dtype, default_group, gemm = _MODELOPT[algo]
    size = q.integer("group_size", default=default_group, lo=0)
    if dtype == "fp4":
        scale = 1.0 / size if size else 0.0  # an fp8 (E4M3) scale per group
    elif dtype == "int4":
        scale = _group_scale(4, size, False)
    else:
        scale = 0.0
    ignore = q.str_list("exclude_modules") or q.str_list("ignore")
    kv = _kv_from_name(q, "kv_cache_quant_algo") if q.has("kv_cache_quant_algo") else _kv_scheme(q)
    return QuantScheme("modelopt", ((None, WeightFormat(dtype, scale, gemm)),), Patterns(ignore, q.where), kv)


def _skip(q: ConfigReader) -> Patterns:
    names: list[str] = []
    for key in ("modules_to_not_convert", "ignored_layers", "llm_int8_skip_modules", "ignore"):
        names += q.str_list(key)
    return Patterns(names, q.where)


def _integer_weight_only(q: ConfigReader, method: str) -> QuantScheme:
    """GPTQ, AWQ, AutoRound and the like: `bits` (4 or 8), `group_size` (-1: per channel)."""
    bits = q.integer("bits", "w_bit", "num_bits", lo=1, hi=64)
    if bits not in (4, 8):
        raise _unsupported(q, f"{bits}-bit {method}")
    size = q.integer("group_size", "q_group_size", default=128, lo=-1)
    fmt = WeightFormat("int4" if bits == 4 else "int8", _group_scale(bits, size, True), None)
    return QuantScheme(method, ((None, fmt),), _skip(q))


def _bitsandbytes(q: ConfigReader) -> QuantScheme:
    if q.boolean("load_in_4bit", False):  # NF4/FP4 blocks of 64 with an fp32 absmax (8-bit if nested)
        scale = 1 / 64 + 4 / (64 * 256) if q.boolean("bnb_4bit_use_double_quant", False) else 4 / 64
        fmt = WeightFormat("int4", scale, None)
    elif q.boolean("load_in_8bit", False):
        fmt = WeightFormat("int8", 0.0, None)
    else:
        raise _unsupported(q, "bitsandbytes without load_in_4bit or load_in_8bit")
    return QuantScheme("bitsandbytes", ((None, fmt),), _skip(q))


def _fp8(q: ConfigReader, method: str) -> QuantScheme:
    """fp8 (DeepSeek-style, optional 128x128 `weight_block_size` with fp32 scales) and fbgemm_fp8
    (row-wise scales): fp8 weights and dynamic fp8 activations."""
    block = q.int_list("weight_block_size", lo=1, hi=1_000_000)
    if block and len(block) != 2:
        raise ConfigError(f"{q.where}: {q.path}weight_block_size must be two numbers, got {list(block)}")
    scale = 4.0 / (block[0] * block[1]) if block else 0.0
    return QuantScheme(method, ((None, WeightFormat("fp8", scale, "fp8")),), _skip(q))


def parse_scheme(q: ConfigReader) -> QuantScheme:
    """The scheme of a `quantization_config` object; ConfigError saying to pass --weight-dtype
    when the format is not one of those sized here."""
    method = (q.string("quant_method") or "").lower().replace("_", "-")
    if method == "compressed-tensors" or (not method and q.has("config_groups")):
        return _compressed_tensors(q)
    if method.startswith("modelopt") or (not method and q.has("quant_algo")):
        return _modelopt(q)
    if method in ("fp8", "fbgemm-fp8"):
        return _fp8(q, method)
    if method == "mxfp4":  # gpt-oss: experts in MXFP4, an 8-bit exponent per 32
        return QuantScheme(method, ((None, WeightFormat("fp4", 1 / 32, None)),), _skip(q))
    if method == "bitsandbytes" or q.has("load_in_4bit") or q.has("load_in_8bit"):
        return _bitsandbytes(q)
    if method in ("gptq", "gptq-marlin", "awq", "awq-marlin", "auto-round", "autoround") or (
            q.first_key("bits", "w_bit") is not None):
        return _integer_weight_only(q, method or "gptq")
    raise _unsupported(q, f"quant_method {describe_str(method)}")
