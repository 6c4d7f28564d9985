"""Model constants: config.json parsing, presets, dtypes, GQA/MQA/MoE/MLA, and the errors that stop startup."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rooflight.agent.errors import ConfigError
from rooflight.agent.model_files import load_config_json
from rooflight.agent.roofline.models import PRESETS, dtype_bytes, from_hf_config, preset, preset_for_hf_id
from support import MODEL_CONFIGS

FIX = MODEL_CONFIGS


def test_llama_3_8b_config_gives_the_published_kv_and_the_real_parameter_count() -> None:
    m = load_config_json(FIX / "llama-3-8b.json")
    assert m.params_total == 8_030_261_248 == m.params_active  # the published count, exactly
    assert m.kv_bytes_per_token == 131_072  # 2 x 32 x 8 x 128 x 2 = 128 KiB
    assert (m.n_layers, m.n_heads, m.n_kv_heads, m.head_dim) == (32, 32, 8, 128)
    assert m.weight_dtype == m.kv_dtype == "bf16"
    assert m.source.startswith("config.json:") and m.source.endswith("llama-3-8b.json")
    assert not m.is_moe and not m.is_mla


def test_tiny_llama_matches_the_real_engine_models_parameter_count() -> None:
    # tests/real_engine/make_tiny_llama.py builds this shape and reports 2,229,504 parameters.
    m = load_config_json(FIX / "tiny-llama.json")
    assert m.params_total == 2_229_504
    assert m.kv_bytes_per_token == 2 * 2 * 2 * 64 * 2


def test_directory_with_config_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((FIX / "tiny-llama.json").read_text())
    m = load_config_json(tmp_path)
    assert m.name == tmp_path.name and m.params_total == 2_229_504


def test_gqa_uses_kv_heads_not_query_heads() -> None:
    m = load_config_json(FIX / "qwen3-8b-gqa.json")
    assert m.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2
    # The classic trap: sizing with the 32 query heads would inflate the cache 4x here.
    assert m.n_kv_heads * 4 == m.n_heads


def test_mqa_has_one_kv_head_and_fp16() -> None:
    m = load_config_json(FIX / "mqa-example.json")
    assert m.n_kv_heads == 1 and m.head_dim == 64
    assert m.weight_dtype == "fp16"
    assert m.kv_bytes_per_token == 2 * 32 * 1 * 64 * 2


def test_moe_active_is_less_than_total() -> None:
    m = load_config_json(FIX / "mixtral-8x7b-moe.json")
    assert m.is_moe
    assert m.params_total == pytest.approx(46.7e9, rel=0.002)  # Mixtral's published 46.7B
    assert m.params_active == pytest.approx(12.9e9, rel=0.002)  # and 12.9B active
    assert m.weight_bytes == 2 * m.params_total  # every expert is resident and may be streamed


def test_deepseek_v3_mla_and_fp8_weights() -> None:
    m = load_config_json(FIX / "deepseek-v3-mla.json")
    assert m.is_mla and m.is_moe
    assert m.weight_dtype == "fp8"  # from quantization_config, not torch_dtype
    assert m.kv_dtype == "bf16"
    assert m.kv_bytes_per_token == 61 * (512 + 64) * 2  # latent + rope key, not 2 x 128 heads
    assert m.params_total == pytest.approx(671e9, rel=0.005)
    assert m.params_active == pytest.approx(37e9, rel=0.03)
    assert m.weight_bytes == pytest.approx(671e9, rel=0.005)
    # MLA's latent is not split by head: every TP rank holds all of it.
    assert m.kv_bytes_per_token_per_gpu(8) == m.kv_bytes_per_token


def test_kv_per_gpu_shards_heads_and_replicates_past_the_head_count() -> None:
    m = preset("llama-3-70b")
    assert m.kv_bytes_per_token_per_gpu(4) == m.kv_bytes_per_token / 4
    assert m.kv_bytes_per_token_per_gpu(16) == m.kv_bytes_per_token / 8  # 8 KV heads, 16 ranks
    with pytest.raises(ConfigError):
        m.kv_bytes_per_token_per_gpu(0)


@pytest.mark.parametrize("name,match", [("broken-heads.json", "not a multiple"),
                                        ("truncated.json", "not valid JSON"),
                                        ("missing.json", "cannot read")])
def test_broken_configs_are_config_errors(name: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config_json(FIX / name)


@pytest.mark.parametrize("patch,match", [
    ({"num_hidden_layers": None}, "missing num_hidden_layers"),
    ({"hidden_size": "4096"}, "hidden_size must be"),
    ({"num_attention_heads": 0}, "num_attention_heads must be a whole number from 1"),
    ({"hidden_size": 4095, "head_dim": None}, "not divisible"),
    ({"torch_dtype": "float64"}, "unknown dtype"),
    ({"num_local_experts": 8, "num_experts_per_tok": 9}, "num_experts_per_tok"),
    ({"quantization_config": {"quant_method": "mystery"}}, "--weight-dtype"),
])
def test_inconsistent_fields(patch: dict, match: str) -> None:
    cfg = {**json.loads((FIX / "llama-3-8b.json").read_text()), **patch}
    with pytest.raises(ConfigError, match=match):
        from_hf_config(cfg, source="test")


def test_quantization_configs_set_weight_dtype() -> None:
    base = json.loads((FIX / "llama-3-8b.json").read_text())
    awq = from_hf_config({**base, "quantization_config": {"quant_method": "awq", "bits": 4}}, source="t")
    gptq8 = from_hf_config({**base, "quantization_config": {"quant_method": "gptq", "bits": 8}}, source="t")
    assert (awq.weight_dtype, gptq8.weight_dtype, awq.kv_dtype) == ("int4", "int8", "bf16")
    # 6,979,321,856 linear weights at 4 bits plus a 16-bit scale and a 4-bit zero per group of 128
    # (the default group size), the 1,050,939,392 embedding, LM-head and norm weights in bf16.
    linear, rest = 6_979_321_856, 1_050_939_392
    assert linear + rest == awq.params_total
    assert awq.weight_bytes == linear * 0.5 + linear / 128 * 2.5 + rest * 2 == 5_727_854_592
    assert gptq8.weight_bytes == linear * 1 + linear / 128 * 3 + rest * 2


def test_dtype_overrides_and_with_dtypes() -> None:
    m = preset("ref-8b")
    assert m.weight_bytes == 16e9
    q = m.with_dtypes("int8", "fp8_e4m3")
    assert q.weight_bytes == 8e9 and q.kv_bytes_per_token == 65_536  # FP8 KV halves the cache
    assert q.with_dtypes(None, "auto") == q
    assert m.with_dtypes("int4", None).weight_bytes == 4e9
    with pytest.raises(ConfigError):
        m.with_dtypes("int3", None)
    assert [dtype_bytes(d) for d in ("bfloat16", "fp16", "fp8", "int8", "int4")] == [2, 2, 1, 1, 0.5]


def test_text_config_wrapper() -> None:
    inner = json.loads((FIX / "llama-3-8b.json").read_text())
    m = from_hf_config({"model_type": "wrapper", "text_config": inner}, source="t", name="w")
    assert m.params_total == 8_030_261_248 and m.name == "w"


def test_presets() -> None:
    for key in ("llama-3-8b", "llama-3-70b", "llama-3-405b", "qwen3-8b", "mixtral-8x7b", "deepseek-v3"):
        assert PRESETS[key].source == f"preset:{key}"
    assert preset("ref-70b").weight_bytes == 140e9  # 70e9 x 2 B
    assert preset("ref-70b").kv_bytes_per_token == 327_680  # 320 KiB
    assert preset("llama-3-405b").weight_bytes == pytest.approx(810e9, rel=0.003)  # ~810 GB
    assert preset("qwen3-30b-a3b").params_active == pytest.approx(3.3e9, rel=0.02)
    assert preset("llama-3-8b").params_total == load_config_json(FIX / "llama-3-8b.json").params_total
    with pytest.raises(ConfigError, match="llama-3-8b"):
        preset("llama-9-1t")


@pytest.mark.parametrize("hf_id,key", [
    ("meta-llama/Meta-Llama-3-8B-Instruct", "llama-3-8b"),
    ("/models/Llama-3.1-8B", "llama-3-8b"),
    ("/models/Llama-3.1-8B/", "llama-3-8b"),
    ("meta-llama/Llama-3.3-70B-Instruct", "llama-3-70b"),
    ("meta-llama/Llama-3.1-405B-Instruct-FP8", "llama-3.1-405b-fp8"),
    ("mistralai/Mistral-7B-v0.1", "mistral-7b-v0.1"),
    ("google/gemma-2-9b-it", "gemma-2-9b"),
    ("Qwen/Qwen3-30B-A3B", "qwen3-30b-a3b"),
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
    ("deepseek-ai/DeepSeek-V3", "deepseek-v3"),
])
def test_preset_for_hf_id(hf_id: str, key: str) -> None:
    m = preset_for_hf_id(hf_id)
    assert m is not None and m.name == key


@pytest.mark.parametrize("hf_id", ["facebook/opt-125m", "/tmp/tiny-llama", "Llama-3.1-8B-extra", ""])
def test_unknown_hf_ids(hf_id: str) -> None:
    assert preset_for_hf_id(hf_id) is None
