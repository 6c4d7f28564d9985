"""Real checkpoints through `rooflight plan`: sliding windows, model-type defaults, fp32, quantization
formats and model ids. Each fixture in tests/fixtures/model-configs/ is the published config.json of
the model named in its `_comment`; every expected number is worked by hand from that architecture."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rooflight.agent.errors import ConfigError
from rooflight.agent.roofline.gpus import get_profile
from rooflight.agent.model_files import load_config_json
from rooflight.agent.roofline.models import from_hf_config, preset, preset_for_hf_id
from rooflight.agent.plan_cli import format_plan
from rooflight.agent.roofline.plan import build_plan
from support import MODEL_CONFIGS, run_in_process

FIX = MODEL_CONFIGS
H100_FREE = 80e9 - 4e9  # an H100's memory less the plan's default 4 GB reserve


def plan(*argv: str) -> dict:
    """`rooflight plan ... --json` in-process through the CLI's main: the exit code must be 0."""
    done = run_in_process("plan", *argv, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def plan_fails(*argv: str) -> str:
    """`rooflight plan ...` that must exit 2 with a message and no traceback; returns the message."""
    done = run_in_process("plan", *argv)
    assert done.returncode == 2, done.stderr
    return done.stderr


def config(name: str) -> dict:
    return json.loads((FIX / name).read_text())


# --- sliding windows ------------------------------------------------------------------------------

def test_mistral_7b_v01_at_32k_keeps_only_its_4096_token_window() -> None:
    d = plan("--model-config", str(FIX / "mistral-7b-v0.1.json"), "--context", "32000")
    per_layer_token = 2 * 8 * 128 * 2  # K and V, 8 KV heads of 128, bf16
    assert d["params_total"] == 7_241_732_096  # Mistral-7B's published count
    assert d["kv_bytes_per_token"] == 32 * per_layer_token == 131_072
    assert d["kv_bytes_per_sequence"] == 32 * 4096 * per_layer_token == 536_870_912
    assert 131_072 * 32000 / d["kv_bytes_per_sequence"] == pytest.approx(7.8, abs=0.02)  # the old error
    weights = 2 * 7_241_732_096
    assert d["weight_bytes"] == weights
    assert d["max_concurrent_sequences"] == math.floor((H100_FREE - weights) / 536_870_912) == 114
    # a step reads the weights but the input table (32,000 x 4,096 bf16), of which one row
    table = 32_000 * 4096 * 2
    assert d["decode_step_seconds_at_context"] == pytest.approx((weights - table + 4096 * 2 + 536_870_912) / 3.35e12)
    assert (d["windowed_layers"], d["kv_window_tokens"]) == (32, 4096)
    assert d["kv_weight_crossover_tokens"] is None  # a 537 MB cap never reaches 14.5 GB of weights


def test_mistral_below_its_window_is_linear_in_context() -> None:
    d = plan("--model-config", str(FIX / "mistral-7b-v0.1.json"), "--context", "2000")
    assert d["kv_bytes_per_sequence"] == 2000 * 131_072


def test_gemma_2_9b_ties_its_embeddings_alternates_local_and_global_layers_and_serves_fp32_as_bf16() -> None:
    d = plan("--model-config", str(FIX / "gemma-2-9b.json"), "--context", "8192")
    # 256,000 x 3,584 embedding (tied: counted once); per layer q/o 2 x 3,584 x 16 x 256, k/v
    # 2 x 3,584 x 8 x 256, gated MLP 3 x 3,584 x 14,336, four 3,584-wide norms; the final norm.
    layer = 2 * 3584 * 16 * 256 + 2 * 3584 * 8 * 256 + 3 * 3584 * 14336 + 4 * 3584
    assert d["params_total"] == 256_000 * 3584 + 42 * layer + 3584 == 9_241_705_984
    assert d["params_total"] + 256_000 * 3584 == 10_159_209_984  # what an untied count said
    assert (d["weight_dtype"], d["kv_dtype"], d["compute_dtype"]) == ("bf16", "bf16", "bf16")
    assert d["weight_bytes"] == 2 * 9_241_705_984  # 2 bytes: vLLM serves the fp32 checkpoint in bf16
    assert d["peak_flops"] == 989e12  # the 16-bit peak, not TF32's 494.5
    per_layer_token = 2 * 8 * 256 * 2
    assert d["kv_bytes_per_token"] == 42 * per_layer_token == 344_064
    assert d["kv_bytes_per_sequence"] == (21 * 8192 + 21 * 4096) * per_layer_token == 2_113_929_216
    assert any("fp32" in note for note in d["notes"])


def test_an_fp32_llama_checkpoint_is_sized_in_16_bit() -> None:
    spec = from_hf_config({**config("llama-3-8b.json"), "torch_dtype": "float32"}, source="t")
    assert spec.weight_bytes == 2 * 8_030_261_248 and spec.kv_bytes_per_token == 131_072
    assert (spec.weight_dtype, spec.kv_dtype, spec.compute_dtype) == ("bf16", "bf16", "bf16")


def test_layer_types_say_the_same_as_gemma_2s_implicit_pattern() -> None:
    gemma = config("gemma-2-9b.json")
    types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(42)]
    explicit = from_hf_config({**gemma, "layer_types": types}, source="t")
    implicit = from_hf_config(gemma, source="t")
    assert explicit.window_layers == implicit.window_layers == ((4096, 21),)
    assert explicit.kv_bytes_per_sequence(32_000) == implicit.kv_bytes_per_sequence(32_000)


