"""Parts of the step model worked by hand: a layer-token's KV bytes at every TP (what a step reads, summed over
the copy's GPUs, and what one GPU holds) and a step's roofline time (docs/physics.md, the step model)."""

from __future__ import annotations

import pytest

from rooflight.agent.model_files import load_config_json
from rooflight.agent.roofline.models import preset
from rooflight.agent.roofline.step import Layout, Roofs, StepCost
from support import MODEL_CONFIGS


@pytest.mark.parametrize(("tp", "summed"), [
    (1, 4096), (2, 4096), (8, 4096),  # Llama-3-70B: 8 KV heads of 128, bf16: 2 x 8 x 128 x 2 B a layer-token,
    (16, 8192),                        # sharded by head up to TP 8; at TP 16 each head is held twice
])
def test_a_layer_tokens_kv_bytes_summed_over_the_copys_gpus_at_tp(tp: int, summed: int) -> None:
    layout = Layout(preset("llama-3-70b"), tp=tp)
    assert layout.kv_layer_token_bytes == summed
    # what a step reads for 1,000 layer-tokens, and one GPU's share of a 1,000-token sequence (80 layers)
    assert layout.kv_bytes(1000) == 1000 * summed
    assert layout.sequence_kv_bytes_per_gpu(1000) == 1000 * 80 * summed / tp


def test_mlas_latent_is_read_on_every_gpu_of_the_copy() -> None:
    # DeepSeek-V3: one latent of 512 + 64 rope dims, bf16, a layer-token: 1,152 B, held whole on each of the
    # 8 GPUs of a TP 8 copy, so a step over 1,000 layer-tokens reads 8 x 1,152,000 B in all
    layout = Layout(load_config_json(MODEL_CONFIGS / "deepseek-v3-mla.json"), tp=8)
    assert layout.kv_layer_token_bytes == 8 * 1152
    assert layout.kv_bytes(1000) == 8 * 1_152_000


def test_a_step_that_decodes_runs_its_prefill_after_the_longer_of_its_reads_and_its_decode() -> None:
    # 16 GB read (16 ms at 1 TB/s), 1 TFLOP of decode (1 ms at 1 PFLOP/s), 100 TFLOP of prefill (100 ms): the
    # decode's GEMMs hide under the reads, the prefill's run on the same SMs after them: 116 ms, not 100
    step = StepCost(weight_bytes=16e9, kv_bytes=0.0, prefill_flops=100e12, decode_flops=1e12)
    assert step.seconds(Roofs(1e15, 1e12)) == pytest.approx(0.116)
    # a prefill alone: the longer of its reads and its FLOPs
    alone = StepCost(weight_bytes=16e9, kv_bytes=0.0, prefill_flops=100e12, decode_flops=0.0)
    assert alone.seconds(Roofs(1e15, 1e12)) == pytest.approx(0.100)
