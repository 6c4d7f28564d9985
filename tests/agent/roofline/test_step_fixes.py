"""`rooflight plan` on the step model, worked by hand from the published config.json and datasheet figures
(docs/physics.md, sections The step model and Plan ceilings): causal attention in a prefill, the compute roof
at batch, the input embeddings a row a token, Llama 4's layers, TP links per GPU, the MI355X."""

from __future__ import annotations

import pytest

from rooflight.agent.model_files import load_config_json
from rooflight.agent.roofline.gpus import get_profile
from rooflight.agent.roofline.models import preset
from rooflight.agent.roofline.plan import build_plan
from support import MODEL_CONFIGS

ZOO = MODEL_CONFIGS / "zoo"
H100, H200 = get_profile("h100-sxm"), get_profile("h200")
LLAMA_3_8B = {"params": 8_030_261_248, "table": 128_256 * 4096, "layers": 32, "pair": 2 * 32 * (128 + 128)}


def test_a_131k_token_prefill_counts_its_causal_attention() -> None:
    # Llama-3.1-8B (config.json: Llama-3-8B's shapes, 32 layers, 32 heads of 128, vocab 128,256, untied, and
    # 131,072 positions where Llama-3-8B reads 8,192), 131,072 tokens on an H100.
    # The weights' matmuls: 2 x (8,030,261,248 - 2 x 525,336,576) = 2 x 6,979,588,096 FLOPs a token (not the
    # input table, a lookup; not the LM head, which runs once); the causal attention: 32 layers x 16,384 FLOPs
    # a token pair x 131,072 x 131,073 / 2 pairs = 4,503.6 TFLOP; the LM head once, 2 x 525,336,576.
    # 6,333 TFLOP, 3.0x the 2,105 the plan printed (2 x 8.03e9 x 131,072, no attention).
    p = build_plan(load_config_json(ZOO / "Meta-Llama-3.1-8B.json"), H100, tp=1, context_tokens=131_072, batch=1,
                   prompt_tokens=131_072)
    table = LLAMA_3_8B["table"]
    attention = 32 * 16_384 * 131_072 * 131_073 / 2
    assert p.prefill_attention_flops == attention
    assert p.prefill_flops == pytest.approx(2 * (8_030_261_248 - 2 * table) * 131_072 + attention + 2 * table)
    assert round(p.prefill_flops / 1e12) == 6_333
    assert round(p.prefill_flops / (2 * 8_030_261_248 * 131_072), 1) == 3.0
    assert p.prefill_seconds == pytest.approx(p.prefill_flops / (989e12 * 0.5))


def test_decode_at_a_big_batch_meets_the_compute_roof() -> None:
    # ref-8b, 1,024 sequences of 100 tokens on an H100: reading (16e9 + 1,024 x 100 x 131,072) / 3.35e12 =
    # 8.78 ms would give 116,600 tok/s, but the step's FLOPs, 1,024 x (2 x 8e9 + 32 x 16,384 x 100 of
    # attention), take 16.6 ms at 989 TFLOP/s: 61,600 tok/s, on the compute roof (116,600 was 1.9x over it)
    p = build_plan(preset("ref-8b"), H100, tp=1, context_tokens=100, batch=1024, prompt_tokens=1)
    memory = (16e9 + 1024 * 100 * 131_072) / 3.35e12
    compute = 1024 * (2 * 8e9 + 32 * 16_384 * 100) / 989e12
    assert round(1024 / memory, -2) == 116_600
    assert p.decode_step_seconds_at_batch == pytest.approx(compute)
    assert round(p.decode_tokens_per_second_at_batch, -2) == 61_600
    assert p.decode_attainable_fraction_of_peak == pytest.approx(1.0)