def test_gemma_3_wrapper_uses_the_text_config_and_gemma3_text_defaults() -> None:
    m = load_config_json(FIX / "gemma-3-27b-it.json")
    # vocab 262,208 (tied) and the 5-local-1-global pattern are Gemma3TextConfig defaults; every
    # 6th layer (i = 5, 11, ..., 59) is global: 10 global, 52 local with a 1,024-token window.
    layer = 2 * 5376 * 32 * 128 + 2 * 5376 * 16 * 128 + 3 * 5376 * 21504 + 4 * 5376 + 2 * 128
    assert m.params_total == 262_208 * 5376 + 62 * layer + 5376 == 27_009_346_304
    assert m.window_layers == ((1024, 52),) and m.full_attention_layers == 10
    assert m.kv_bytes_per_sequence(32_000) == (10 * 32_000 + 52 * 1024) * (2 * 16 * 128 * 2)


def test_chunked_and_qwen2_window_layers() -> None:
    base = config("llama-3-8b.json")
    chunked = ["chunked_attention", "chunked_attention", "chunked_attention", "full_attention"] * 8
    m = from_hf_config({**base, "layer_types": chunked, "attention_chunk_size": 8192}, source="t")
    assert m.window_layers == ((8192, 24),)
    qwen2 = from_hf_config({**base, "use_sliding_window": True, "sliding_window": 4096,
                            "max_window_layers": 20}, source="t")
    assert qwen2.window_layers == ((4096, 12),)  # Qwen2: layers 20..31 slide
    off = from_hf_config({**base, "use_sliding_window": False, "sliding_window": 4096}, source="t")
    assert off.window_layers == ()


