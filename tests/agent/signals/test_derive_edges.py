"""Live ratios at edges of the derive step nothing else guards: one 10 s window
between two samples whose counters are known, each expectation worked by hand in the comments
(docs/physics.md, section Live ratios). H100 SXM: 3.35e12 B/s."""

from __future__ import annotations

import pytest

from rooflight.agent.roofline.constants import TargetConstants
from rooflight.agent.model_files import load_config_json
from support import MODEL_CONFIGS
from test_derive_served import BW, H100, PEAK, _constants, _series, _window


def test_moe_coverage_counts_the_computed_prompt_tokens_not_the_prefix_cache_hits() -> None:
    # An older vLLM whose prompt counter counts hits: 400 prompt tokens in 10 s, 300 of them prefix-cache
    # hits (hits / queries = 0.75), so 100 were computed; 100 steps, each with one decode token. A step ran
    # (100 + 100) / 100 = 2 tokens through Mixtral's experts (a hit runs through none): 1 - 0.75^2 = 43.75%
    # of 90,194,313,216 expert bytes = 39,460,012,032, plus 3,211,272,192 - 262,144,000 (the table) + 2 rows
    # of 8,192 = 42,409,156,608 B a step; 10 steps/s: MBU = 42,409,156,608 x 10 / 3.35e12 = 0.1266.
    # Counting the hits (5 tokens a step) would read 76% of the experts: MBU 0.205.
    start = _series(running=1.0, prompt_tokens_include_cache_hits=True, prefix_cache_queries_total=0.0,
                    prefix_cache_hits_total=0.0)
    end = _series(running=1.0, prompt_tokens_total=400.0, generation_tokens_total=100.0, steps_total=100.0,
                  prompt_tokens_include_cache_hits=True, prefix_cache_queries_total=400.0,
                  prefix_cache_hits_total=300.0)
    w = _window(start, end, _constants("mixtral-8x7b"))
    assert w.tokens_per_step == pytest.approx(2.0)
    assert w.mbu == pytest.approx(42_409_156_608 * 10 / BW)
    assert round(w.mbu, 4) == 0.1266


@pytest.mark.parametrize(("tp", "ep", "copies"), [(2, 8, 4.0), (8, 8, 1.0), (4, 2, 1.0), (1, 1, 1.0)])
def test_expert_ranks_are_the_model_copies_that_share_one_set_of_experts(tp: int, ep: int, copies: float) -> None:
    # EP 8 over copies of TP 2: the routed experts are spread over 8 GPUs, each copy spans 2 of them, so
    # 8 / 2 = 4 copies share one set (each holds a quarter). EP 8 at TP 8 is one copy holding them all; an
    # EP smaller than TP still leaves every copy all of them (at least 1).
    c = _constants("deepseek-v3", tensor_parallel_size=tp, expert_parallel_size=ep)
    assert c.layout.expert_ranks == copies


def test_decode_attention_under_vllms_hybrid_pool_counts_the_layers_a_pool_token_holds() -> None:
    # Gemma-2-9B under vLLM's hybrid pool: a pool token holds one group of 21 layers (not 42). 10 running
    # sequences hold half of 100,000 pool tokens: 5,000 each x 21 layers = 105,000 layer-tokens a decode
    # token attends to, at 2 x 16 heads x (256 + 256) = 16,384 FLOPs a pair. 1,000 decode tokens/s:
    # 1,000 x 16,384 x 105,000 / 989e12 = 0.001739 of decode MFU from attention (the same window with an
    # empty cache has none; all 42 layers would read 0.003479).
    gemma = load_config_json(MODEL_CONFIGS / "gemma-2-9b.json")
    c = TargetConstants(model=gemma, gpu=H100, gpu_source="flag", kv_pool_grouped=True)

    def decode_mfu(usage: float) -> float:
        start = _series(running=10.0, kv_usage_ratio=usage)
        end = _series(running=10.0, kv_usage_ratio=usage, generation_tokens_total=10_000.0, steps_total=1000.0)
        return _window(start, end, c).mfu["decode"]

    assert decode_mfu(0.5) - decode_mfu(0.0) == pytest.approx(1000 * 16_384 * 105_000 / PEAK)


def test_a_counter_hit_ratio_over_one_is_no_ratio_and_takes_no_prompt_tokens_away() -> None:
    # An engine whose hit counter ran ahead of its lookups (500 hits of 400 looked up in 10 s: a lie or a
    # counter reset between the two reads) tells nothing of its hit ratio: the window has none, and its 400
    # prompt tokens stay as counted, said so ("includes_cache_hits"); a ratio of 1.25 would take away more
    # than every prompt token (-100 computed) and read a negative prefill.
    start = _series(running=1.0, prompt_tokens_include_cache_hits=True, prefix_cache_queries_total=0.0,
                    prefix_cache_hits_total=0.0)
    end = _series(running=1.0, prompt_tokens_total=400.0, generation_tokens_total=100.0, steps_total=100.0,
                  prompt_tokens_include_cache_hits=True, prefix_cache_queries_total=400.0,
                  prefix_cache_hits_total=500.0)
    w = _window(start, end, _constants("llama-3-8b"))
    assert w.prefix_cache_hit_ratio is None
    assert w.prefill_tokens_basis == "includes_cache_hits"
    assert w.mfu["prefill"] > 0