def test_llama_3_8b_reads_its_input_embeddings_a_row_a_token() -> None:
    # batch 1: (16,060,522,496 - 1,050,673,152 + 8,192) / 3.35e12 = 4.48 ms, 223 tok/s (every weight: 209),
    # the ceiling the live MBU's bytes give
    p = build_plan(preset("llama-3-8b"), H100, tp=1, context_tokens=8000, batch=1, prompt_tokens=1)
    assert p.decode_step_seconds_weights_only == pytest.approx((16_060_522_496 - 1_050_673_152 + 8192) / 3.35e12)
    assert round(p.decode_tokens_per_second_weights_only) == 223


# --- Llama 4 ---

def test_llama_4_maverick_interleaves_moe_layers_with_a_shared_expert() -> None:
    # config.json (text_config): 48 layers of hidden 5,120, 40 heads of 128, 8 KV heads, vocab 202,048 (untied);
    # interleave_moe_layer_step 2: the odd layers (1, 3, ..., 47) are MoE: 128 routed experts of
    # intermediate_size 8,192, top-1, a shared expert of 8,192, a router; the even layers a dense MLP of
    # intermediate_size_mlp 16,384.
    m = load_config_json(ZOO / "Llama-4-Maverick-17B-128E-Instruct.json")
    h, attention = 5120, 48 * 5120 * (5120 + 2 * 1024 + 5120)
    experts = 24 * 128 * 3 * h * 8192
    shared = 24 * 3 * h * 8192
    dense = 24 * 3 * h * 16_384
    routers, norms = 24 * h * 128, 48 * 2 * h + h
    tables = 2 * 202_048 * h
    assert m.params_total == attention + experts + shared + dense + routers + norms + tables
    assert m.params_total == 400_711_848_960  # Meta's "400B" (it was read as 778B)
    active = attention + 24 * 3 * h * 8192 + shared + dense + routers + norms + tables
    assert m.params_active == active and round(active / 1e9, 1) == 17.2  # Meta's "17B" (it was read as 11.1B)
    assert m.expert_params == experts


def test_llama_4_chunked_attention_layers_from_no_rope_layers() -> None:
    # The config's no_rope_layers marks every 4th layer NoPE (0), global; the RoPE layers (1) attend within
    # chunks of attention_chunk_size 8,192. The aiconfigurator copy carries neither list: Llama4TextConfig's
    # default, a NoPE layer every no_rope_layer_interval = 4, gives the same 12 global + 36 chunked.
    listed = {"model_type": "llama4_text", "num_hidden_layers": 8, "hidden_size": 64, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 32, "intermediate_size_mlp": 64,
              "vocab_size": 100, "num_local_experts": 2, "num_experts_per_tok": 1, "attention_chunk_size": 8192,
              "no_rope_layers": [1, 1, 1, 0, 1, 1, 1, 0]}
    from rooflight.agent.roofline.models import from_hf_config

    assert from_hf_config(listed, source="t").window_layers == ((8192, 6),)
    m = load_config_json(ZOO / "Llama-4-Maverick-17B-128E-Instruct.json")
    assert m.window_layers == ((8192, 36),) and m.full_attention_layers == 12
    # a 1M-token sequence: 12 layers keep all of it, 36 their last chunk: (12 x 1,048,576 + 36 x 8,192) x
    # 2 x 8 x 128 x 2 B = 52.7 GB, not 206 GB
    p = build_plan(m, H200, tp=8, context_tokens=1_048_576, batch=1, prompt_tokens=1)
    assert p.kv_bytes_per_sequence == (12 * 1_048_576 + 36 * 8192) * 4096


def test_llama_4_maverick_fits_on_8_h200() -> None:
    # bf16: 2 x 400,711,848,960 = 801.4 GB, 100.2 GB per GPU of 8 beside 141 GB: 36.8 GB a GPU for the cache
    # after 4 GB reserved. Read as 778B it needed 194 GB a GPU and "did not fit".
    p = build_plan(load_config_json(ZOO / "Llama-4-Maverick-17B-128E-Instruct.json"), H200, tp=8,
                   context_tokens=131_072, batch=1, prompt_tokens=1)
    assert p.fits and p.weight_bytes_per_gpu == pytest.approx(2 * 400_711_848_960 / 8)
    assert round(p.kv_bytes_free_per_gpu / 1e9, 1) == 36.8
    # 131,072 tokens: (12 x 131,072 + 36 x 8,192) x 4,096 B / 8 GPUs = 956 MB a GPU: 38 sequences
    assert p.max_concurrent_sequences == (141e9 - 2 * 400_711_848_960 / 8 - 4e9) // ((12 * 131_072 + 36 * 8192) * 512)