@pytest.mark.parametrize("patch,match", [
    ({"layer_types": ["full_attention"] * 31}, "31 entries for 32 layers"),
    ({"layer_types": ["linear_attention"] * 32}, "layer_types\\[0\\]"),
    ({"layer_types": ["sliding_attention"] * 32}, "missing sliding_window"),
])
def test_bad_layer_types(patch: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        from_hf_config({**config("llama-3-8b.json"), **patch}, source="t")


# --- quantization ---------------------------------------------------------------------------------

LLAMA_70B_LINEAR = 80 * (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672)
LLAMA_70B_REST = 2 * 128_256 * 8192 + 80 * 2 * 8192 + 8192  # embeddings, LM head, norms
NVFP4_70B_BYTES = LLAMA_70B_LINEAR * (0.5 + 1 / 16) + LLAMA_70B_REST * 2


def test_nvfp4_70b_is_4_bit_weights_with_fp8_group_scales_and_an_fp8_kv_cache() -> None:
    d = plan("--model-config", str(FIX / "llama-3.3-70b-nvfp4.json"), "--gpu", "b200")
    assert d["params_total"] == LLAMA_70B_LINEAR + LLAMA_70B_REST == 70_553_706_496
    # The checkpoint's index says 42,709,045,632 bytes: these plus 4,480 bytes of fp32 per-tensor
    # scales (80 layers x 7 projections x 2 x 4 B), which are not counted.
    assert d["weight_bytes"] == NVFP4_70B_BYTES == 42_709_041_152 == 42_709_045_632 - 80 * 7 * 2 * 4
    assert (d["weight_dtype"], d["kv_dtype"]) == ("fp4", "fp8")
    assert d["kv_bytes_per_token"] == 80 * 2 * 8 * 128 * 1
    assert d["compute_dtype"] == "bf16" and d["peak_flops"] == 2250e12  # no FP4 peak on file


def test_nvfp4_read_from_the_hf_quant_config_json_sidecar(tmp_path: Path) -> None:
    cfg = config("llama-3.3-70b-nvfp4.json")
    quant = cfg.pop("quantization_config")
    quant.pop("quant_method")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(
        {"producer": {"name": "modelopt", "version": "0.23.0"}, "quantization": quant}))
    m = load_config_json(tmp_path)
    assert m.weight_bytes == NVFP4_70B_BYTES and m.kv_dtype == "fp8"


def test_nvfp4_in_modelopts_newer_config_json_form() -> None:
    cfg = config("llama-3.3-70b-nvfp4.json")
    nvfp4 = {"num_bits": 4, "type": "float", "group_size": 16, "dynamic": False}
    cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ["lm_head"],
                                  "config_groups": {"group_0": {"weights": nvfp4, "input_activations": nvfp4}},
                                  "kv_cache_scheme": "FP8", "producer": {"name": "modelopt"}}
    m = from_hf_config(cfg, source="t")
    assert m.weight_bytes == NVFP4_70B_BYTES and m.kv_dtype == "fp8"


LLAMA_8B_LINEAR = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
LLAMA_8B_REST = 2 * 128_256 * 4096 + 32 * 2 * 4096 + 4096


def test_compressed_tensors_fp8_8b() -> None:
    d = plan("--model-config", str(FIX / "llama-3.1-8b-fp8-compressed-tensors.json"))
    assert d["params_total"] == LLAMA_8B_LINEAR + LLAMA_8B_REST == 8_030_261_248
    assert d["weight_bytes"] == LLAMA_8B_LINEAR * 1 + LLAMA_8B_REST * 2 == 9_081_200_640
    assert (d["weight_dtype"], d["kv_dtype"], d["compute_dtype"]) == ("fp8", "bf16", "fp8")
    assert d["peak_flops"] == 1979e12  # W8A8: fp8 GEMMs
    a100 = plan("--model-config", str(FIX / "llama-3.1-8b-fp8-compressed-tensors.json"), "--gpu", "a100")
    assert a100["compute_dtype"] == "bf16" and a100["peak_flops"] == 312e12  # no FP8 tensor cores


def test_the_fp8_id_and_the_fp8_config_agree() -> None:
    by_id = preset_for_hf_id("RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8")
    assert by_id is not None and by_id.weight_bytes == 9_081_200_640 and by_id.compute_dtype == "fp8"


def test_an_unsized_scheme_asks_for_weight_dtype_and_then_takes_it(tmp_path: Path) -> None:
    cfg = config("llama-3.1-8b-fp8-compressed-tensors.json")
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 3
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert "--weight-dtype" in plan_fails("--model-config", str(path))
    d = plan("--model-config", str(path), "--weight-dtype", "int4", "--kv-dtype", "fp8")
    assert d["weight_bytes"] == LLAMA_8B_LINEAR * 0.5 + LLAMA_8B_REST * 2
    assert (d["weight_dtype"], d["kv_dtype"], d["compute_dtype"]) == ("int4", "fp8", "bf16")


