"""Live MBU, MFU and KV bytes for the cases people serve: one 10 s window between
two samples whose counters are known, so each ratio is computed by hand in the comments (docs/physics.md,
section Live ratios). H100 SXM: 3.35e12 B/s, 989e12 dense bf16 FLOP/s."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rooflight.agent.roofline.constants import TargetConstants
from rooflight.agent.roofline.gpus import get_profile
from rooflight.agent.model_files import load_config_json
from rooflight.agent.roofline.models import preset
from rooflight.agent.signals import derive
from rooflight.agent.signals.windows import SeriesHistory
from rooflight.collectors.samples import EngineSeries, Histogram
from support import MODEL_CONFIGS

H100 = get_profile("h100-sxm")
BW, PEAK = 3.35e12, 989e12


def _constants(model: str, **kw: object) -> TargetConstants:
    return TargetConstants(model=preset(model), gpu=H100, gpu_source="flag", **kw)  # type: ignore[arg-type]


def _window(start: EngineSeries, end: EngineSeries, constants: TargetConstants,
            capacity: float | None = 100_000.0) -> derive.WindowValues:
    history = SeriesHistory(60.0)
    history.append(0.0, *derive.history_inputs(start))
    history.append(10.0, *derive.history_inputs(end))
    values = derive.derive_window(history, "10s", 10.0, constants, capacity, ("50",))
    assert values is not None
    return values


def _series(**kw: object) -> EngineSeries:
    base: dict[str, object] = {"model": "m", "running": 0.0, "kv_usage_ratio": 0.0, "kv_capacity_tokens": 100_000.0,
                               "prompt_tokens_total": 0.0, "generation_tokens_total": 0.0, "steps_total": 0.0}
    return EngineSeries(**{**base, **kw})  # type: ignore[arg-type]


def _prompts(count: float, total: float) -> Histogram:
    return Histogram(buckets=((float("inf"), count),), count=count, sum=total)


# --- MoE coverage from the tokens of the steps that ran ---

def test_mixtral_at_low_load_reads_the_active_experts_every_step() -> None:
    c = _constants("mixtral-8x7b")
    # 100 steps of one decode token in 10 s while the mean running count is 0.3 (idle 70% of the time):
    # each step reads 2 of 8 experts: 3,211,272,192 - 262,144,000 (the table) + 8,192 + 90,194,313,216 / 4
    # = 25,497,714,688 B; MBU = 25,497,714,688 x 10 / 3.35e12 = 0.0761 (the mean of 0.3 read 10.7 GB: 0.0320)
    w = _window(_series(running=0.3), _series(generation_tokens_total=100.0, steps_total=100.0), c)
    assert w.tokens_per_step == 1.0
    assert w.mbu == pytest.approx(25_497_714_688 * 10 / BW)
    assert round(w.mbu, 4) == 0.0761


def test_a_prefill_chunk_in_the_step_counts_its_tokens() -> None:
    c = _constants("mixtral-8x7b")
    # 10 steps, each a 51-token prefill chunk beside one decoding sequence (vLLM's iteration_tokens sum: 520):
    # 52 tokens a step touch 1 - 0.75^52 = 99.9997% of the experts: 93.1 GB a step, not the 25.5 GB of one
    m = c.model
    assert m is not None
    start = _series(running=1.0, extra={"iteration_tokens_sum": 0.0})
    end = _series(prompt_tokens_total=510.0, generation_tokens_total=10.0, steps_total=10.0,
                  extra={"iteration_tokens_sum": 520.0})
    w = _window(start, end, c)
    assert w.tokens_per_step == 52.0
    assert w.mbu == pytest.approx(m.decode_weight_bytes(52) * 1.0 / BW)
    assert round(m.decode_weight_bytes(52) / 1e9, 1) == 93.1


# --- the input embedding table is neither streamed nor multiplied ---

def test_llama_3_8b_prefill_mfu_multiplies_7_0b_weights_a_prompt_token_not_8_03b() -> None:
    # 200,000 prompt tokens of 100 requests (their first tokens: TTFT observations) in 10 s. A prompt token
    # multiplies 8,030,261,248 - 525,336,576 (the input table, a lookup) - 525,336,576 (the LM head, run for a
    # prefill's last position only) = 6,979,588,096 weights; the LM head once a prefill:
    # (20,000 x 2 x 6,979,588,096 + 10 x 2 x 525,336,576) / 989e12 = 0.2823 (0.3248 counting both per token)
    first_tokens = Histogram(buckets=((float("inf"), 100.0),), count=100.0, sum=10.0)
    start = _series(ttft=Histogram(buckets=((float("inf"), 0.0),), count=0.0, sum=0.0))
    end = _series(prompt_tokens_total=200_000.0, steps_total=100.0, ttft=first_tokens)
    w = _window(start, end, _constants("llama-3-8b"))
    assert w.mfu["prefill"] == pytest.approx((20_000 * 2 * 6_979_588_096 + 10 * 2 * 525_336_576) / PEAK)
    assert round(w.mfu["prefill"], 4) == 0.2823
    # the reference 8B of the design documents still gives their 0.324
    ref = _window(_series(), _series(prompt_tokens_total=200_000.0, steps_total=100.0), _constants("ref-8b"))
    assert round(ref.mfu["prefill"], 3) == 0.324


def test_llama_3_8b_decode_mbu_streams_a_row_a_token_of_the_table() -> None:
    # batch 1 at 146 steps/s: (16,060,522,496 - 1,050,673,152 + 8,192) x 146 / 3.35e12 = 0.654 (0.700 before)
    w = _window(_series(running=1.0), _series(running=1.0, generation_tokens_total=1460.0, steps_total=1460.0),
                _constants("llama-3-8b"))
    assert w.mbu == pytest.approx(15_009_857_536 * 146 / BW)
    assert round(w.mbu, 3) == 0.654


# --- attention FLOPs ---

def test_prefill_mfu_counts_the_attention_of_8k_prompts() -> None:
    # 20,000 prompt tok/s of 8,192-token prompts: attention 32 layers x 16,384 x 8,193 / 2 = 2.1477e9 FLOPs a
    # token beside 2 x 6,979,588,096, and the LM head for 1 prefill a second (10 prompts finished in 10 s):
    # MFU = (20,000 x (13,959,176,192 + 2,147,745,792) + 2 x 525,336,576) / 989e12 = 0.3257
    start = _series(prompt_length=_prompts(0, 0))
    end = _series(prompt_tokens_total=200_000.0, steps_total=100.0, prompt_length=_prompts(10, 81_920))
    w = _window(start, end, _constants("llama-3-8b"))
    attention = 32 * 16_384 * 8193 / 2
    assert w.mfu["prefill"] == pytest.approx((20_000 * (2 * 6_979_588_096 + attention) + 2 * 525_336_576) / PEAK)
    assert round(w.mfu["prefill"], 4) == 0.3257


def test_cached_prefix_is_attended_to_not_recomputed() -> None:
    # half of each 8,192-token prompt found in the prefix cache (vLLM's by-source counter: 10,000 tok/s
    # computed): the computed tokens at positions 4,096..8,191 attend to 6,144.5 tokens on average:
    # 32 x 16,384 x 6,144.5 = 3.2215e9 FLOPs a token
    start = _series(prompt_length=_prompts(0, 0), prefix_cache_queries_total=0.0, prefix_cache_hits_total=0.0)
    end = _series(prompt_tokens_total=100_000.0, steps_total=100.0, prompt_length=_prompts(10, 81_920),
                  prefix_cache_queries_total=81_920.0, prefix_cache_hits_total=40_960.0)
    w = _window(start, end, _constants("llama-3-8b"))
    assert w.prefill_tokens_basis == "computed"
    assert w.mfu["prefill"] == pytest.approx(
        (10_000 * (2 * 6_979_588_096 + 32 * 16_384 * 6144.5) + 2 * 525_336_576) / PEAK)


def test_decode_mfu_counts_attention_over_each_sequences_cache() -> None:
    # 10 running sequences holding half of 100,000 tokens: 5,000 tokens each over 32 layers, so a decode
    # token attends to 160,000 layer-tokens: 16,384 x 160,000 = 2.62e9 FLOPs beside 2 x 7.5e9
    start = _series(running=10.0, kv_usage_ratio=0.5)
    end = _series(running=10.0, kv_usage_ratio=0.5, generation_tokens_total=10_000.0, steps_total=1000.0)
    w = _window(start, end, _constants("llama-3-8b"))
    assert w.mfu["decode"] == pytest.approx(1000 * (2 * 7_504_924_672 + 16_384 * 160_000) / PEAK)


# --- prefix-cache hits counted as prompt tokens ---

def test_hits_are_taken_out_of_a_prompt_counter_that_counts_them() -> None:
    # an older vLLM: prompt_tokens_total counts all 200,000 prompt tokens, 75% of them prefix-cache hits
    # (prefix_cache_hits / queries): 5,000 tok/s computed, MFU = 5,000 x 2 x 6,979,588,096 / 989e12 = 0.0706
    # (0.2823 counted as work: 4x)
    start = _series(prompt_tokens_include_cache_hits=True, prefix_cache_queries_total=0.0, prefix_cache_hits_total=0.0)
    end = _series(prompt_tokens_total=200_000.0, steps_total=100.0, prompt_tokens_include_cache_hits=True,
                  prefix_cache_queries_total=200_000.0, prefix_cache_hits_total=150_000.0)
    w = _window(start, end, _constants("llama-3-8b"))
    assert w.prefill_tokens_basis == "hits_subtracted"
    assert w.tokens_per_second["prefill"] == 20_000  # the engine's counter, as exported
    assert w.mfu["prefill"] == pytest.approx(5_000 * 2 * 6_979_588_096 / PEAK)


def test_a_prompt_counter_with_hits_and_nothing_to_tell_them_is_marked() -> None:
    # TGI: no prefix-cache accounting; the number stays as counted and says it may count hits as work
    start = _series(prompt_tokens_include_cache_hits=True)
    end = _series(prompt_tokens_total=200_000.0, steps_total=100.0, prompt_tokens_include_cache_hits=True)
    w = _window(start, end, _constants("llama-3-8b"))
    assert w.prefill_tokens_basis == "includes_cache_hits"
    assert w.mfu["prefill"] == pytest.approx(20_000 * 2 * 6_979_588_096 / PEAK)
    plain = _window(_series(), _series(prompt_tokens_total=200_000.0, steps_total=100.0), _constants("llama-3-8b"))
    assert plain.prefill_tokens_basis == "computed"


# --- vLLM's hybrid KV pool ---

def test_gemma_2_live_kv_under_vllms_hybrid_pool_is_half_the_all_layer_count() -> None:
    gemma = load_config_json(MODEL_CONFIGS / "gemma-2-9b.json")
    # K+V per layer and token 2 x 8 x 256 x 2 = 8,192 B; a pool token holds one group of 21 layers:
    # 0.5 x 100,000 x 21 x 8,192 = 8.6016e9 B (all 42 layers: 17.2e9, 2x)
    grouped = TargetConstants(model=gemma, gpu=H100, gpu_source="flag", kv_pool_grouped=True)
    assert derive.live_kv_bytes(0.5, 100_000, grouped) == 0.5 * 100_000 * 21 * 8192
    assert derive.live_kv_bytes(0.5, 100_000, replace(grouped, kv_pool_grouped=False)) == 0.5 * 100_000 * 42 * 8192


def test_gemma_3_live_kv_is_6_2x_lower_grouped() -> None:
    g3 = load_config_json(MODEL_CONFIGS / "gemma-3-27b-it.json")
    # 62 layers, 52 sliding + 10 full: a pool token holds 10 layers x 2 x 16 x 128 x 2 = 81,920 B
    grouped = TargetConstants(model=g3, gpu=H100, gpu_source="flag", kv_pool_grouped=True)
    assert derive.live_kv_bytes(1.0, 1000, grouped) == 1000 * 10 * 8192
    assert derive.live_kv_bytes(1.0, 1000, replace(grouped, kv_pool_grouped=False)) / (1000 * 10 * 8192) == 6.2


# --- a speculative-decoding draft model ---

def test_draft_model_bytes_join_mbu_k_times_a_step() -> None:
    # Llama-3-70B at TP 4 with a Llama-3.2-1B draft proposing k = 4 tokens (400 draft tokens in 100
    # proposals); 100 steps in 10 s of 8 sequences (iteration tokens 8 x 5 = 40 a step with the verify):
    # weights 141,107,412,992 - 2,101,346,304 (the 128,256 x 8,192 bf16 table) + 40 x 16,384 (its rows)
    # = 139,006,722,048 B; (139,006,722,048 + 4 x 2,471,628,800) x 10 / (3.35e12 x 4) = 0.1111 (0.1037 without)
    c = replace(_constants("llama-3-70b", tensor_parallel_size=4), draft=preset("llama-3.2-1b"))
    start = _series(running=8.0, extra={"iteration_tokens_sum": 0.0, "spec_decode_num_drafts_total": 0.0,
                                        "spec_decode_num_draft_tokens_total": 0.0})
    end = _series(running=8.0, generation_tokens_total=1800.0, steps_total=100.0,
                  extra={"iteration_tokens_sum": 4000.0, "spec_decode_num_drafts_total": 100.0,
                         "spec_decode_num_draft_tokens_total": 400.0})
    w = _window(start, end, c)
    target = 141_107_412_992 - 2_101_346_304 + 40 * 8192 * 2
    assert w.mbu == pytest.approx((target + 4 * 2_471_628_800) * 10 / (BW * 4))
    assert round(w.mbu, 4) == 0.1111
    without = _window(start, end, replace(c, draft=None))
    assert without.mbu == pytest.approx(target * 10 / (BW * 4))


# --- expert parallelism ---

def test_deepseek_v3_dp8_ep8_rank_mbu_counts_its_share_of_the_experts() -> None:
    # one DP rank (TP 1) of DP8/EP8 runs 32 tokens a step, 100 steps in 10 s: its GPU reads
    # 17,225,529,344 + 653,908,770,816 / 8 x (1 - (31/32)^256) = 98.94e9 B a step; MBU = 98.94e9 x 10 / 3.35e12
    # = 0.295 (1.30 read as a copy holding every expert: past MAX_UTILIZATION, dropped)
    c = _constants("deepseek-v3", expert_parallel_size=8)
    assert c.layout.expert_ranks == 8
    start = _series(running=32.0)
    end = _series(running=32.0, generation_tokens_total=3200.0, steps_total=100.0)
    w = _window(start, end, c)
    m = c.model
    assert m is not None
    assert w.mbu == pytest.approx(m.decode_weight_bytes(32, 8) * 10 / BW)
    assert round(w.mbu, 3) == 0.295
    alone = _window(start, end, replace(c, expert_parallel_size=1))
    assert alone.mbu is None and derive.MBU_OUT_OF_RANGE in alone.dropped