def test_llama_4_scout_every_layer_moe() -> None:
    m = load_config_json(ZOO / "Llama-4-Scout-17B-16E-Instruct.json")
    h = 5120
    assert m.expert_params == 48 * 16 * 3 * h * 8192  # interleave_moe_layer_step 1: every layer
    assert round(m.params_total / 1e9, 2) == 107.77 and round(m.params_active / 1e9, 2) == 17.17


# --- TP links and profiles ---

@pytest.mark.parametrize("gpu,tp,per_reduce_us", [
    ("h100-sxm", 4, 5 + 1.5 * 2_097_152 / 450e9 * 1e6),  # NVLink 4: 900 GB/s a GPU, 450 each way
    ("b200", 4, 5 + 1.5 * 2_097_152 / 900e9 * 1e6),  # NVLink 5: 1.8 TB/s a GPU
    ("mi300x", 4, 5 + 1.5 * 2_097_152 / (3 * 64e9) * 1e6),  # Infinity Fabric: 3 of its 7 128 GB/s links
    ("mi300x", 8, 5 + 1.75 * 2_097_152 / (7 * 64e9) * 1e6),  # all 7
    ("mi355x", 8, 5 + 1.75 * 2_097_152 / (7 * 76.8e9) * 1e6),  # 153.6 GB/s links
])
def test_tp_all_reduces_run_over_each_gpus_link(gpu: str, tp: int, per_reduce_us: float) -> None:
    # Llama-3-70B at batch 128: 128 x 8,192 x 2 B = 2.10 MB of activations, 2 all-reduces a layer x 80 layers
    p = build_plan(preset("llama-3-70b"), get_profile(gpu), tp=tp, context_tokens=1000, batch=128, prompt_tokens=1)
    assert p.tp_allreduce_seconds_at_batch == pytest.approx(160 * per_reduce_us * 1e-6)


def test_the_links_differ_as_the_datasheets_say() -> None:
    at = {gpu: build_plan(preset("llama-3-70b"), get_profile(gpu), tp=4, context_tokens=1000, batch=128,
                          prompt_tokens=1).tp_allreduce_seconds_at_batch for gpu in ("h100-sxm", "b200", "mi300x")}
    assert round(at["h100-sxm"] * 1e3, 2) == 1.92
    assert round(at["b200"] / at["h100-sxm"] - 1, 2) == -0.29
    assert round(at["mi300x"] / at["h100-sxm"] - 1, 2) == 0.78


def test_mi355x_profile() -> None:
    # AMD MI355X: 256 CUs at 2.4 GHz, 4,096 16-bit and 8,192 FP8 FLOP a CU and clock: 2,516.6 and 5,033.2
    # TFLOP/s dense; 288 GB of HBM3E at 8 TB/s: ridge 315
    g = get_profile("mi355x")
    assert g.peak_flops["bf16"] == pytest.approx(256 * 2.4e9 * 4096, rel=1e-4)
    assert g.peak_flops["fp8"] == pytest.approx(256 * 2.4e9 * 8192, rel=1e-4)
    assert (g.memory_bandwidth_bytes_per_second, g.memory_bytes) == (8e12, 288e9)
    assert round(g.ridge_point) == 315
    # DeepSeek-V3 (fp8) on 8 x MI355X: 673 GB of weights, 84 GB a GPU
    p = build_plan(preset("deepseek-v3"), g, tp=8, context_tokens=8000, batch=1, prompt_tokens=1)
    assert p.fits and p.compute_dtype == "fp8"