def test_compressed_tensors_groups_target_modules_and_ignore_others() -> None:
    w4a16 = {"weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128,
                         "symmetric": True}, "input_activations": None, "targets": ["re:.*mlp\\..*_proj$"]}
    fp8 = {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
           "input_activations": {"num_bits": 8, "type": "float", "strategy": "token"},
           "targets": ["re:.*self_attn\\.(q|k|v|o)_proj$"]}
    q = {"quant_method": "compressed-tensors", "config_groups": {"mlp": w4a16, "attn": fp8},
         "ignore": ["lm_head", "re:model\\.layers\\.0\\..*"], "kv_cache_scheme": {"num_bits": 8, "type": "float"}}
    m = from_hf_config({**config("llama-3-8b.json"), "quantization_config": q}, source="t")
    mlp, attn = 3 * 4096 * 14336, 2 * 4096 * 4096 + 2 * 4096 * 1024
    # layer 0 ignored (bf16); layers 1..31: MLP 4-bit + a 16-bit scale per 128, attention fp8
    expected = (31 * mlp * (0.5 + 2 / 128) + 31 * attn * 1
                + (mlp + attn + LLAMA_8B_REST) * 2)
    assert m.weight_bytes == expected
    assert (m.weight_dtype, m.compute_dtype, m.kv_dtype) == ("int4", "bf16", "fp8")  # most weights: W4A16


def test_meta_405b_fp8_id_maps_to_its_fp8_checkpoint_and_fits_on_8_h100() -> None:
    d = plan("--model", "meta-llama/Llama-3.1-405B-Instruct-FP8", "--tp", "8")
    # Meta's recipe: the MLPs of layers 1..124 in fp8; attention, layers 0 and 125, embeddings,
    # LM head and norms in bf16.
    fp8 = 124 * 3 * 16384 * 53248
    assert d["params_total"] == 405_853_388_800
    assert d["weight_bytes"] == fp8 + (405_853_388_800 - fp8) * 2 == 487_168_311_296
    assert d["weight_bytes_per_gpu"] == 487_168_311_296 / 8
    assert d["fits"] is True and d["kv_bytes_free_per_gpu"] == pytest.approx(H100_FREE - 487_168_311_296 / 8)
    assert (d["weight_dtype"], d["compute_dtype"]) == ("fp8", "fp8")
    bf16 = plan("--model", "meta-llama/Llama-3.1-405B-Instruct", "--tp", "8")
    assert bf16["fits"] is False and bf16["weight_bytes"] == 2 * 405_853_388_800


def test_gptq_8_bit_is_weight_only_and_keeps_the_16_bit_peak() -> None:
    d = plan("--model-config", str(FIX / "qwen2.5-7b-gptq-int8.json"))
    linear = 28 * (2 * 3584 * 3584 + 2 * 3584 * 512 + 3 * 3584 * 18944)
    rest = 2 * 152_064 * 3584 + 28 * 2 * 3584 + 3584 + 28 * (3584 + 2 * 512)  # + q/k/v biases
    assert d["params_total"] == linear + rest == 7_615_616_512  # Qwen2.5-7B's published count
    # int8 weights, a 16-bit scale and an 8-bit zero point per group of 128; the rest in fp16
    assert d["weight_bytes"] == linear * (1 + 3 / 128) + rest * 2 == 8_858_881_024
    assert (d["weight_dtype"], d["compute_dtype"], d["kv_dtype"]) == ("int8", "fp16", "fp16")
    assert d["peak_flops"] == 989e12  # dequantized into fp16 GEMMs, not the 1,979 TOPS int8 peak
    assert d["windowed_layers"] == 0  # use_sliding_window: false
    assert d["kv_bytes_per_token"] == 28 * 2 * 4 * 128 * 2


def test_quantized_ids_carry_their_format() -> None:
    nvfp4 = preset_for_hf_id("nvidia/Llama-3.3-70B-Instruct-FP4")
    assert nvfp4 is not None and nvfp4.weight_bytes == NVFP4_70B_BYTES
    awq = preset_for_hf_id("Qwen/Qwen3-8B-AWQ")
    assert awq is not None and (awq.weight_dtype, awq.compute_dtype) == ("int4", "bf16")
    assert any("-awq" in note for note in awq.notes)


@pytest.mark.parametrize("q,dtype,gemm", [
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "fp8", "fp8"),
    ({"quant_method": "fbgemm_fp8", "modules_to_not_convert": ["lm_head"]}, "fp8", "fp8"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "int4", "bf16"),
    ({"quant_method": "bitsandbytes", "load_in_8bit": True}, "int8", "bf16"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128}, "int4", "bf16"),
    ({"quant_method": "mxfp4"}, "fp4", "bf16"),
    ({"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}, "fp8", "fp8"),
])
def test_each_method_names_its_weight_and_gemm_dtypes(q: dict, dtype: str, gemm: str) -> None:
    m = from_hf_config({**config("llama-3-8b.json"), "quantization_config": q}, source="t")
    assert (m.weight_dtype, m.compute_dtype) == (dtype, gemm)
    assert m.weight_bytes > LLAMA_8B_LINEAR * dtype_bytes_of(dtype)  # scales and 16-bit rest counted


def dtype_bytes_of(dtype: str) -> float:
    return {"fp8": 1.0, "int8": 1.0, "int4": 0.5, "fp4": 0.5}[dtype]


# --- prefill: compute or weight streaming ---------------------------------------------------------

def test_deepseek_v3_2048_token_prefill_is_memory_bound() -> None:
    d = plan("--model", "deepseek-v3", "--gpu", "h200", "--tp", "8", "--prompt-tokens", "2048")
    assert d["prefill_memory_bound"] is True and d["prefill_crossover_tokens"] > 2048
    assert d["prefill_weight_seconds"] > d["prefill_compute_seconds_at_roof"]
    assert d["prefill_seconds_at_roof"] == d["prefill_weight_seconds"]
    # At the crossover, compute at peak equals reading the weights that many tokens touch: 2 x the parameters
    # a prompt token multiplies (not the input table, not the LM head) + its causal attention (MLA, unabsorbed:
    # 128 heads x (192 + 128) dims, 61 layers), the LM head once; the bytes: every weight but the input table,
    # of which a row a token, the routed experts the t tokens touch.
    m = preset("deepseek-v3")
    t = d["prefill_crossover_tokens"]
    h, table = 7168, 129_280 * 7168
    flops = 2 * (m.params_active - 2 * table) * t + 61 * 2 * 128 * (192 + 128) * t * (t + 1) / 2 + 2 * table
    experts = m.expert_weight_bytes
    weights = m.weight_bytes - 2 * table + min(2 * h * t, 2 * table) - experts + experts * (1 - (1 - 8 / 256) ** t)
    assert flops / d["peak_flops"] == pytest.approx(weights / d["peak_bandwidth_bytes_per_second"], rel=1e-5)
    assert round(t, -1) == 3460  # 3,690 with every weight read and no attention
    text = format_plan(build_plan(m, get_profile("h200"), tp=8, context_tokens=8000, batch=1, prompt_tokens=2048))
    assert "memory-bound" in text and "-token crossover" in text


def test_dense_16_bit_crossover_is_the_ridge() -> None:
    d = plan()
    # W = 2P: the ridge, less what the causal attention adds to each prompt token (32 x 16,384 x (T + 1) / 2
    # FLOPs against 2 x 8e9): T = 16e9 x 989e12 / (3.35e12 x (16e9 + 262,144 x (T + 1))) = 293.8
    t = d["prefill_crossover_tokens"]
    assert t == pytest.approx(16e9 * 989e12 / (3.35e12 * (16e9 + 32 * 16_384 * (t + 1) / 2)), rel=1e-6)
    assert round(t, 1) == 293.8 and round(d["ridge_point"], 1) == 295.2
    assert d["prefill_memory_bound"] is False
    attention = 32 * 16_384 * 2048 * 2049 / 2  # 1.10 TFLOP the round numbers leave out
    assert d["prefill_seconds"] == pytest.approx((2 * 8e9 * 2048 + attention) / (989e12 * 0.5))  # compute dominates
